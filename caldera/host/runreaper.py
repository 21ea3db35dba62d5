"""A run's own subreaper: what ends the processes a command left behind in external mode.

With `CALDERA_RUN_SANDBOX=external` no bubblewrap (and its pid namespace) is around a CLI, and a
command's `setsid`/`nohup` child leaves the CLI's process group: the TERM→KILL of the group at
the run's end does not reach it, and it outlived the run (issue 43 review, F3). So the CLI is
started as `python -I .../caldera/host/runreaper.py -- ARGV`: this process makes itself a child subreaper
(prctl PR_SET_CHILD_SUBREAPER), so every orphan of the CLI's tree is reparented to it and not to
PID 1, runs ARGV, and once ARGV has exited ends what is left of its tree (TERM, a grace, KILL),
then exits with ARGV's status. One per run: the runtime's other children (the adapter, other
runs) are never its children, so nothing of theirs is touched.

Where prctl fails (not Linux), it execs ARGV in its place: nothing changes then.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
GRACE = 2.0  # seconds between TERM and KILL for what the command left
ROUNDS = 100  # a tree that forks while it is killed: bounded


def command(argv: list[str]) -> list[str]:
    """`argv` run under a reaper of its own: this file as a script (stdlib only, `-I`), so that it
    starts wherever caldera runs from, an install or a tree on PYTHONPATH (the CLI's environment
    is built from nothing, PYTHONPATH too)."""
    return [sys.executable, "-I", os.path.abspath(__file__), "--", *argv]


def _subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def children() -> list[int]:
    """This process's children now (/proc: the 4th field of each stat)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(name))
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_tree() -> int:
    """TERM what is left (each child and its group), KILL after GRACE; the number ended."""
    ended, pause, deadline = set(), threading.Event(), time.monotonic() + GRACE
    for _ in range(ROUNDS):
        _reap()
        left = children()
        if not left:
            break
        sig = signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL
        for pid in left:
            ended.add(pid)
            for kill in (os.kill, os.killpg):
                try:
                    kill(pid, sig)
                except OSError:
                    pass
        pause.wait(0.05)
    return len(ended)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -I runreaper.py -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    if not _subreaper():
        os.execvp(argv[0], argv)
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # to ARGV; its end ends ours
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the runtime sees EOF when ARGV's are closed, not ours
        os.dup2(null, fd)
    status = os.waitpid(pid, 0)[1]
    end_tree()
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
