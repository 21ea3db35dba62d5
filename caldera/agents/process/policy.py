"""`runtime.restart` as a pure policy (SPEC section 7b): what to do when the agent exits.

Delays 1, 2, 5, 10, 30, 60, 60… s; the ladder starts again after 60 s up. A
failure is an exit that is not 0 (or a signal, or a failed start); 5 failures
inside 10 minutes put the agent in `error`, where it waits for a command. Pure:
times are passed in, so tests need no clock.
"""
from __future__ import annotations

import collections

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

DELAYS = (1, 2, 5, 10, 30, 60)
RESET_AFTER = 60.0
WINDOW = 600.0
MAX_FAILURES = 5
RESTART, STOP, ERROR = "restart", "stop", "error"


class RestartPolicy:
    def __init__(self, mode: str = "on-failure", delays: Iterable[float] = DELAYS) -> None:
        self.mode, self.delays = mode, tuple(delays)
        self.step = 0  # index into DELAYS for the next restart
        self.failures: collections.deque[float] = collections.deque()  # monotonic times of the failures

    def reset(self) -> None:
        """A command started the agent: forget the ladder and the failures."""
        self.step = 0
        self.failures.clear()

    def on_exit(self, now: float, uptime: float, failed: bool) -> tuple[str, float | None]:
        """(RESTART, delay) | (STOP, None) | (ERROR, None) after an exit at `now` (monotonic)."""
        if uptime >= RESET_AFTER:
            self.step = 0
        if failed:
            self.failures.append(now)
            while self.failures and now - self.failures[0] > WINDOW:
                self.failures.popleft()
            if len(self.failures) >= MAX_FAILURES:
                return ERROR, None
        if self.mode == "never" or (self.mode == "on-failure" and not failed):
            return (ERROR if failed else STOP), None
        delay = self.delays[min(self.step, len(self.delays) - 1)]
        self.step += 1
        return RESTART, float(delay)
