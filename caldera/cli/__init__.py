"""The `caldera` command line: the command table, and one module per command or group.

The top layer. May import: everything below (daemon, agents, skills, backends, plane,
protocol, host, base). It is the one place where exceptions become exit codes.

Only the chosen sub-command's module is imported: `requests` and `jsonschema`
each cost about 0.3 s of CPU to import, and a person typing `caldera pause`
must not pay for the daemon's dependencies. Each sub-command module exposes
`configure(parser)` (its arguments) and `main(args) -> int` (its exit code).
"""
from __future__ import annotations

import gc
import importlib
import os
import pwd
import sys
import types

from caldera import __version__
from caldera.config import state_in_persistent_dir, state_root
from caldera.errors import EXIT_FAILED, EXIT_USAGE, CalderaError, Retryable
from caldera.host import privdrop

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
        "demo": ("caldera.cli.demo", "the main job: embedded plane + example agent on loopback"),
    },
}
# The modules of the verbs a person types and waits for (bench/bench_pause.py).
QUICK_MODULES = frozenset({"caldera.cli.verbs", "caldera.cli.status"})
COMMANDS: dict[str, tuple[str, str]] = {name: entry for group in GROUPS.values() for name, entry in group.items()}


def add_agent_flags(parser) -> None:
    """The flags every agent command takes (SPEC section 4)."""
    parser.add_argument("--agent", metavar="NAME", help="the installed agent to act on")
    parser.add_argument("--manifest", metavar="PATH", help="run an agent from any directory")
    parser.add_argument("--state-dir", metavar="DIR", help="state directory (with --manifest)")
    add_json_flag(parser)


# The agent flags by spelling, for plain_agent_args (the argparse dests add_agent_flags makes).
AGENT_FLAGS = {"--agent": "agent", "--manifest": "manifest", "--state-dir": "state_dir"}


def plain_agent_args(name: str, argv: list[str]):
    """The arguments of a command whose only flags are add_agent_flags', parsed without
    argparse when they are spelled plainly: `--agent NAME` or `--agent=NAME` (the same for
    --manifest and --state-dir; the last one given wins, as with argparse) and `--json`.
    None for anything else (help, an abbreviation, a value that starts with "-", another
    word): argparse parses those, errors and all. A test holds the two equal.

    Why: `caldera run` is a long-lived daemon, and argparse with gettext stayed in it for
    its whole life: ≈ 0.33 MB of code objects (tracemalloc), 0.4 MiB of RSS
    (docs/performance.md, section 2)."""
    values = {"agent": None, "manifest": None, "state_dir": None, "json": False}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--json":
            values["json"] = True
            i += 1
            continue
        flag, eq, value = word.partition("=")
        dest = AGENT_FLAGS.get(flag)
        if dest is None:
            return None
        if not eq:
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                return None
            value = argv[i + 1]
            i += 1
        values[dest] = value
        i += 1
    return types.SimpleNamespace(command=name, **values)


def add_json_flag(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object for machines")


DESCRIPTION = "Host runtime that connects agents to their control plane."
EPILOG_TAIL = "exit codes: 0 done, 1 refused or failed, 2 usage or configuration error"


def _epilog() -> str:
    lines = "\n\n".join(f"{title}:\n" + "\n".join(f"  {name:<10} {text}" for name, (_, text) in group.items())
                        for title, group in GROUPS.items())
    return f"{lines}\n\n{EPILOG_TAIL}"


def top_help() -> str:
    """`caldera --help`, written out here: the same text argparse prints for _top_parser,
    without importing argparse (with gettext and its formatter, about 15 % of a bare
    interpreter start; bench/bench_pause.py holds `caldera --help` to 1.15 x `python -c pass`)."""
    return (f"usage: caldera [-h] [--version] [COMMAND]\n\n{DESCRIPTION}\n\n"
            "positional arguments:\n  COMMAND\n\n"
            "options:\n  -h, --help  show this help message and exit\n"
            "  --version   show program's version number and exit\n\n"
            f"{_epilog()}\n")


def _top_parser():
    import argparse  # deferred: `caldera --help` does without it (top_help)

    parser = argparse.ArgumentParser(prog="caldera", description=DESCRIPTION, epilog=_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"caldera {__version__}")
    parser.add_argument("command", nargs="?", choices=list(COMMANDS), metavar="COMMAND")
    return parser


def _formatter_class():
    """argparse's HelpFormatter with the same width rule but without `import shutil`
    (which pulls in bz2, lzma and zlib): argparse builds a formatter at every
    add_argument to check the metavar, so each quick verb paid ~2 ms for it."""
    import argparse  # deferred: as in build_parser

    class Formatter(argparse.HelpFormatter):
        def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
            super().__init__(prog, indent_increment, max_help_position, width or _columns() - 2)

    return Formatter


def _columns() -> int:
    # shutil.get_terminal_size's rule: $COLUMNS, else the terminal on stdout, else 80.
    try:
        return int(os.environ.get("COLUMNS", "")) or 80
    except ValueError:
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def build_parser(name: str):
    """(the parser of one sub-command, its module (imported now))."""
    import argparse  # deferred: `caldera --help` does without it (top_help)

    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"caldera {name}", description=COMMANDS[name][1],
                                     formatter_class=_formatter_class())
    parser.set_defaults(command=name)
    if _takes_name(module):
        module.configure(parser, name)
    else:
        module.configure(parser)
    return parser, module


