"""The one error taxonomy, and the exit codes it means.

Every failure that crosses a module boundary is one of four kinds, and both the
daemon's loops and the CLI act on the kind, never on a module's own exception type:

| kind | class | a loop | the CLI |
| --- | --- | --- | --- |
| retryable | `Retryable` | backs off (honouring `retry_after`) and tries again | exit 1, "try later" |
| auth-blocked | `AuthBlocked` | waits `retry_after` (or SIGHUP) before registering again | exit 1 |
| refused | `Refused` | gives up on that one operation, says why | exit 1 |
| configuration | `ConfigError` (a `UsageError`) | never started: the process exits | exit 2 |

`CommandError` is a refused control-plane command: its message becomes the finish's
`error_message`. The protocol client's HTTP errors (`caldera.protocol.client`) are
subclasses of these.
"""
from __future__ import annotations

import traceback

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CalderaError(Exception):
    """Base of the taxonomy; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_FAILED
    retry_after: float | None = None


class Retryable(CalderaError):
    """Try later: network trouble, 429, 5xx, a timeout. `retry_after` is the server's floor."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AuthBlocked(CalderaError):
    """Registration was refused; no call is made until `retry_after` passes (or SIGHUP)."""

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(f"registration refused: {reason} (next try in {retry_after:.0f} s)")
        self.reason, self.retry_after = reason, retry_after


class Refused(CalderaError):
    """This one operation can't be done as asked (and would not work if repeated as is)."""


class UsageError(CalderaError):
    """A usage or configuration problem: the CLI prints it and exits 2."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A bad configuration value; the message names the variable or file."""


class CommandError(Refused):
    """A control-plane command failed; the message becomes finish.error_message."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


def retry_after(exc: BaseException) -> float | None:
    """The delay floor an error asks for (Retry-After, or an auth block's wait), else None."""
    return exc.retry_after if isinstance(exc, CalderaError) else None


def unexpected(exc: BaseException) -> str:
    """A bug, named by its type and where it was raised ("TypeError at outbox.py:120"), for a
    reason kept or sent: its message could carry a value (a result, a header), which none may."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}{where}"
