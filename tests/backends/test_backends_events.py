"""Event sink: numbering, redaction, exactly one terminal, UTF-8-safe splitting."""
import pytest

from caldera.backends import events
from caldera.redact import Redactor


def test_sink_numbers_redacts_and_stops_after_terminal():
    seen = []
    sink = events.EventSink("r", Redactor(["super-secret-value"]), listeners=[seen.append])
    sink.emit("assistant_message", {"text": "x super-secret-value y", "token": "abc123456"})
    sink.emit("terminal_status", {"status": "completed", "failure_kind": None})
    assert sink.emit("assistant_message", {"text": "late"}) is None
    assert [e["seq"] for e in seen] == [1, 2] and sink.total == 2
    assert seen[0]["data"] == {"text": "x [REDACTED] y", "token": "[REDACTED]"}
    with pytest.raises(ValueError):
        sink.emit("bogus", {})


def test_split_never_cuts_a_character_or_a_secret():
    text = ("€" * 3000) + "tail"
    parts, dropped = events.split_utf8(text, 8192, None)
    assert "".join(parts) == text and not dropped
    assert all(len(p.encode()) <= 8192 for p in parts)
    secret = "S" * 20 + "-secretvalue"
    sink = events.EventSink("r", Redactor([secret]))
    sink.text_events("command_output", {}, "output", "a" * 8180 + secret, 4)
    joined = "".join(e["data"]["output"] for e in sink.last)
    assert secret not in joined and "[REDACTED]" in joined


def test_parts_beyond_the_cap_are_dropped_and_flagged():
    sink = events.EventSink("r", Redactor())
    sink.text_events("assistant_message", {}, "text", "x" * 50000, 2)
    data = [e["data"] for e in sink.last]
    assert len(data) == 2 and data[-1]["truncated"] and data[-1]["total_bytes"] == 50000
