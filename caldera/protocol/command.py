"""A control-plane command, parsed once: when it is fetched (or read back from the journal).

`commands/next` answers untrusted JSON. `parse_command` makes it a frozen `Command`, or
raises `MalformedCommand` when the command cannot be named (not an object, no id that is a
number or a string): such a command can be neither journaled nor started nor finished, so
it is only logged. An id that names it but may not go into a URL (not digits) is refused
by the start, which finishes the command failed with that sentence.
Whatever else is wrong with a command (an unknown type, a payload that is not an object,
an answer too large to read) does not stop it from being named: the executor finishes it
`failed` with a sentence saying why (`refusal`, or dispatch's "unsupported command type").
"""
from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

DEFAULT_TIMEOUT_SECONDS = 300.0  # a command without a usable timeout_seconds (docs/runtime.md)


class MalformedCommand(ValueError):
    """The plane's answer is no command that can be named."""


class Command(NamedTuple):
    """One command as the runtime uses it. `raw` is the plane's object as fetched: the
    journal keeps it verbatim, and recovery after a restart parses it again: it is left out of
    ==, hash() and repr(). (A NamedTuple, not a dataclass: `dataclasses` is 1.3 MiB of an idle
    daemon's PSS, docs/performance.md section 10; `_replace()` makes a changed copy.)"""

    id: int | str  # as the plane sent it (digits): start and finish name it so
    type: str  # command_type; "" when missing (dispatch refuses it as unsupported)
    payload: dict[str, Any]  # {} when missing or not an object (then `refusal` says so)
    timeout_seconds: float  # > 0: the plane's, else DEFAULT_TIMEOUT_SECONDS
    run_id: str | None = None  # the payload's run_id (agent_run, agent_interrupt)
    refusal: str | None = None  # why it may not run: the error message it is finished with
    local: bool = False  # the runtime gave it itself (a desired config revision): no journal, start or finish
    too_large: str | None = None  # the fetch read only the answer's head ("over N bytes"); journaled with raw
    raw: dict[str, Any] = {}  # noqa: RUF012 (never mutated: a NamedTuple's default)

    @property
    def key(self) -> str:
        """The id as text: the journal's key, and what the outbox compares."""
        return str(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Command) and self[:-1] == other[:-1]

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self[:-1])

    def __repr__(self) -> str:
        shown = zip(self._fields[:-1], self, strict=False)
        return "Command(" + ", ".join(f"{name}={value!r}" for name, value in shown) + ")"


def parse_command(raw: Any, *, local: bool = False, too_large: str | None = None) -> Command:
    """The plane's command object as a Command; MalformedCommand (a sentence) when it
    cannot be named. `local` and `too_large` (the fetch read only the answer's head:
    `ControlPlaneClient.next_command` says so, then the journal) are never read from the
    plane's object, so a plane cannot forge them."""
    if not isinstance(raw, dict):
        raise MalformedCommand(f"a command must be a JSON object, not {type(raw).__name__}")
    cid = raw.get("id")
    if cid is None:
        raise MalformedCommand("a command without an id")
    if isinstance(cid, bool) or not isinstance(cid, (int, str)):
        raise MalformedCommand(f"a command id must be a number or a string, not {type(cid).__name__}")
    ctype = str(raw.get("command_type") or "")
    payload = raw.get("payload")
    refusal = None
    if too_large is not None:
        refusal = f"payload too large: the command's answer was {too_large}"
    elif payload is not None and not isinstance(payload, dict):
        refusal = f"invalid payload for {ctype}: must be a JSON object"
    payload = payload if isinstance(payload, dict) else {}
    run_id = payload.get("run_id")
    return Command(id=cid, type=ctype, payload=payload, timeout_seconds=_timeout(raw.get("timeout_seconds")),
                   run_id=run_id if isinstance(run_id, str) else None, refusal=refusal, local=local,
                   too_large=too_large, raw=raw)


def _timeout(value: Any) -> float:
    """The plane's timeout in seconds; the default for none, nonsense or <= 0. A boolean is
    nonsense too (JSON's `true` is no number of seconds, though Python's float(True) is 1.0).
    A larger one than a thread's wait can take (threading.TIMEOUT_MAX, about 292 years) is
    cut to it."""
    if isinstance(value, bool):
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return DEFAULT_TIMEOUT_SECONDS
    if math.isnan(seconds) or seconds <= 0:
        return DEFAULT_TIMEOUT_SECONDS
    return min(seconds, threading.TIMEOUT_MAX)
