"""Time as text: `rfc3339` for every timestamp the runtime sends or stores, and how long ago,
for people: "12 s ago", "5 min ago", "3 h ago" (logs, status, the plane's page)."""
from __future__ import annotations

import functools
import time


def rfc3339(ts: float | None = None, millis: bool = False) -> str:
    """`ts` (default: now) as RFC 3339 UTC with a `Z`, to the second: `2026-12-03T05:30:00Z`.
    `millis=True` adds three truncated fractional digits (`…:00.250Z`), for run events."""
    ts = time.time() if ts is None else ts
    text = _second(int(ts)) if ts >= 0 else time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    if millis:
        text += f".{int(ts % 1 * 1000):03d}"
    return text + "Z"


@functools.lru_cache(maxsize=4)
def _second(second: int) -> str:
    # strftime and gmtime once a second, not once a record: a busy run log writes many
    # records a second (docs/performance.md section 5)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"

