"""The skills watcher thread: `skills_loop(publisher, wake, live)`.

On start: put back anything an interrupted swap left, scan, queue a full
inventory (trigger `startup`). Then every 30 s a cheap change check (stat
signatures; only a changed skill is hashed) and a new inventory when what the
control plane would see differs from the last one queued; at once when
`wake.inventory_changed()` is called. The publisher hands the active skill
count on after every scan. `mode: full` only after a complete scan.
"""
from __future__ import annotations

import logging
import threading
from typing import Protocol

from caldera.host.loopguard import LoopGuard
from caldera.protocol.retry import Backoff
from caldera.skills import inventory, notify, publish, store

log = logging.getLogger("caldera.skills")
CHECK_INTERVAL = 30.0


class Wake(Protocol):
    """What the loop uses of the daemon's Wakeups (skills/ may not import daemon/)."""

    stop: threading.Event
    inventory: threading.Event


class Live(Protocol):
    """What the loop uses of the daemon's LiveStatus: its turn, for the watchdog."""

    def tick(self, loop: str) -> None: ...


def skills_loop(publisher: publish.Publisher, wake: Wake, live: Live) -> None:
    notifier = notify.Notifier.open()
    try:
        _loop(publisher, wake, live, notifier)
    finally:
        if notifier is not None:
            notifier.close()


def _recover(publisher: publish.Publisher) -> None:
    """Put back what an interrupted swap left (once, before the first scan)."""
    with inventory.exclusive_lock(publisher.state_dir):
        for note in store.recover(inventory.managed_root(publisher.state_dir)):
            log.warning("%s", note)


def _loop(publisher: publish.Publisher, wake: Wake, live: Live, notifier: notify.Notifier | None) -> None:
    """Every turn survives: a failed recovery or scan is logged by the guard (once while it
    repeats) and tried again after a backoff (at most CHECK_INTERVAL) or a wake-up."""
    guard = LoopGuard(log, "skills watcher", Backoff())
    scanner, recovered = None, False
    trigger = "startup"
    while not wake.stop.is_set():
        live.tick("skills")
        delay = CHECK_INTERVAL
        try:
            if not recovered:
                _recover(publisher)
                recovered = True
            if scanner is None or scanner.env != (publisher.env() or {}):
                scanner = publisher.scanner(notifier)  # reload_config may have changed CALDERA_SKILL_DIRS
            check_once(publisher, scanner, trigger)
            guard.ok()
            trigger = "change"
        except Exception as exc:  # noqa: BLE001 -- one bad turn must not end the watcher; the trigger is kept
            delay = min(CHECK_INTERVAL, guard.failed(exc))
        woke = wake.inventory.wait(delay) if not wake.stop.is_set() else False
        wake.inventory.clear()
        if woke:
            trigger = "command"


def check_once(publisher: publish.Publisher, scanner: inventory.Inventory, trigger: str) -> bool:
    """One turn; True when an inventory was queued."""
    scan = scanner.scan()
    publisher.on_count(len(scan.active))
    if trigger == "command":  # the plane asked (or a command changed the skills): always send
        publisher.send(scan, trigger)
        return True
    if publisher.accepted(scan):  # the plane has this very inventory (also at startup)
        return False
    if trigger != "startup" and publish.sent_digest(scan) == publisher.state.get(publish.SENT_KEY):
        return False  # queued already, not yet accepted: the sender delivers it
    publisher.send(scan, trigger)
    return True
