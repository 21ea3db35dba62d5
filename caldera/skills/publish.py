"""Scan and hand the inventory to the outbox (the sender delivers it at least once).

`Publisher` is shared by the watcher loop and the command handlers, so `report
--once` (which has no watcher) still reports every change a command made.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from caldera.skills import inventory

log = logging.getLogger("caldera.skills")
SENT_KEY = "skills_inventory_sent"  # state.json: digest of the last inventory queued


@dataclass(frozen=True, eq=False)
class Publisher:
    """What scanning and publishing the inventory needs, by name."""

    state_dir: Path
    env: Callable[[], dict]  # the current settings' environment (reload_config may change skill dirs)
    runtime_type: str
    agent_id: str
    outbox: object
    state: object  # StateFile
    on_count: Callable[[int], None]  # the active skill count, for heartbeats
    report_now: Callable[[], None]

    def scanner(self, notifier=None) -> inventory.Inventory:
        return inventory.Inventory(self.state_dir, self.env() or {}, self.runtime_type, notifier=notifier)

    def send(self, scan: inventory.Scan, trigger: str) -> dict:
        """Queue one inventory; an older one still waiting is dropped (this one supersedes it)."""
        self.on_count(len(scan.active))
        body = inventory.body(self.agent_id, scan, trigger)
        # by name (NNN-kind.json), so a full outbox of results is not read on every send
        for name in sorted(n for n in os.listdir(self.outbox.dir) if n.endswith("-inventory.json")):
            self.outbox.done(name)
        self.outbox.put("inventory", {"body": body})
        self.state.set(SENT_KEY, sent_digest(scan))
        if not scan.complete:
            log.warning("skill scan incomplete (%s); sent as incremental", "; ".join(scan.problems)[:500])
        self.report_now()
        return body

    def scan_and_send(self, trigger: str) -> tuple[inventory.Scan, dict]:
        scan = self.scanner().scan()
        return scan, self.send(scan, trigger)


def sent_digest(scan: inventory.Scan) -> str:
    return ("full:" if scan.complete else "partial:") + inventory.digest_of(scan.records)
