"""The daemon's signals: SIGTERM/SIGINT (counted: drain, cancel, exit) and SIGHUP (reload).

The handlers only count and write one byte to a pipe; the main thread waits on
that pipe and does the work. Why: a Python signal handler runs in the main
thread between two bytecodes, possibly while that thread holds the lock inside
`threading.Event.wait()` (taken on entry and on return). A handler calling
`Event.set()` then waits for that same lock forever: the daemon hung on
SIGTERM in about one build in three (issue 18). `os.write` on a non-blocking
pipe takes no lock.

A reload that changed the configuration restarts the daemon in place (`os.execv`),
and a signal must not fall into that gap: a SIGTERM counted by the old process
and then exec'd away leaves a new daemon that nobody asked to stop running on
(systemd then waits TimeoutStopSec and kills it). So the old process `hold()`s
the three signals before its last look at the count: from then on the kernel
keeps them pending, across execve (the mask and pending signals survive it), and
the new process's `install()` sets its handlers first and unblocks them second,
so a held SIGTERM arrives at a handler that drains and stops.
"""
from __future__ import annotations

import os
import select
import signal

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Signals:
    def __init__(self):
        self.count = 0  # SIGTERM + SIGINT received
        self._hups = 0  # SIGHUP received
        self._hups_seen = 0
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous_wakeup: int | None = None  # the wakeup fd install() replaced

    def install(self) -> None:
        """Handlers first, then unblock: a signal held across a restart in place is delivered now.

        The pipe is also the interpreter's wakeup fd: the kernel may hand a process's signal
        to any thread, and Python runs the handler (which pokes the pipe) only in the main
        thread, when it next runs bytecode. A SIGTERM taken by a loop's thread while the
        main thread sat in `wait()` (an hour's timeout without a watchdog) went unseen until
        a second signal: bench/bench_runtime.py saw a daemon ignore SIGTERM for 60 s. The C
        handler writes the wakeup byte from whichever thread took the signal."""
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._hup)
        self._previous_wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

    def hold(self) -> bool:
        """Before a restart in place: block the three signals in this (the main) thread, so
        that the kernel keeps any that come from now on for the restarted process; True when
        none asked to stop so far. Call it from the main thread, the one that calls execv."""
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        return self.count == 0

    def close(self) -> None:
        """From the main thread (as install): the pipe stops being the wakeup fd first."""
        if self._previous_wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            self._previous_wakeup = None
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
