"""What the loops share: how an error is logged, and "last successful was X ago"."""
from __future__ import annotations

import time

from caldera.host.timefmt import human_age


def ago(since: float | None, now: float | None = None) -> str:
    """`since` is a time.monotonic() value."""
    return human_age(None if since is None else (now or time.monotonic()) - since)


def wait_any(stop, event, timeout: float) -> None:
    """Wait until `event` is set or `timeout` passes, then clear it.

    Runtime.shutdown() sets `stop` and every wake-up event, so this wait ends
    at once on a stop too.
    """
    if not stop.is_set():
        event.wait(max(0.0, timeout))
    event.clear()