def _takes_name(module) -> bool:
    # A module serving several sub-commands (pause, resume, …) takes the name too.
    # (co_argcount, not inspect.signature: inspect costs a quick verb ~8 ms to import.)
    return module.configure.__code__.co_argcount == 2


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None  # the console script and `python -m caldera.cli`; tests pass argv
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv in ([], ["--help"], ["-h"]):
        sys.stdout.write(top_help())
        code = EXIT_USAGE if not argv else 0
        if as_program:
            _exit_now(code)
        return code
    if argv[0] == "__complete":  # hidden: bash completion's helper (packaging/caldera.bash-completion)
        from caldera.cli import complete  # deferred: only a completion pays for it

        return complete.main(argv[1:])
    if argv[0] not in COMMANDS:
        top = _top_parser()
        top.parse_args(argv)  # handles --help, --version and unknown commands (exit 2)
        top.print_help()
        return EXIT_USAGE
    collecting = gc.isenabled()
    quick = COMMANDS[argv[0]][0] in QUICK_MODULES
    if quick:
        # A quick verb lives for milliseconds and builds no cycles worth collecting; the
        # collector's passes over the imported modules' objects were ~1 ms of its cost.
        gc.disable()
    try:
        code = _command(argv)
    finally:
        if collecting:
            gc.enable()  # main() is also called in-process (tests, demo)
    if quick and as_program:
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """End a quick verb without the interpreter's finalisation (tearing down ~100 modules
    cost ~6 ms of CPU, more than the verb's own work; docs/performance.md). Safe here: a
    quick verb leaves no thread, no child, no logging handler and no file open, so flushing
    the two standard streams is all that finalisation would have done for it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`caldera log | head`): nothing left to say
            code = code or 1
    os._exit(code)


def _command(argv: list[str]) -> int:
    module = importlib.import_module(COMMANDS[argv[0]][0])
    args = plain_agent_args(argv[0], argv[1:]) if getattr(module, "AGENT_FLAGS_ONLY", False) else None
    if args is None:
        parser, module = build_parser(argv[0])
        args = parser.parse_args(argv[1:])
    try:
        _as_service_user(argv[0], args)
        return int(module.main(args) or 0)
    except CalderaError as exc:  # the taxonomy decides: configuration 2, the rest 1
        hint = " (try again later)" if isinstance(exc, Retryable) else ""
        print(f"caldera {argv[0]}: {exc}{hint}", file=sys.stderr)
        return exc.exit_code
    except PermissionError as exc:  # a configuration problem too: a restart cannot fix it
        print(f"caldera {argv[0]}: {_permission_sentence(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a file or directory problem: say which, without a traceback
        where = f" {exc.filename}" if exc.filename else ""
        print(f"caldera {argv[0]}:{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


# The commands that read or write an installed agent's state directory: as root they
# run as the service user (caldera.host.privdrop), so root leaves no file there and they
# see what the daemon sees (its HOME, its rights). `init` stays root: it writes /etc.
# Not when the state lives in a ClawManager instance's persistent dir (above).
STATE_COMMANDS = ("status", "pause", "resume", "run-now", "settings", "log", "run", "report", "skills",
                  "check", "turn")


def _as_service_user(name: str, args: object) -> None:
    if name not in STATE_COMMANDS or getattr(args, "manifest", None) or getattr(args, "state_dir", None):
        return
    if state_in_persistent_dir():
        # Inside a ClawManager instance the state lives in the platform's persistent dir, which
        # belongs to the image's user (often root): every command stays that user (docs/container.md).
        return
    entry = privdrop.service_user_for(state_root())
    if entry is not None:
        privdrop.become(entry)


def _permission_sentence(exc: PermissionError) -> str:
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = f"uid {os.geteuid()}"
    what = exc.filename or "a file"
    return f"{what}: permission denied for user {user} (check its owner and mode: docs/packaging.md)"
