"""Scan and hand the inventory to the outbox (the sender delivers it at least once).

Shared by the watcher loop and the command handlers, so `report --once`
(which has no watcher) still reports every change a command made.
"""
from __future__ import annotations

import logging
import os

from caldera.skills import inventory

log = logging.getLogger("caldera.skills")
SENT_KEY = "skills_inventory_sent"  # state.json: digest of the last inventory queued


def scanner(runtime, notifier=None) -> inventory.Inventory:
    settings = runtime.settings
    return inventory.Inventory(runtime.paths.state_dir, getattr(settings, "env", None) or {},
                               getattr(settings, "runtime_type", "caldera"), notifier=notifier)


def send(runtime, scan: inventory.Scan, trigger: str) -> dict:
    """Queue one inventory; an older one still waiting is dropped (this one supersedes it)."""
    runtime.skill_count = len(scan.active)
    body = inventory.body(runtime.agent_id, scan, trigger)
    outbox = runtime.outbox
    # by name (NNN-kind.json), so a full outbox of results is not read on every send
    for name in sorted(n for n in os.listdir(outbox.dir) if n.endswith("-inventory.json")):
        outbox.done(name)
    outbox.put("inventory", {"body": body})
    runtime.state.set(SENT_KEY, sent_digest(scan))
    if not scan.complete:
        log.warning("skill scan incomplete (%s); sent as incremental", "; ".join(scan.problems)[:500])
    runtime.report_now()
    return body


def sent_digest(scan: inventory.Scan) -> str:
    return ("full:" if scan.complete else "partial:") + inventory.digest_of(scan.records)


def scan_and_send(runtime, trigger: str) -> tuple[inventory.Scan, dict]:
    scan = scanner(runtime).scan()
    return scan, send(runtime, scan, trigger)
