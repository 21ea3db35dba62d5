"""The daemon's signals: SIGTERM/SIGINT (counted: drain, cancel, exit) and SIGHUP (reload).

The handlers only count; the main thread waits on a pipe and does the work.
The pipe is the interpreter's wakeup fd (`signal.set_wakeup_fd`): CPython's C
handler writes the signal's number into it at once, in whichever thread the
kernel delivered the signal to. Both halves matter:
- A Python handler runs in the main thread between two bytecodes, possibly while
  that thread holds the lock inside `threading.Event.wait()`; a handler calling
  `Event.set()` then waits for that lock forever (the daemon hung on SIGTERM in
  about one build in three, issue 18). Counting takes no lock.
- The kernel may deliver a process-directed signal to any thread that does not
  block it. Then the main thread's `select` is not interrupted, and a Python
  handler (which would have poked the pipe itself) only runs when the main thread
  next runs bytecode: up to the wait's timeout, an hour without a watchdog. A
  daemon sat through a SIGHUP and, in an earlier build, through a SIGTERM so.
  The C handler's write wakes the `select` wherever the signal landed.

A reload that changed the configuration restarts the daemon in place (`os.execv`),
and a signal must not fall into that gap: a SIGTERM counted by the old process
and then exec'd away leaves a new daemon that nobody asked to stop running on
(systemd then waits TimeoutStopSec and kills it). So the old process `hold()`s
the three signals before its last look at the count: from then on the kernel
keeps them pending, across execve (the mask and pending signals survive it), and
the new process's `install()` sets its handlers first and unblocks them second,
so a held SIGTERM arrives at a handler that drains and stops. One that another
thread took meanwhile (only the main thread blocks them) left its byte in the
pipe: the pipe's read end is handed over across execv (`hand_over`) and the new
process counts what it holds.
"""
from __future__ import annotations

import os
import select
import signal
import stat
from types import FrameType

from caldera.config import SIGNAL_HANDOVER_VAR, take_signal_handover

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Signals:
    """Each signal is counted twice, by its Python handler and by its byte in the pipe, and
    each count may lag the other for a moment (the handler runs at the main thread's next
    bytecode; the byte is read at the next wait), so the answer is the larger of the two."""

    def __init__(self) -> None:
        self._handled = {"stop": 0, "hup": 0}  # by the handlers
        self._piped = {"stop": 0, "hup": 0}  # by the wakeup bytes
        self._hups_seen = 0
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    @property
    def count(self) -> int:
        """SIGTERM + SIGINT received."""
        return max(self._handled["stop"], self._piped["stop"])

    def install(self) -> None:
        """The wakeup fd and the handlers first, then unblock: a signal held across a
        restart in place is delivered now. From the main thread (as signal.signal wants)."""
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)  # full: a wake-up is pending already
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._hup)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
        handover = take_signal_handover()
        if handover is not None:
            self._adopt(*handover)

    def hand_over(self) -> None:
        """Just before a restart in place, after the last look at the count: keep the pipe's
        read end open across execv and name it in the environment. A signal that another
        thread took after that look left its byte there; the restarted process counts it."""
        os.set_inheritable(self._read, True)
        os.environ[SIGNAL_HANDOVER_VAR] = f"{self._read}:{os.fstat(self._read).st_ino}"

    def _adopt(self, fd: int, inode: int) -> None:
        """Count what the old process's pipe still holds, then close it. A descriptor that is
        not that pipe (a stale variable) is left alone."""
        try:
            st = os.fstat(fd)
        except OSError:
            return
        if not stat.S_ISFIFO(st.st_mode) or st.st_ino != inode:
            return
        try:
            os.set_blocking(fd, False)
            self._drain(fd)
        finally:
            os.close(fd)

    def hold(self) -> bool:
        """Before a restart in place: block the three signals in this (the main) thread, so
        that the kernel keeps any that come from now on for the restarted process; True when
        none asked to stop so far. Call it from the main thread, the one that calls execv."""
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        self._drain()
        return self.count == 0

    def wait(self, timeout: float) -> None:
        """Until a signal arrives (or arrived since the last wait) or `timeout` passes."""
        ready, _, _ = select.select([self._read], [], [], max(0.0, timeout))
        if ready:
            self._drain()

    def take_hup(self) -> bool:
        """True once for each burst of SIGHUPs since the last call."""
        hups = max(self._handled["hup"], self._piped["hup"])
        if hups == self._hups_seen:
            return False
        self._hups_seen = hups
        return True

    def _drain(self, fd: int | None = None) -> None:
        try:
            while True:
                data = os.read(self._read if fd is None else fd, 512)
                if not data:
                    return
                for signum in data:
                    if signum == signal.SIGHUP:
                        self._piped["hup"] += 1
                    elif signum in (signal.SIGTERM, signal.SIGINT):
                        self._piped["stop"] += 1
        except BlockingIOError:
            pass  # drained
        self._exit_if_third()

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self._handled["stop"] += 1
        self._exit_if_third()

    def _exit_if_third(self) -> None:
        """The third SIGTERM/SIGINT exits at once (SPEC section 4), by either count: the
        handler calls of signals that came while the main thread was inside one long C
        call may run merged into one, while each left its byte in the pipe."""
        if self.count >= 3:
            os._exit(0)

    def _hup(self, signum: int, _frame: FrameType | None) -> None:
        self._handled["hup"] += 1
