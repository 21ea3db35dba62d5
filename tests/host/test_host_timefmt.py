"""The one RFC 3339 formatter: exact strings for fixed instants."""
import calendar
import time

from caldera.host import timefmt

# 2026-12-03T05:30:00Z as a Unix timestamp, computed without the code under test
FIXED = calendar.timegm((2026, 12, 3, 5, 30, 0))


def test_seconds_precision_with_z():
    assert timefmt.rfc3339(FIXED) == "2026-12-03T05:30:00Z"


def test_fraction_dropped_without_millis():
    assert timefmt.rfc3339(FIXED + 0.999) == "2026-12-03T05:30:00Z"


def test_millis_are_three_truncated_digits():
    assert timefmt.rfc3339(FIXED + 0.25, millis=True) == "2026-12-03T05:30:00.250Z"
    assert timefmt.rfc3339(FIXED, millis=True) == "2026-12-03T05:30:00.000Z"


def test_epoch_and_no_offset_form():
    assert timefmt.rfc3339(0) == "1970-01-01T00:00:00Z"
    assert "+00:00" not in timefmt.rfc3339()


def test_default_is_now(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: FIXED + 61)
    assert timefmt.rfc3339() == "2026-12-03T05:31:01Z"
