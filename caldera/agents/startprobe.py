"""Whether an agent's `runtime.command` can start at all, in either mode: its program (a
path, or a name on the PATH the agent's process gets, which is not the person's), and the
script an interpreter is given (`[python3, adapter.py]`) in the workdir.

Why one probe for three places: python exits 2 for a script it cannot open, and exit 2 is
what the adapter contract reads as "verb not known". So an adapter answering exit 2 is
told apart by this probe (the adapter cannot start, and its stderr says why), `caldera
check` reports it first, and `caldera run` warns once at its start (a process-mode agent
that cannot start would otherwise be restarted again and again with only its exit status
in the daemon's log). A few stat calls; no import a quick verb would pay for.
"""
from __future__ import annotations

import os
import re

from caldera import TYPE_CHECKING
from caldera.host.fsutil import which

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

# A program whose first word after it is the script it runs (`[python3, adapter.py]`).
INTERPRETER = r"(python[0-9.]*|node|nodejs|bash|sh|dash|ruby|perl|php)"
CANNOT_START = "the adapter cannot start"


def script_of(command: Sequence[str]) -> str | None:
    """The script an interpreter is told to run: the word after it, unless an option."""
    if len(command) < 2 or not re.fullmatch(INTERPRETER, os.path.basename(command[0])):
        return None
    return None if command[1].startswith("-") else command[1]


def probe(command: Sequence[str], workdir: Path, manifest_path: Path, path: str,
          who: str = "adapter") -> tuple[str | None, str]:
    """(the problem as a sentence or None, what was found: the program's path and the script).
    `command[0]` holding a "/" is a path (the manifest's build made it absolute); `who` is
    whose PATH it is (the adapter's, or a process-mode agent's)."""
    if not command:
        return f"runtime.command is empty: name the program in {manifest_path}", ""
    program, fix = command[0], f"fix runtime.command or runtime.workdir in {manifest_path}"
    if "/" in program:
        if not os.path.isfile(program):
            return f"runtime.command: {program} does not exist: {fix}", ""
        if not os.access(program, os.X_OK):
            return (f"runtime.command: {program} is not executable: chmod +x it, or name its interpreter first "
                    f"([python3, {os.path.basename(program)}])"), ""
        found = program
    else:
        located = which(program, path)
        if located is None:
            return (f"runtime.command: {program} is not on the {who}'s PATH ({path}): name it by its full path "
                    f"in {manifest_path}"), ""
        found = located
    script = script_of(command)
    if script is not None and not os.path.exists(os.path.join(workdir, script)):
        return (f"runtime.command: {script} is not in the workdir {workdir}, so {program} cannot open it: "
                f"{fix}"), ""
    return None, " ".join([found, *([script] if script else [])])


def start_problem(command: Sequence[str], workdir: Path, manifest_path: Path, path: str,
                  who: str = "adapter") -> str | None:
    """probe()'s problem alone: None when the command can start."""
    return probe(command, workdir, manifest_path, path, who)[0]
