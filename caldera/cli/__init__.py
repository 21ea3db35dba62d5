"""The `caldera` command line: the command table, and one module per command or group.

The top layer. May import: everything below (daemon, agents, skills, backends, plane,
protocol, host, base). It is the one place where exceptions become exit codes.

Only the chosen sub-command's module is imported: a person typing `caldera pause` must
not pay for the daemon's dependencies (its HTTP client, jsonschema; docs/performance.md). Each
sub-command module exposes `configure(parser)` (its arguments) and `main(args) -> int`
(its exit code). The start-up shortcuts are all in caldera/cli/fastpath.py.
"""
from __future__ import annotations

import os
import sys

# `caldera run` as a container's PID 1 splits into an orphan reaper and the runtime
# (caldera.host.reaper) here, while this package is being imported: the console script and
# `python -m caldera.cli` both import it before anything else of caldera's. Until then PID 1
# has no handler, and the kernel drops a SIGTERM sent to it; the earlier the split, the
# shorter that window (the interpreter's own start remains: docs/container.md).
if sys.argv[1:2] == ["run"] and os.getpid() == 1:
    from caldera.host import reaper

    reaper.split_if_init()

import importlib  # noqa: E402
import pwd  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from caldera import TYPE_CHECKING, __version__  # noqa: E402
from caldera.cli import fastpath  # noqa: E402
from caldera.config import config_root, selected_agent, state_in_persistent_dir, state_root  # noqa: E402
from caldera.errors import EXIT_FAILED, EXIT_USAGE, CalderaError, Retryable  # noqa: E402
from caldera.host import privdrop  # noqa: E402

if TYPE_CHECKING:
    import argparse
    from pathlib import Path
    from types import ModuleType
    from typing import TypeAlias

    # A command's arguments as _command hands them over: argparse's, or the fast path's
    # (fastpath.agent_args) for a command whose only flags are add_agent_flags' (`run`).
    Args: TypeAlias = argparse.Namespace | SimpleNamespace

# name -> (module, one-line help), in groups; `caldera --help` lists them in this order.
GROUPS: dict[str, dict[str, tuple[str, str]]] = {
    "agent verbs (on this host, with or without the control plane)": {
        "status": ("caldera.cli.status", "the agent's state, connection, outbox and last commands (--watch)"),
        "pause": ("caldera.cli.verbs", "pause the agent (its own manual pause)"),
        "resume": ("caldera.cli.verbs", "lift the agent's manual pause"),
        "run-now": ("caldera.cli.verbs", "ask the agent for a run"),
        "settings": ("caldera.cli.verbs", "get or set the agent's settings"),
        "log": ("caldera.cli.verbs", "list the agent's logs or print one's tail"),
    },
    "daemon and cron": {
        "run": ("caldera.cli.run", "run the agent's runtime daemon (systemd)"),
        "report": ("caldera.cli.report", "one-shot report for cron hosts (--once)"),
    },
    "install and check": {
        "init": ("caldera.cli.init", "install an agent from a blueprint"),
        "check": ("caldera.cli.check", "check an agent's manifest and adapter against the contract"),
        "skills": ("caldera.cli.skills", "the skill inventory with content_md5"),
        "sample": ("caldera.cli.sample", "one sample of the system figures"),
    },
    "code agents": {
        "turn": ("caldera.cli.turn", "run one code-agent turn on this host"),
        "backends": ("caldera.cli.turn", "list code-agent backends and their capabilities"),
    },
    "control plane": {
        "plane": ("caldera.cli.plane", "the embedded reference control plane"),
        "demo": ("caldera.cli.demo", "the main job: embedded plane + the two example agents, on loopback"),
    },
}
COMMANDS: dict[str, tuple[str, str]] = {name: entry for group in GROUPS.values() for name, entry in group.items()}


