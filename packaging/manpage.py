#!/usr/bin/python3
"""Write caldera(1) in roff to stdout, generated from the CLI's own argparse parsers.

Every sub-command in `caldera.cli.COMMANDS` gets a section with its usage and
options (nested sub-commands such as `caldera plane serve` included). A
sub-command whose module cannot be imported is listed with its one-line help
and a note on stderr, so the page still builds from a partial tree; `--strict`
makes that an error instead. FILES, ENVIRONMENT and EXIT STATUS come from
SPEC sections 2-4.

Usage: PYTHONPATH=. python3 packaging/manpage.py [--strict] > caldera.1
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

FILES = (
    ("/usr/bin/caldera", "the command"),
    ("/etc/caldera/agents/NAME/caldera.agent.yaml", "the agent's manifest (0644)"),
    ("/etc/caldera/agents/NAME/agent.env", "runtime settings, KEY=VALUE lines (0640)"),
    ("/etc/caldera/agents/NAME/secrets.env",
     "CALDERA_TOKEN and other secrets (0600; refused if group or world readable)"),
    ("/etc/caldera/agents/NAME/secrets/",
     "the code-agent backends' secret projections, one directory per backend_profile: codex/ (config.toml, "
     "env/OPENAI_API_KEY), claude-code/ (env/ANTHROPIC_BASE_URL, env/ANTHROPIC_API_KEY), opencode/ "
     "(opencode.json, env/NAME); the agent's account's alone (directories 0700, files 0600)"),
    ("/var/lib/caldera/NAME/",
     "the agent's state: session.json, state.json, outbox/, logs/ (a code-agent run's transcript: "
     "logs/run-RUN_ID.log), cache/, skills/, runs/ (0700)"),
    ("/usr/lib/systemd/system/caldera@.service", "the template unit: caldera run --agent NAME"),
    ("/etc/cron.d/caldera", "commented example of one-shot reports for hosts without a daemon"),
    ("/usr/share/caldera/schemas/", "the JSON schemas of the protocol, the commands and the adapter contract"),
    ("/usr/share/caldera/examples/",
     "example agents (task-agent: an adapter-mode agent; inbox-watcher: a process-mode agent) and, in "
     "code-agents/, a secret projection for each backend (no key inside) and an agent_run payload for each"),
    ("/usr/share/bash-completion/completions/caldera",
     "bash completion: commands, flags, agent names, log names, setting keys (never the control plane)"),
)

ENVIRONMENT = (
    ("CALDERA_AGENT", "the agent to act on when --agent is not given"),
    ("CALDERA_CONFIG_DIR", "replaces /etc/caldera (tests, non-root use)"),
    ("CALDERA_STATE_DIR", "replaces /var/lib/caldera"),
    ("CALDERA_AGENT_ENABLED", "true: connect to the control plane; otherwise stay local"),
    ("CALDERA_BASE_URL", "the control plane's API root; https:// unless the host is loopback"),
    ("CALDERA_TOKEN", "the bootstrap token used to register (put it in secrets.env)"),
    ("CALDERA_INSTANCE_ID", "the integer instance id"),
    ("CALDERA_PROTOCOL_VERSION", "must be v1"),
    ("CALDERA_PERSISTENT_DIR",
     "the state then lives in DIR/caldera-agent/ (a ClawManager instance); disk figures come from here"),
    ("CALDERA_DISK_LIMIT_BYTES", "reported in summaries"),
    ("CALDERA_RUNTIME_TYPE", "host_info.runtime_type (default caldera)"),
    ("CALDERA_CA_BUNDLE", "the CA file (or directory) the control plane's certificate is verified against, "
                          "instead of the system store; TLS verification is never turned off"),
    ("CALDERA_LOG_LEVEL", "debug, info (default), warning or error"),
    ("CALDERA_WORKSPACE_ROOTS",
     "colon-separated directories an agent_run's workspace must lie in; unset: in a ClawManager instance "
     "CLAWMANAGER_PROJECT_PATH, else every agent_run is refused"),
    ("CALDERA_RUN_MAX_TIMEOUT_SECONDS", "the largest timeout_seconds a run may ask for (3600)"),
    ("CALDERA_RUN_MAX_SANDBOX", "the widest sandbox a run may ask for: workspace-write (default) or read-only"),
    ("CALDERA_RUN_ALLOW_NETWORK", "true: a run may ask for network (default false)"),
    ("CALDERA_RUN_ALLOW_APPROVAL", "true: a run may ask for approval on-request (default false)"),
    ("CALDERA_RUN_SANDBOX",
     "external: the container is the sandbox (a workspace-write run's commands run without the backends' own "
     "or caldera's bubblewrap; refused on a host that is not a container); unset: each backend's sandbox"),
    ("CALDERA_PROVIDER_STALL_SECONDS",
     "a provider answer silent this long ends the turn provider-unavailable (60; 0: each CLI's own)"),
    ("CALDERA_CODEX_BIN", "the Codex CLI's native binary (backend codex); else codex on PATH"),
    ("CALDERA_CLAUDE_CODE_BIN", "the Claude Code CLI's native binary (backend claude-code); else claude on PATH"),
    ("CALDERA_OPENCODE_BIN", "the OpenCode CLI's native binary (backend opencode); else opencode on PATH"),
    ("JOURNAL_STREAM", "set by systemd; when it names stderr, log lines carry <N> priorities for journalctl -p"),
)


def esc(text: str) -> str:
    """Text safe inside a roff line: backslashes, hyphens and leading dots/quotes."""
    text = " ".join(str(text).split())
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text[:1] in (".", "'"):
        text = "\\&" + text
    # Non-ASCII (e.g. an ellipsis in a help string) as groff's \[uXXXX] escapes.
    return "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return "\\fI" + esc(action.metavar or action.dest) + "\\fR"
    names = ", ".join("\\fB" + esc(o) + "\\fR" for o in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return f"{names} \\fI{esc(metavar)}\\fR"


def _help_text(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        params = {k: v for k, v in vars(action).items() if v is not None}
        params.setdefault("default", action.default)
        try:
            text = text % params
        except (KeyError, TypeError, ValueError):
            pass  # left as written: a help string we cannot expand is still readable
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text = f"{text} (one of: {', '.join(map(str, action.choices))})".strip()
    return text


def parser_section(parser: argparse.ArgumentParser, title: str, out: list[str]) -> None:
    """One .SS for `title` with its usage and options; nested sub-commands recurse."""
    out.append(f".SS {esc(title)}")
    if parser.description:
        out += [esc(parser.description), ".PP"]
    usage = parser.format_usage().strip()
    if usage.startswith("usage: "):
        usage = usage[len("usage: "):]
    out += [".nf", esc(usage), ".fi"]
    nested = []
    for action in parser._actions:  # argparse keeps no public list of its actions
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            nested.extend(action.choices.items())
            continue
        if action.help == argparse.SUPPRESS:
            continue
        out += [".TP", _invocation(action)]
        out.append(esc(_help_text(action)) or "\\&")
    for name, sub in nested:
        parser_section(sub, f"{title} {name}", out)


def command_sections(strict: bool, out: list[str]) -> list[str]:
    """The COMMANDS section; returns the names that could not be imported."""
    from caldera import cli
    missing = []
    out.append(".SH COMMANDS")
    for name, (_module, text) in cli.COMMANDS.items():
        try:
            parser, _ = cli.build_parser(name)
        except ImportError as exc:
            if strict:
                raise
            missing.append(name)
            print(f"manpage: caldera {name}: {exc}; listed with its one-line help only", file=sys.stderr)
            out += [f".SS {esc('caldera ' + name)}", esc(text)]
            continue
        parser.description = parser.description or text
        parser_section(parser, f"caldera {name}", out)
    return missing


def render(strict: bool = False) -> str:
    from caldera import __version__
    # SOURCE_DATE_EPOCH keeps the page reproducible (dpkg-buildpackage sets it).
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or None
    when = datetime.datetime.fromtimestamp(epoch, datetime.UTC) if epoch else \
        datetime.datetime.now(datetime.UTC)
    out = [
        '.\\" Generated by packaging/manpage.py from the CLI\'s argparse help; do not edit.',
        f'.TH CALDERA 1 "{when:%Y-%m-%d}" "caldera {esc(__version__)}" "User Commands"',
        ".SH NAME",
        "caldera \\- host runtime connecting agents on Linux hosts to their control plane",
        ".SH SYNOPSIS",
        "\\fBcaldera\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
        ".br",
        "\\fBcaldera\\fR \\fB\\-\\-version\\fR",
        ".SH DESCRIPTION",
        "One runtime process per agent. \\fBcaldera run\\fR is the daemon (systemd's",
        "\\fBcaldera@NAME.service\\fR); \\fBcaldera report \\-\\-once\\fR is its one-shot form for",
        "cron. The other commands act on an installed agent locally. Agent commands take",
        "\\fB\\-\\-agent\\fR \\fINAME\\fR (or \\fB\\-\\-manifest\\fR \\fIPATH\\fR with "
        "\\fB\\-\\-state\\-dir\\fR \\fIDIR\\fR) and",
        "\\fB\\-\\-json\\fR, which prints exactly one JSON object on stdout.",
        ".PP",
        "The daemon also runs code-agent turns (the agent_run command) through the real CLIs of",
        "Codex, Claude Code and OpenCode (backend_profile codex, claude\\-code, opencode), each",
        "with its secret projection under \\fIsecrets/\\fR and only in the workspace roots",
        "\\fBCALDERA_WORKSPACE_ROOTS\\fR names; README.md's section \\(lqCode agents\\(rq",
        "(/usr/share/doc/caldera/README.md.gz) gives the steps, /usr/share/doc/caldera/backends.md.gz",
        "the details.",
    ]
    command_sections(strict, out)
    out += [".SH EXIT STATUS", ".TP", "\\fB0\\fR", "done",
            ".TP", "\\fB1\\fR", "refused or failed (the reason on stderr)",
            ".TP", "\\fB2\\fR", "usage or configuration error"]
    out.append(".SH ENVIRONMENT")
    out.append("Read from the process environment, then agent.env, then secrets.env (later wins).")
    for name, text in ENVIRONMENT:
        out += [".TP", f"\\fB{esc(name)}\\fR", esc(text)]
    out.append(".SH FILES")
    for path, text in FILES:
        out += [".TP", f"\\fI{esc(path)}\\fR", esc(text)]
    out += [".SH SEE ALSO", "\\fBsystemctl\\fR(1), \\fBsystemd.exec\\fR(5), \\fBcrontab\\fR(5),",
            "/usr/share/doc/caldera/packaging.md.gz"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write caldera(1) to stdout")
    parser.add_argument("--strict", action="store_true", help="fail when a sub-command cannot be imported")
    args = parser.parse_args(argv)
    sys.stdout.write(render(strict=args.strict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
