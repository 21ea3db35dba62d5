"""The standard event stream of one run: numbering, timestamps, redaction, caps, fan-out.

Every event leaves through `EventSink.emit`, which redacts it (the one Redactor),
writes it to the run log, keeps the last 50 for the finish result and hands it
to the listeners (CLI printer, control-plane batch poster).
"""
from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from caldera.backends.runlog import RunLog
    from caldera.redact import Redactor

Event = dict[str, Any]  # {run_id, seq, ts, type, data}
Listener = Callable[[Event], None]

EVENT_TYPES = ("backend_status", "assistant_message", "tool_call", "command_output",
               "diff", "error", "terminal_status")
TEXT_PART_BYTES = 8 * 1024  # one event's text (SPEC section 10)
DIFF_CAP_BYTES = 64 * 1024
KEEP_LAST = 50


def cut_utf8(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to at most `limit` UTF-8 bytes on a character boundary, and whether it was cut."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text, False
    end = limit
    while end > 0 and (raw[end] & 0xC0) == 0x80:
        end -= 1
    return raw[:end].decode("utf-8"), True


def short_text(value: Any, limit: int = 2048) -> str | None:
    """A tool call's argument as an event shows it: JSON unless it is text, cut to `limit`
    UTF-8 bytes with an ellipsis; None stays None."""
    if value is None:
        return None
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, default=str)
    text, cut = cut_utf8(value, limit)
    return text + "…" if cut else text


def split_utf8(text: str, part_bytes: int = TEXT_PART_BYTES, max_parts: int | None = None) -> tuple[list[str], bool]:
    """Parts of at most `part_bytes` each (character boundaries), and whether parts were dropped."""
    parts = []
    rest = text
    while True:
        head, cut = cut_utf8(rest, part_bytes)
        parts.append(head)
        if not cut:
            return parts, False
        rest = rest[len(head):]
        if max_parts is not None and len(parts) >= max_parts:
            return parts, True


class EventSink:
    def __init__(self, run_id: str, redactor: Redactor, runlog: RunLog | None = None,
                 listeners: Iterable[Listener] = ()):
        self.run_id = run_id
        self.redactor = redactor
        self.runlog = runlog
        self.listeners = list(listeners)
        self.total = 0
        self.last: collections.deque[Event] = collections.deque(maxlen=KEEP_LAST)
        self.terminal: Event | None = None
        self._lock = threading.Lock()

    def emit(self, type_: str, data: dict[str, Any]) -> Event | None:
        if type_ not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type_!r}")
        with self._lock:
            if self.terminal is not None:
                return None  # exactly one terminal_status ends a run; nothing after it
            self.total += 1
            event = {"run_id": self.run_id, "seq": self.total, "ts": rfc3339(millis=True),
                     "type": type_, "data": self.redactor(data)}
            if type_ == "terminal_status":
                self.terminal = event
            self.last.append(event)
        if self.runlog is not None:
            self.runlog.event(event)
        for listener in self.listeners:
            listener(event)
        return event

    def text_events(self, type_: str, base: dict[str, Any], key: str, text: str, max_parts: int) -> None:
        """One event per part of `text` (≤ 8 KiB each); `truncated` says the rest is in the log."""
        text = self.redactor.text(text)  # redact before cutting: a secret must not straddle parts
        parts, dropped = split_utf8(text, TEXT_PART_BYTES, max_parts)
        for index, part in enumerate(parts, 1):
            data = dict(base)
            data[key] = part
            if len(parts) > 1 or dropped:
                data.update(part=index, parts=len(parts))
            if dropped and index == len(parts):
                data["truncated"] = True
                data["total_bytes"] = len(text.encode("utf-8"))
            self.emit(type_, data)

    def diff(self, text: str) -> None:
        """The turn's diff, once: redacted, then cut to 64 KiB (`bytes` is the whole size)."""
        text = self.redactor.text(text)
        capped, cut = cut_utf8(text, DIFF_CAP_BYTES)
        data: dict[str, Any] = {"diff": capped, "bytes": len(text.encode("utf-8"))}
        if cut:
            data["truncated"] = True
        self.emit("diff", data)

    @property
    def done(self) -> bool:
        return self.terminal is not None

    def terminal_data(self) -> dict[str, Any]:
        """The terminal event's data ({} while the run has none)."""
        return self.terminal["data"] if self.terminal is not None else {}
