"""What a loop thread does with an error it did not expect: it says so once and goes on.

No loop thread may die of an exception (docs/architecture.md, "Loop threads and their
survival"). A loop catches at the level of one turn and hands the error to its
`LoopGuard`, which logs it and returns how long to back off. A disk that stays full
would otherwise log the same line every turn, so the same error again (same type and
message) is logged at DEBUG only; a different one is logged again, and the first good
turn after failures says so once (`ok()`).

A CalderaError is the taxonomy's (its message is the sentence): one WARNING line. Anything
else is a bug or the host's (OSError): WARNING with its traceback, passed through the
redactor like the line. The delays come from the caller's backoff (the one retry policy,
protocol/retry.Backoff, which host/ may not import), or a fixed delay without one.
"""
from __future__ import annotations

import traceback

from caldera import TYPE_CHECKING
from caldera.errors import CalderaError

if TYPE_CHECKING:
    from collections.abc import Callable
    from logging import Logger
    from typing import Protocol

    class Delays(Protocol):
        """What the guard uses of protocol/retry.Backoff."""

        def after(self, exc: BaseException) -> float: ...

        def reset(self) -> None: ...

FIXED_DELAY = 1.0  # without a backoff: a loop that waits on an event anyway (the signal relay)


class LoopGuard:
    def __init__(self, log: Logger, what: str, backoff: Delays | None = None,
                 redact: Callable[[str], str] = str) -> None:
        """`what` names the loop in the log lines ("outbox sender")."""
        self.log, self.what, self.backoff, self.redact = log, what, backoff, redact
        self.failures = 0  # in a row
        self._last: tuple[type, str] | None = None

    def failed(self, exc: BaseException) -> float:
        """Log `exc` (once while it repeats) and return the delay before the next turn."""
        self.failures += 1
        key = (type(exc), str(exc))
        if key == self._last:
            self.log.debug("%s failed again (%d in a row): %s", self.what, self.failures, self.redact(str(exc)))
        elif isinstance(exc, CalderaError):
            self.log.warning("%s failed: %s; retrying", self.what, self.redact(str(exc)))
        else:
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
            self.log.warning("%s failed: %s; retrying\n%s", self.what, self.redact(f"{type(exc).__name__}: {exc}"),
                             self.redact(trace))
        self._last = key
        return self.backoff.after(exc) if self.backoff is not None else FIXED_DELAY

    def ok(self) -> None:
        """A good turn: the backoff starts over, and a recovery is said once."""
        if self.failures:
            self.log.info("%s works again after %d failed turn%s", self.what, self.failures,
                          "" if self.failures == 1 else "s")
        self.failures, self._last = 0, None
        if self.backoff is not None:
            self.backoff.reset()
