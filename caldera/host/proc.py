"""Run one subprocess the way every caller here must: argv (never a shell), its
own process group, a timeout, TERM -> grace -> KILL to the whole group, and
capped output.

One thread does it all with a selector over stdout and stderr, so a call costs
no extra threads; the cancel event is looked at every POLL seconds.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import IO, Any

POLL = 0.05
DRAIN_AFTER_EXIT = 0.5  # grandchildren holding the pipes open get this long
STDERR_CAP = 64 * 1024


class ProcResult:
    """How one run ended. returncode None: killed by us, or never started.
    (A plain class, not a dataclass: `caldera pause` imports this module, and dataclasses
    would add its imports to the verb's start-up, docs/performance.md section 1.)"""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.returncode: int | None = None
        self.stdout = b""
        self.stderr = b""
        self.timed_out = False
        self.overflowed = False  # stdout passed its cap (head mode): the process was killed
        self.cancelled = False
        self.spawn_error: str | None = None  # the process could not be started
        self.duration = 0.0
        self.signal: int | None = None  # the signal that ended it, if any

    def __repr__(self) -> str:
        return (f"ProcResult(argv={self.argv!r}, returncode={self.returncode}, timed_out={self.timed_out}, "
                f"overflowed={self.overflowed}, cancelled={self.cancelled}, spawn_error={self.spawn_error!r})")

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not (self.timed_out or self.overflowed or self.cancelled)

    def failure(self) -> str | None:
        """A short reason why this run is a failure, or None if it exited on its own."""
        if self.spawn_error:
            return f"could not start: {self.spawn_error}"
        if self.timed_out:
            return f"timed out after {self.duration:.1f} s"
        if self.overflowed:
            return "output over the size limit"
        if self.cancelled:
            return "cancelled"
        if self.signal:
            return f"killed by signal {self.signal}"
        return None


class _Buffer:
    """Bytes read from one pipe, capped: keep the head (and flag overflow) or the tail."""

    def __init__(self, cap: int, keep_tail: bool) -> None:
        self.cap, self.keep_tail = cap, keep_tail
        self.data = bytearray()
        self.overflowed = False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.cap:
            self.overflowed = True
            if self.keep_tail:
                del self.data[: len(self.data) - self.cap]
            else:
                del self.data[self.cap :]


def kill_group(proc: subprocess.Popen[bytes], grace: float, reap: float | None = None) -> int | None:
    """SIGTERM the process group, give its leader `grace` seconds, then SIGKILL the group
    (stragglers too). Waits for the leader `reap` seconds (None: until it is gone) and
    returns its exit code, None if it has not gone yet. The one TERM -> grace -> KILL here:
    `run` uses it, and so do callers with long-lived children (Codex, the demo's runtime)."""
    signal_group(proc, signal.SIGTERM)
    wait_exit(proc, grace)
    signal_group(proc, signal.SIGKILL)
    return wait_exit(proc, reap)


def wait_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> int | None:
    """`proc.wait(timeout)` woken by the exit itself: its return code, None if it has not
    exited within `timeout`. Popen's own wait with a timeout polls, sleeping up to 50 ms
    between looks; a pidfd is readable the moment the process exits (docs/performance.md,
    section 10). Without pidfds (Linux < 5.3), Popen's wait."""
    if timeout is None or proc.returncode is not None:
        return proc.wait()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd_open here, or the pid was reaped already
        return _popen_wait(proc, timeout)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            exited = bool(selector.select(timeout))
    finally:
        os.close(fd)
    # wait(), not poll(): poll gives None while another thread is reaping it
    return proc.wait() if exited else proc.poll()


def _popen_wait(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """`sig` to the process group `proc` leads (started with start_new_session=True)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    stdout_cap: int,
    cwd: str | None = None,
    stderr_cap: int = STDERR_CAP,
    keep_tail: bool = False,
    cancel: threading.Event | None = None,
    grace: float = 2.0,
) -> ProcResult:
    """Run argv to completion within `timeout` seconds; never raises for the child's failures."""
    result = ProcResult(list(argv))
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
    except OSError as exc:
        result.spawn_error = f"{argv[0]}: {exc.strerror or exc}"
        return result
    out, err = _Buffer(stdout_cap, keep_tail), _Buffer(stderr_cap, True)
    try:
        _pump(proc, out, err, result, started + timeout, cancel)
    finally:
        if proc.poll() is None or result.timed_out or result.overflowed or result.cancelled:
            kill_group(proc, grace)
        else:
            signal_group(proc, signal.SIGKILL)  # stragglers left in the group
        _pipe(proc.stdout).close()
        _pipe(proc.stderr).close()
    result.duration = time.monotonic() - started
    result.stdout, result.stderr = bytes(out.data), bytes(err.data)
    rc = proc.returncode
    if result.timed_out or result.overflowed or result.cancelled:
        result.returncode = None
    elif rc is not None and rc < 0:
        result.signal, result.returncode = -rc, None
    else:
        result.returncode = rc
    return result


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """A pipe `run` asked Popen for (stdout=PIPE, stderr=PIPE): never None."""
    assert stream is not None
    return stream


def _pump(proc: subprocess.Popen[bytes], out: _Buffer, err: _Buffer, result: ProcResult, deadline: float,
          cancel: threading.Event | None) -> None:
    """Read both pipes until EOF, the deadline, an overflow or a cancel."""
    sel = selectors.DefaultSelector()
    sel.register(_pipe(proc.stdout), selectors.EVENT_READ, out)
    sel.register(_pipe(proc.stderr), selectors.EVENT_READ, err)
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                result.timed_out = True
                return
            if cancel is not None and cancel.is_set():
                result.cancelled = True
                return
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > DRAIN_AFTER_EXIT:
                return
            for key, _ in sel.select(min(POLL, deadline - now)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.add(chunk)
                if key.data is out and out.overflowed and not out.keep_tail:
                    result.overflowed = True
                    return
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        result.timed_out = True
    finally:
        sel.close()


# ---------------------------------------------------------------- long-lived children (process mode)

def spawn(argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str | int | None = None,
          group: str | int | None = None) -> subprocess.Popen[bytes]:
    """Start a long-lived child: argv (no shell), its own session and process group, stdin
    from /dev/null, stdout and stderr on one pipe (the caller pumps it). user/group: run as
    that account (the runtime must be root for another one). Raises OSError."""
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs.update(user=user, group=group, extra_groups=[])
    return subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, **kwargs)


PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGKILL when the thread that started it ends
    (prctl PR_SET_PDEATHSIG: the runtime killed with -9 takes its long-lived CLI with it), or
    None where prctl is not there (not Linux). Built in the parent: the child only calls
    into libc, and exits at once if its parent is already gone (the signal would never come)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return child


def signal_pid(pid: int, sig: int) -> bool:
    """Send sig to one process; False when it is gone (or not ours to signal)."""
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_pgid(pgid: int, sig: int) -> bool:
    """Send sig to a whole process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_alive(pgid: int) -> bool:
    return signal_pgid(pgid, 0)


def proc_stat(pid: int, proc_root: str = "/proc") -> dict[str, str | int] | None:
    """{state, pgrp, start_time} of /proc/PID/stat (start_time in clock ticks since boot), or None."""
    try:
        with open(f"{proc_root}/{int(pid)}/stat", "rb") as fh:
            raw = fh.read(4096).decode("ascii", "replace")
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return {"state": fields[0], "pgrp": int(fields[2]), "start_time": int(fields[19])}
    except (IndexError, ValueError):
        return None


def same_process(pid: int, start_time: int, proc_root: str = "/proc") -> bool:
    """Is PID still the process that started at `start_time` (not a reused PID, not a zombie)?"""
    stat = proc_stat(pid, proc_root)
    return stat is not None and stat["start_time"] == start_time and stat["state"] not in ("Z", "X")


STOP_KILL_WAIT = 5.0  # after SIGKILL, how long stop_group waits for the group to be gone
REAP_WAIT = 10.0  # then the leader's reap: a process in uninterruptible sleep may never go


def stop_group(pgid: int, stop_signal: int, timeout: float, *, reap: Callable[[], int | None],
               tick: threading.Event) -> bool:
    """Process mode's graceful stop: `stop_signal` (the manifest's) to the group, SIGKILL to it after
    `timeout` s. Unlike `kill_group` it waits until the whole group is gone (grandchildren too),
    and works by id, for an agent that is not our child (a killed runtime's survivor): `reap()`
    is not None once the leader is gone. True when the group ended within the timeout."""
    signal_pgid(pgid, stop_signal)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if reap() is not None and not group_alive(pgid):
            return True
        tick.wait(0.05)
    signal_pgid(pgid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_KILL_WAIT
    while time.monotonic() < deadline and (reap() is None or group_alive(pgid)):
        tick.wait(0.05)
    return False
