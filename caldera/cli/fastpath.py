"""The command line's start-up shortcuts, in one place.

Why they exist: a person typing `caldera pause` or `caldera status` waits for the
interpreter's start-up more than for the verb's own work, and `caldera run` keeps for its
whole life whatever it imported to start. Plain Python costs them measurably
(docs/performance.md, sections 1 and 2, has the figures and how they were measured):
argparse with gettext stays in the daemon's memory, argparse's formatter imports shutil
(bz2, lzma) at every add_argument, the cyclic collector walks the imported modules'
objects, the interpreter's finalisation tears every module down again, and `typing` is
needed by nothing a quick verb runs. So, and nothing else:

- `agent_args`: `caldera run`'s flags, parsed without argparse when spelled plainly;
- `formatter_class`: argparse's HelpFormatter with the same width rule, without shutil;
- `run_quick`: a quick verb runs with the collector off and, as a program, ends with
  `os._exit` (it leaves no thread, child, log handler or open file to finalise);
- `caldera.TYPE_CHECKING` (caldera/__init__.py): typing's constant without typing; every
  module imports it from there and puts its type-only imports under `if TYPE_CHECKING:`.

tests/cli/test_cli_quick_paths.py holds each shortcut equal to the plain code it stands
for; tests/cli/test_cli_import_budgets.py names what each entry point must not import.
"""
from __future__ import annotations

import gc
import os
import sys
from types import SimpleNamespace

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import NoReturn

# The modules of the verbs a person types and waits for (bench/bench_pause.py).
QUICK_MODULES = frozenset({"caldera.cli.verbs", "caldera.cli.status"})
# The flags of caldera.cli.add_agent_flags by spelling, and the argparse dest of each.
AGENT_FLAGS = {"--agent": "agent", "--manifest": "manifest", "--state-dir": "state_dir"}


def agent_args(name: str, argv: list[str]) -> SimpleNamespace | None:
    """The arguments of a command whose only flags are add_agent_flags', when they are
    spelled plainly: `--agent NAME` or `--agent=NAME` (the same for --manifest and
    --state-dir; the last one given wins, as with argparse) and `--json`. None for
    anything else (help, an abbreviation, a value that starts with "-", another word):
    argparse parses those, errors and all."""
    values: dict[str, str | bool | None] = {"agent": None, "manifest": None, "state_dir": None, "json": False}
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
    return SimpleNamespace(command=name, **values)


def formatter_class() -> type[argparse.HelpFormatter]:
    """argparse's HelpFormatter, its width from `_columns` instead of shutil's."""
    import argparse  # here, not at the top: `caldera run` never builds a parser

    class Formatter(argparse.HelpFormatter):
        def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                     width: int | None = None) -> None:
            super().__init__(prog, indent_increment, max_help_position, width or _columns() - 2)

    return Formatter


def _columns() -> int:
    # shutil.get_terminal_size's rule: $COLUMNS, else the terminal on stdout, else 80.
    try:
        return int(os.environ.get("COLUMNS", "")) or 80
    except ValueError:
        pass
    if sys.__stdout__ is None:
        return 80
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (ValueError, OSError):
        return 80


def run_quick(command: Callable[[list[str]], int], argv: list[str], as_program: bool) -> int:
    """command(argv) with the cyclic collector off (a quick verb builds no cycles worth
    collecting); as a program, the process then ends without finalisation."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        code = command(argv)
    finally:
        if collecting:
            gc.enable()  # main() is also called in-process (tests, demo)
    if as_program:
        exit_now(code)
    return code


def exit_now(code: int) -> NoReturn:
    """Flush the two standard streams (all that finalisation would do for a quick verb)
    and end the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`caldera log | head`): nothing left to say
            code = code or 1
    os._exit(code)