def add_agent_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every agent command takes (SPEC section 4); `caldera run` takes only
    these, and fastpath.agent_args parses them when they are spelled plainly."""
    parser.add_argument("--agent", metavar="NAME", help="the installed agent to act on")
    parser.add_argument("--manifest", metavar="PATH", help="run an agent from any directory")
    parser.add_argument("--state-dir", metavar="DIR", help="state directory (with --manifest)")
    add_json_flag(parser)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object for machines")


DESCRIPTION = "Host runtime that connects agents to their control plane."
EPILOG_TAIL = "exit codes: 0 done, 1 refused or failed, 2 usage or configuration error"


def _epilog() -> str:
    lines = "\n\n".join(f"{title}:\n" + "\n".join(f"  {name:<10} {text}" for name, (_, text) in group.items())
                        for title, group in GROUPS.items())
    return f"{lines}\n\n{EPILOG_TAIL}"


def _top_parser() -> argparse.ArgumentParser:
    import argparse  # here, not at the top: `caldera run` never builds a parser (fastpath)

    parser = argparse.ArgumentParser(prog="caldera", description=DESCRIPTION, epilog=_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"caldera {__version__}")
    parser.add_argument("command", nargs="?", choices=list(COMMANDS), metavar="COMMAND")
    return parser


def build_parser(name: str) -> tuple[argparse.ArgumentParser, ModuleType]:
    """(the parser of one sub-command, its module (imported now))."""
    import argparse  # as in _top_parser

    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"caldera {name}", description=COMMANDS[name][1],
                                     formatter_class=fastpath.formatter_class())
    parser.set_defaults(command=name)
    if _takes_name(module):
        module.configure(parser, name)
    else:
        module.configure(parser)
    return parser, module


def _takes_name(module: ModuleType) -> bool:
    # A module serving several sub-commands (pause, resume, …) takes the name too.
    # (co_argcount, not inspect.signature: a quick verb does without inspect; docs/performance.md.)
    return bool(module.configure.__code__.co_argcount == 2)


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None  # the console script and `python -m caldera.cli`; tests pass argv
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["__complete"]:  # hidden: bash completion's helper (packaging/caldera.bash-completion)
        from caldera.cli import complete  # here: only a completion pays for it

        return complete.main(argv[1:], COMMANDS, build_parser)
    if not argv or argv[0] not in COMMANDS:
        return _top(argv)
    if COMMANDS[argv[0]][0] in fastpath.QUICK_MODULES:
        return fastpath.run_quick(_command, argv, as_program)
    return _command(argv)


def _top(argv: list[str]) -> int:
    """No command, --help, --version or an unknown word: argparse's answer, as an exit code."""
    parser = _top_parser()
    try:
        parser.parse_args(argv)  # prints --help and --version (exit 0), refuses an unknown command (exit 2)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    parser.print_help()  # no argument at all
    return EXIT_USAGE


