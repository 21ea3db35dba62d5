"""The stop signal and the loops' wake-up events, in one small object.

Every loop waits on its own event with a timeout (`wait_any`); `shutdown()` sets
`stop` and every wake-up, so each loop sees a stop at once.
"""
from __future__ import annotations

import threading


def _event() -> threading.Event:
    return threading.Event()


class Wakeups:
    __slots__ = ("stop", "draining", "report", "poll", "heartbeat", "inventory", "outbox", "changes", "_changes_lock")

    stop: threading.Event
    draining: threading.Event  # the 1st SIGTERM: fetch nothing new
    report: threading.Event
    poll: threading.Event
    heartbeat: threading.Event
    inventory: threading.Event
    outbox: threading.Event  # the Outbox sets it on every put
    changes: int  # bumped by every report_now(): a report built before it is stale
    _changes_lock: threading.Lock

    def __init__(self, stop: threading.Event | None = None, draining: threading.Event | None = None,
                 report: threading.Event | None = None, poll: threading.Event | None = None,
                 heartbeat: threading.Event | None = None, inventory: threading.Event | None = None,
                 outbox: threading.Event | None = None, changes: int = 0) -> None:
        self.stop = _event() if stop is None else stop
        self.draining = _event() if draining is None else draining
        self.report = _event() if report is None else report
        self.poll = _event() if poll is None else poll
        self.heartbeat = _event() if heartbeat is None else heartbeat
        self.inventory = _event() if inventory is None else inventory
        self.outbox = _event() if outbox is None else outbox
        self.changes = changes
        self._changes_lock = threading.Lock()

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
