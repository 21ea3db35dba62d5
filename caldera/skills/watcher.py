"""The skills watcher thread: `skills_loop(runtime, stop=None)`.

On start: put back anything an interrupted swap left, scan, queue a full
inventory (trigger `startup`). Then every 30 s a cheap change check (stat
signatures; only a changed skill is hashed) and a new inventory when what the
control plane would see differs from the last one queued; at once when
`runtime.inventory_changed()` is called. Sets `runtime.skill_count` (the
active skills) after every scan. `mode: full` only after a complete scan.
"""
from __future__ import annotations

import logging

from caldera.skills import inventory, notify, publish, store

log = logging.getLogger("caldera.skills")
CHECK_INTERVAL = 30.0


def skills_loop(runtime, stop=None) -> None:
    stop = stop or runtime.stop
    wake = runtime.inventory_wakeup
    for root in (inventory.managed_root(runtime.paths.state_dir),):
        with inventory.exclusive_lock(runtime.paths.state_dir):
            for note in store.recover(root):
                log.warning("%s", note)
    notifier = notify.Notifier.open()
    try:
        _loop(runtime, stop, wake, notifier)
    finally:
        if notifier is not None:
            notifier.close()


def _loop(runtime, stop, wake, notifier) -> None:
    scanner = publish.scanner(runtime, notifier)
    trigger = "startup"
    while not stop.is_set():
        _tick(runtime)
        if scanner.env != (getattr(runtime.settings, "env", None) or {}):
            scanner = publish.scanner(runtime, notifier)  # reload_config may have changed CALDERA_SKILL_DIRS
        try:
            check_once(runtime, scanner, trigger)
        except Exception:  # noqa: BLE001 -- one bad scan must not end the watcher; retried next turn
            log.exception("skill scan failed")
        woke = wake.wait(CHECK_INTERVAL) if not stop.is_set() else False
        wake.clear()
        trigger = "command" if woke else "change"


def check_once(runtime, scanner: inventory.Inventory, trigger: str) -> bool:
    """One turn; True when an inventory was queued."""
    scan = scanner.scan()
    runtime.skill_count = len(scan.active)
    forced = trigger in ("startup", "command")
    if not forced and publish.sent_digest(scan) == runtime.state.get(publish.SENT_KEY):
        return False
    publish.send(runtime, scan, trigger)
    return True


def _tick(runtime) -> None:
    tick = getattr(runtime, "tick", None)
    if tick is not None:
        tick("skills")
