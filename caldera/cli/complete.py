"""`caldera __complete CWORD WORD…`: the candidates bash completion offers (hidden command).

The completion script (packaging/caldera.bash-completion) hands over its
COMP_CWORD and COMP_WORDS; this prints one candidate a line, already filtered by
the word being completed. It never calls the control plane: commands and flags
come from the argparse parsers, agent names from the config directory listing,
setting keys from the (cached) manifest, log names from one `log --list` call
to the adapter, the only adapter call a completion can make. Nothing printed
lets bash fall back to file names (`complete -o default`). Errors print nothing:
a completion must never spill a traceback onto a person's prompt line.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
from typing import TYPE_CHECKING

from caldera import config

if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from types import ModuleType

    from caldera.agents.manifest import Manifest
    from caldera.config import Environ

    # caldera.cli's table, handed over by its `main` (this module is below it, not beside it)
    ParserFor = Callable[[str], tuple[argparse.ArgumentParser, ModuleType]]

AGENT_VALUED = ("--agent",)
FILE_VALUED = ("--manifest", "--state-dir", "--db", "--blueprint", "--url-file", "--payload")


def main(argv: list[str], commands: Collection[str], parser_for: ParserFor) -> int:
    """`commands`: the command names; `parser_for(name)`: a command's parser (caldera.cli's)."""
    try:
        cword = int(argv[0])
        words = argv[1:]
    except (IndexError, ValueError):
        return 0
    try:
        candidates = complete(words, cword, commands, parser_for)
    except Exception:  # noqa: BLE001 -- a broken agent or manifest: offer nothing, never a traceback
        candidates = []
    current = words[cword] if 0 <= cword < len(words) else ""
    out = [c for c in candidates if c.startswith(current)]
    if out:
        sys.stdout.write("\n".join(out) + "\n")
    return 0


def complete(words: list[str], cword: int, commands: Collection[str], parser_for: ParserFor,
             environ: Environ = os.environ) -> list[str]:
    """Candidates for words[cword] (words[0] is `caldera`), unfiltered."""
    before = words[1:cword]
    current = words[cword] if cword < len(words) else ""
    if current == "=" or (before and before[-1] == "="):
        return []  # bash split KEY=VALUE at '=': a value is being typed, no key or flag fits
    if not before:
        return ["--help", "--version"] if current.startswith("-") else list(commands)
    command = before[0]
    if command not in commands:
        return []
    previous = before[-1]
    if previous in AGENT_VALUED:
        return config.installed_agents(environ)
    if previous in FILE_VALUED:
        return []
    parser = _parser(parser_for(command)[0], before[1:])
    choices = _choices(parser, previous)
    if choices is not None:  # a flag's value from its parser's choices (`turn --backend`)
        return choices
    if current.startswith("-"):
        return _flags(parser)
    subcommands = _subcommands(parser)
    if subcommands is not None:
        return list(subcommands)
    positional = [w for w in before[1:] if not w.startswith("-") and not _is_flag_value(before, w)]
    if command == "log" and not positional:
        return _log_names(before, environ)
    if command == "settings" and positional[:1] == ["set"]:
        return [f"{key}=" for key in _setting_keys(before, environ)]
    return []


def _parser(parser: argparse.ArgumentParser, rest: list[str]) -> argparse.ArgumentParser:
    """The sub-command's parser, descended into the sub-verb (`settings set`, `plane serve`) given."""
    for word in rest:
        subs = _subcommands(parser)
        if subs is not None and word in subs:
            parser = subs[word]
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:  # argparse keeps sub-parsers here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return None


def _choices(parser: argparse.ArgumentParser, flag: str) -> list[str] | None:
    for action in parser._actions:
        if flag in action.option_strings and action.choices is not None:
            return [str(choice) for choice in action.choices]
    return None


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(opt for action in parser._actions if action.help != argparse.SUPPRESS
                  for opt in action.option_strings if opt.startswith("--"))


def _is_flag_value(before: list[str], word: str) -> bool:
    """`word` is the value of the flag just before it (`--agent NAME`)."""
    for i, w in enumerate(before[1:], start=1):
        if w == word and before[i - 1] in AGENT_VALUED + FILE_VALUED + ("--instance", "--timeout"):
            return True
    return False


def _agent_args(before: list[str]) -> argparse.Namespace:
    found: dict[str, str | None] = {"agent": None, "manifest": None, "state_dir": None}
    for flag, value in itertools.pairwise(before):
        if flag in ("--agent", "--manifest", "--state-dir"):
            found[flag[2:].replace("-", "_")] = value
    return argparse.Namespace(**found)


def _manifest(before: list[str], environ: Environ) -> Manifest:
    from caldera.agents.manifest import load_manifest  # here: a command-name completion never reads one
    from caldera.host import stateformat

    paths = config.agent_from_args(_agent_args(before), environ)
    stateformat.check(paths.state_dir)  # a newer caldera's state: no cache written there (main offers nothing)
    return load_manifest(paths.manifest_path, cache_dir=paths.state_dir / "cache")


def _setting_keys(before: list[str], environ: Environ) -> list[str]:
    """From the manifest's settings schema: no adapter call at all."""
    return [str(item["key"]) for item in _manifest(before, environ).settings_schema if item.get("key")]


def _log_names(before: list[str], environ: Environ) -> list[str]:
    """One `log --list` call to the adapter (its own timeout applies)."""
    from caldera.agents.adapter import verbs  # here: only a log-name completion calls the adapter

    manifest = _manifest(before, environ)
    if manifest.runtime_type == "process":
        # Process mode: the command is the agent itself, never called with verbs; ask its daemon.
        from caldera.agents.process import control  # here, as above

        paths = config.agent_from_args(_agent_args(before), environ)
        try:
            reply = control.call(paths.state_dir, "log --list", timeout=5.0)
        except (control.NoDaemon, OSError, ValueError):
            return []
        return [str(name) for name in ((reply.get("data") or {}).get("logs") or [])]
    answer = verbs.log_list(manifest)
    logs = (answer.data or {}).get("logs") if isinstance(answer.data, dict) else None
    return [str(name) for name in logs or []]