def _command(argv: list[str]) -> int:
    module = importlib.import_module(COMMANDS[argv[0]][0])
    args: Args | None = None
    if getattr(module, "AGENT_FLAGS_ONLY", False):
        args = fastpath.agent_args(argv[0], argv[1:])
    if args is None:
        parser, module = build_parser(argv[0])
        args = parser.parse_args(argv[1:])
    try:
        _as_service_user(argv[0], args)
        _refuse_a_newer_state(argv[0], args)
        return int(module.main(args) or 0)
    except CalderaError as exc:  # the taxonomy decides: configuration 2, the rest 1
        hint = " (try again later)" if isinstance(exc, Retryable) else ""
        print(f"caldera {argv[0]}: {exc}{hint}", file=sys.stderr)
        return exc.exit_code
    except PermissionError as exc:  # a configuration problem too: a restart cannot fix it
        print(f"caldera {argv[0]}: {_permission_sentence(exc, argv[0], args)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a file or directory problem: say which, without a traceback
        print(f"caldera {argv[0]}: {_os_error_sentence(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


# The commands that read or write an installed agent's state directory: as root they
# run as the agent's account (caldera.host.privdrop: `caldera`, or a home agent's owner),
# so root leaves no file there and they see what the daemon sees (its HOME, its rights).
# `init` stays root: it writes /etc.
# Not when the state lives in a ClawManager instance's persistent dir (above).
STATE_COMMANDS = ("status", "pause", "resume", "run-now", "settings", "log", "run", "report", "skills",
                  "check", "turn")


def _as_service_user(name: str, args: Args) -> None:
    if name not in STATE_COMMANDS or getattr(args, "manifest", None) or getattr(args, "state_dir", None):
        return
    if state_in_persistent_dir():
        # Inside a ClawManager instance the state lives in the platform's persistent dir, which
        # belongs to the image's user (often root): every command stays that user (docs/container.md).
        return
    agent = getattr(args, "agent", None) or selected_agent()
    entry = privdrop.service_user_for(state_root(), agent=agent)
    if entry is not None:
        privdrop.become(entry)


def _refuse_a_newer_state(name: str, args: Args) -> None:
    """Before a command opens an agent's state dir: a newer caldera's state (or a format.json
    caldera did not write) is refused, and nothing in it is made or changed
    (caldera.host.stateformat.check: read only, and cheap enough for the quick verbs)."""
    if name not in STATE_COMMANDS:
        return
    from caldera.config import agent_from_args
    from caldera.host import stateformat

    target = getattr(args, "target", None)  # `caldera check PATH` is `--manifest PATH`
    try:
        paths = agent_from_args(SimpleNamespace(agent=getattr(args, "agent", None),
                                                manifest=getattr(args, "manifest", None) or target,
                                                state_dir=getattr(args, "state_dir", None)))
    except (CalderaError, OSError):
        return  # no agent to act on: the command says so in its own words (a standalone turn has none)
    try:
        stateformat.check(paths.state_dir)
    except OSError:
        return  # a state dir this user cannot open: the command meets it too and says so its own way


def _permission_sentence(exc: PermissionError, command: str, args: Args | None = None) -> str:
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = f"uid {os.geteuid()}"
    what = exc.filename or "a file"
    if os.geteuid() != 0 and exc.filename and _in_system_roots(str(exc.filename)):
        return f"{what}: permission denied for user {user}: {_without_root(str(exc.filename), command)}"
    beside = _beside_manifest(args)
    if exc.filename and beside and _within(str(exc.filename), beside):
        return (f"{what}: permission denied for user {user}: without --state-dir a --manifest agent keeps its "
                f"state beside its manifest, in {beside}; give --state-dir DIR, a directory of yours")
    return f"{what}: permission denied for user {user} (check its owner and mode: docs/packaging.md)"


def _beside_manifest(args: Args | None) -> Path | None:
    """The default state dir's parent of a --manifest agent named without --state-dir."""
    from pathlib import Path  # here: only a refused command pays for it

    from caldera.config import STATE_BESIDE_MANIFEST

    manifest = getattr(args, "manifest", None)
    if not manifest or getattr(args, "state_dir", None):
        return None
    try:
        given = Path(manifest).absolute()
    except OSError:  # no current directory to resolve it against: the plain sentence will do
        return None
    return (given if given.is_dir() else given.parent) / STATE_BESIDE_MANIFEST


def _without_root(path: str, command: str) -> str:
    """The way out for a person who is not root and met /etc/caldera or /var/lib/caldera:
    the state dir's variable alone when the config dir's is set (an agent installed as
    oneself), else sudo or both variables."""
    if config_root() != config_root({}) and _within(path, state_root({})):
        again = "to a directory of yours too" if command == "init" else "as it was for this agent's caldera init"
        return f"CALDERA_CONFIG_DIR is set but CALDERA_STATE_DIR is not: set it {again} (README: Without root)"
    mine = ("set CALDERA_CONFIG_DIR and CALDERA_STATE_DIR to directories of yours to install as yourself"
            if command == "init" else "for an agent you installed as yourself, set CALDERA_CONFIG_DIR and "
                                      "CALDERA_STATE_DIR as they were for its caldera init")
    return f"use sudo, or {mine} (README: Without root)"


def _within(path: str, root: Path) -> bool:
    return path == str(root) or path.startswith(str(root) + "/")


def _in_system_roots(path: str) -> bool:
    """Whether `path` is in the default config or state root (the package's, root's)."""
    return _within(path, config_root({})) or _within(path, state_root({}))


def _os_error_sentence(exc: OSError) -> str:
    """A file or directory problem as one sentence; one without a file name (the current
    directory deleted under the shell: Path.cwd()) is said so."""
    if exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    try:
        os.getcwd()
    except OSError:
        return "the current directory no longer exists: cd to one that does, then run it again"
    return str(exc.strerror or exc)
