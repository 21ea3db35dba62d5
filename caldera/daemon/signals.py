"""The daemon's signals: SIGTERM/SIGINT (counted: drain, cancel, exit) and SIGHUP (reload).

The handlers only count and write one byte to a pipe; the main thread waits on
that pipe and does the work. Why: a Python signal handler runs in the main
thread between two bytecodes, possibly while that thread holds the lock inside
`threading.Event.wait()` (taken on entry and on return). A handler calling
`Event.set()` then waits for that same lock forever: the daemon hung on
SIGTERM in about one build in three (issue 18). `os.write` on a non-blocking
pipe takes no lock.
"""
from __future__ import annotations

import os
import select
import signal


class Signals:
    def __init__(self):
        self.count = 0  # SIGTERM + SIGINT received
        self._hups = 0  # SIGHUP received
        self._hups_seen = 0
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._hup)

    def close(self) -> None:
        for fd in (self._read, self._write):
            os.close(fd)

    def wait(self, timeout: float) -> None:
        """Until a signal arrives (or arrived since the last wait) or `timeout` passes."""
        ready, _, _ = select.select([self._read], [], [], max(0.0, timeout))
        if ready:
            try:
                while os.read(self._read, 512):
                    pass
            except BlockingIOError:
                pass  # drained

    def take_hup(self) -> bool:
        """True once for each burst of SIGHUPs since the last call."""
        if self._hups == self._hups_seen:
            return False
        self._hups_seen = self._hups
        return True

    def _stop(self, signum, frame) -> None:
        self.count += 1
        if self.count >= 3:
            os._exit(0)  # the third: at once, as SPEC section 4 says
        self._poke()

    def _hup(self, signum, frame) -> None:
        self._hups += 1
        self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._write, b"!")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending already
