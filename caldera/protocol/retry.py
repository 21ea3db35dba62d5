"""The one retry policy: 1, 2, 5, 10, 30, 60, 60 ... s with +-20 % jitter, and a
server's Retry-After (or an auth block's wait) as a floor on the next delay.

Every loop of the daemon and `report --once` retry through `Backoff`; so do the
outbox's held-back items (`delay_for`, by the item's own attempt count) and the
calls inside one-shot commands (`retry_within`). The hint an error carries is
read in one place (`caldera.errors.retry_after`).
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from caldera import errors

STEPS = (1, 2, 5, 10, 30, 60)
JITTER = 0.2
T = TypeVar("T")


class Backoff:
    def __init__(self, steps: Sequence[float] = STEPS, jitter: float = JITTER, rng: random.Random | None = None):
        self.steps, self.jitter = steps, jitter
        self._rng = rng or random.Random()
        self.failures = 0

    def delay_for(self, failures: int, retry_after: float | None = None) -> float:
        """The delay after the `failures`-th failure in a row (0-based), without counting it."""
        base = self.steps[min(max(failures, 0), len(self.steps) - 1)]
        delay = base * (1 + self._rng.uniform(-self.jitter, self.jitter))
        return max(delay, retry_after or 0.0)

    def next_delay(self, retry_after: float | None = None) -> float:
        delay = self.delay_for(self.failures, retry_after)
        self.failures += 1
        return delay

    def after(self, exc: BaseException) -> float:
        """The delay after a failed attempt, honouring the hint the error carries."""
        return self.next_delay(errors.retry_after(exc))

    def reset(self) -> None:
        self.failures = 0


def retry_within(call: Callable[[], T], *, transient: Callable[[BaseException], bool], cancel: threading.Event,
                 deadline: float, on_retry: Callable[[BaseException, float], None] | None = None,
                 backoff: Backoff | None = None) -> T:
    """`call()` until it succeeds, retrying what `transient(exc)` says is passing, within the
    deadline (time.monotonic()): a one-shot command the plane issues once (idempotency keys)
    must outlast a 502 or a dropped connection. Waits on `cancel`; the last error is raised
    when no time is left for another try."""
    backoff = backoff or Backoff()
    while True:
        try:
            return call()
        except Exception as exc:
            if not transient(exc):
                raise
            delay = backoff.after(exc)
            if time.monotonic() + delay >= deadline:
                raise
            if on_retry is not None:
                on_retry(exc, delay)
            if cancel.wait(delay):
                raise
