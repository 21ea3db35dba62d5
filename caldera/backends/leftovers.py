"""What a run leaves behind when the runtime dies in the middle of it (kill -9, the OOM
killer, a power cut), and its sweep.

A run's private dirs carry an owner file (`claim`: the runtime's pid and start time): the
state dir's `runs/<run_id>/` (Codex's CODEX_HOME there holds a copy of the projection's
`auth.json`, a credential) and Claude Code's private HOME and TMPDIR under
`<tmp>/caldera-cc-<uid>/` (its settings, the sockets of its sandbox), and the dir of the agent's
OpenCode server, `runs/.opencode-<hex>/` (its owner: the daemon or a `caldera turn`). `sweep`, called once at
the daemon's start and by each `caldera turn`, kills what still runs from a dead owner's run
(a process holding the dir's path in its environment: every process of a run inherits its
HOME) and removes the dir. Light on purpose: the daemon imports it at start; `shutil` only
when something is stale.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from caldera.host import proc

log = logging.getLogger("caldera.backends")

OWNER = ".owner"
YOUNG = 60.0  # a dir without an owner file younger than this may be being made right now
PRIVATE_PREFIX = "caldera-cc-"
SERVER_PREFIX = ".opencode-"  # an OpenCode server's dir in runs/ (opencode/server.py), claimed as a run's
KILL_WAIT = 2.0  # after SIGKILL, how long the processes of a dead run are waited for


def tmp_root() -> Path:
    """The temporary directory, as tempfile.gettempdir() finds it (without importing it)."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and os.path.isdir(value):
            return Path(value)
    return Path("/tmp")


def private_root() -> Path:
    """The parent of every private dir of this uid's Claude Code runs (0700, ours)."""
    return tmp_root() / f"{PRIVATE_PREFIX}{os.getuid()}"


def claim(directory: Path) -> None:
    """Mark `directory` as this runtime's (0600 owner file: pid and start time)."""
    stat = proc.proc_stat(os.getpid())
    started = stat["start_time"] if stat is not None else 0
    fd = os.open(directory / OWNER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{os.getpid()} {started}\n")


def _stale(directory: Path) -> bool:
    try:
        with open(directory / OWNER, "rb") as fh:
            pid, started = (int(x) for x in fh.read(64).split()[:2])
    except (OSError, ValueError):
        try:  # no owner (yet): stale once it is older than a run's start could take
            return time.time() - os.lstat(directory).st_mtime > YOUNG
        except OSError:
            return False
    return not proc.same_process(pid, started)


def _candidates(runs_dir: Path | None) -> list[Path]:
    found = []
    for parent in (runs_dir, private_root()):
        if parent is None:
            continue
        try:
            entries = os.scandir(parent)
        except OSError:
            continue  # not there: nothing was ever left
        with entries:
            for entry in entries:
                # Dot names are not runs, but for an OpenCode server's dir (the agent's server
                # outlives a run: a daemon killed -9 leaves it running, owned by no one).
                hidden = entry.name.startswith(".") and not entry.name.startswith(SERVER_PREFIX)
                if hidden or not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_uid == os.getuid():
                    found.append(Path(entry.path))
    return found


def holders(markers: list[str]) -> list[int]:
    """The pids of this uid's processes whose environment or command line holds a marker."""
    wanted = [m.encode() for m in markers]
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as env, open(f"/proc/{name}/cmdline", "rb") as cmd:
                text = env.read() + b"\0" + cmd.read()
        except OSError:
            continue  # gone, or not ours to read
        if any(m in text for m in wanted):
            found.append(int(name))
    return found


def kill_holders(markers: list[str], wait: float = KILL_WAIT, tick: threading.Event | None = None) -> int:
    """SIGKILL every process holding a marker (the processes of a run that is over), and wait
    up to `wait` s (on `tick`: a stop ends the wait) until none is left; the number killed."""
    tick = tick or threading.Event()
    killed: set[int] = set()
    deadline = time.monotonic() + wait
    while True:
        pids = [p for p in holders(markers) if _alive(p)]
        for pid in pids:
            if proc.signal_pid(pid, signal.SIGKILL):
                killed.add(pid)
        if not pids or time.monotonic() >= deadline or tick.wait(0.02):
            return len(killed)


def _alive(pid: int) -> bool:
    stat = proc.proc_stat(pid)
    return stat is not None and stat["state"] not in ("Z", "X")


def sweep(runs_dir: str | os.PathLike[str] | None) -> list[str]:
    """Kill the processes of runs whose runtime is gone and remove their dirs (the state dir's
    runs/, and this uid's private dirs of Claude Code runs); the dirs removed."""
    stale = [d for d in _candidates(Path(runs_dir) if runs_dir is not None else None) if _stale(d)]
    if not stale:
        return []
    import shutil  # here: a start with nothing to sweep never needs it

    killed = kill_holders([str(d) for d in stale])
    removed = []
    for directory in stale:
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.lexists(directory):
            removed.append(str(directory))
    log.warning("removed %d run dir(s) left by a runtime that is gone%s: %s", len(removed),
                f" (and killed {killed} of its processes)" if killed else "", ", ".join(removed))
    return removed
