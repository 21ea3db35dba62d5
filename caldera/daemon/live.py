"""What the loops know right now, for the reports and for `caldera status`.

`LiveStatus` holds the last sample, the agent's last report section, the skill
count, each loop's last turn (for the watchdog) and the drop counters. The
loops write it, the heartbeat and the reporter read it; `publish()` mirrors the
counters into state.json, where `caldera status` (another process) reads them.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from caldera.host.timefmt import human_age
from caldera.protocol.payloads import default_section

if TYPE_CHECKING:
    from caldera.host.sampler import Sample

DROPS_KEY = "drops"  # state.json


class LiveStatus:
    def __init__(self) -> None:
        self.last_sample: Sample | None = None
        self.last_section: dict[str, Any] = default_section()
        self.skill_count: int | None = None
        self._ticks: dict[str, float] = {}
        self._counters: dict[str, Callable[[], int]] = {}
        self._lock = threading.Lock()

    def set_skill_count(self, count: int) -> None:
        self.skill_count = count

    def tick(self, loop: str) -> None:
        self._ticks[loop] = time.monotonic()

    def alive(self, loops: Iterable[str], limit: float) -> bool:
        """Every named loop turned within `limit` seconds (one that never turned counts as alive)."""
        now = time.monotonic()
        return all(now - self._ticks.get(name, now) < limit for name in loops)

    def count_drops(self, name: str, counter: Callable[[], int]) -> None:
        """Register a drop counter (outbox, events, lanes): read whenever drops() is asked."""
        with self._lock:
            self._counters[name] = counter

    def drops(self) -> dict[str, int]:
        with self._lock:
            counters = dict(self._counters)
        return {name: int(counter()) for name, counter in sorted(counters.items())}

    def mark_stopping(self) -> None:
        """The final report says `stopping` (SIGTERM), whatever the agent said last."""
        section = self.last_section
        self.last_section = {**section, "runtime": {**section["runtime"], "runtime_status": "stopping"}}


def ago(since: float | None, now: float | None = None) -> str:
    """"12 s ago" for a time.monotonic() value: the loops' "last successful was X ago"."""
    return human_age(None if since is None else (now or time.monotonic()) - since)
