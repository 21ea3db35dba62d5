"""What the loops share: how an error is logged, and "last successful was X ago"."""
from __future__ import annotations

import time


def ago(since: float | None, now: float | None = None) -> str:
    if since is None:
        return "never"
    seconds = int((now or time.monotonic()) - since)
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def wait_any(stop, event, timeout: float) -> None:
    """Wait until `event` is set or `timeout` passes, then clear it.

    Runtime.shutdown() sets `stop` and every wake-up event, so this wait ends
    at once on a stop too.
    """
    if not stop.is_set():
        event.wait(max(0.0, timeout))
    event.clear()
