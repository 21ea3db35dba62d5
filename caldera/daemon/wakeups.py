"""The stop signal and the loops' wake-up events, in one small object.

Every loop waits on its own event with a timeout (`wait_any`); `shutdown()` sets
`stop` and every wake-up, so each loop sees a stop at once.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


def _event() -> threading.Event:
    return threading.Event()


@dataclass(eq=False)
class Wakeups:
    stop: threading.Event = field(default_factory=_event)
    draining: threading.Event = field(default_factory=_event)  # the 1st SIGTERM: fetch nothing new
    report: threading.Event = field(default_factory=_event)
    poll: threading.Event = field(default_factory=_event)
    heartbeat: threading.Event = field(default_factory=_event)
    inventory: threading.Event = field(default_factory=_event)
    outbox: threading.Event = field(default_factory=_event)  # the Outbox sets it on every put
    changes: int = 0  # bumped by every report_now(): a report built before it is stale
    _changes_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report_now(self) -> None:
        """The state changed (a mutating command or verb, the agent's own change): a report now,
        and no report built before this one answers a command (`ReportFloor.recent`)."""
        with self._changes_lock:
            self.changes += 1
        self.report.set()

    def report_soon(self) -> None:
        """A report now, the state unchanged (a read-only command finished)."""
        self.report.set()

    def generation(self) -> int:
        return self.changes

    def inventory_changed(self) -> None:
        self.inventory.set()

    def reconnected(self) -> None:
        """The plane answers again after an outage: every loop tries now, not after its backoff."""
        for event in (self.report, self.poll, self.heartbeat, self.outbox):
            event.set()

    def shutdown(self) -> None:
        self.stop.set()
        for event in (self.report, self.poll, self.heartbeat, self.inventory, self.outbox):
            event.set()


def wait_any(stop: threading.Event, event: threading.Event, timeout: float) -> None:
    """Wait until `event` is set or `timeout` passes, then clear it (a stop sets every event)."""
    if not stop.is_set():
        event.wait(max(0.0, timeout))
    event.clear()
