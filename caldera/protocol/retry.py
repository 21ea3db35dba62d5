"""The one retry policy: 1, 2, 5, 10, 30, 60, 60 ... s with +-20 % jitter, and a
server's Retry-After (or an auth block's wait) as a floor on the next delay.

Every loop of the daemon and `report --once` retry through `Backoff`; the hint an
error carries is read in one place (`caldera.errors.retry_after`).
"""
from __future__ import annotations

import random

from caldera import errors

STEPS = (1, 2, 5, 10, 30, 60)
JITTER = 0.2


class Backoff:
    def __init__(self, steps=STEPS, jitter=JITTER, rng=None):
        self.steps, self.jitter = steps, jitter
        self._rng = rng or random.Random()
        self.failures = 0

    def next_delay(self, retry_after: float | None = None) -> float:
        base = self.steps[min(self.failures, len(self.steps) - 1)]
        self.failures += 1
        delay = base * (1 + self._rng.uniform(-self.jitter, self.jitter))
        return max(delay, retry_after or 0.0)

    def after(self, exc: BaseException) -> float:
        """The delay after a failed attempt, honouring the hint the error carries."""
        return self.next_delay(errors.retry_after(exc))

    def reset(self) -> None:
        self.failures = 0
