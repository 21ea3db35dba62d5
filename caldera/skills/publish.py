"""Scan and hand the inventory to the outbox (the sender delivers it at least once).

`Publisher` is shared by the watcher loop and the command handlers, so `report
--once` (which has no watcher) still reports every change a command made.

An inventory is sent when it differs from the last one the plane ACCEPTED
(docs/skills.md, "When an inventory is sent"): each queued inventory carries its
digest, and the sender, once the plane has taken it, calls `delivered()`, which
keeps that digest in `<outbox>/.inventory-accepted`. `report --once` and the
daemon's startup scan compare with it, so a cron host with 1,000 unchanged skills
sends nothing and costs the plane nothing; a `sync_skill_inventory` command (the
plane asking) always sends.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caldera.host.fsutil import NOFOLLOW, atomic_write_bytes
from caldera.skills import inventory

if TYPE_CHECKING:
    from _typeshed import StrPath

    from caldera.host.statefile import StateFile
    from caldera.protocol.outbox import Outbox
    from caldera.skills.notify import Notifier

log = logging.getLogger("caldera.skills")
SENT_KEY = "skills_inventory_sent"  # state.json: digest of the last inventory queued
ACCEPTED_FILE = ".inventory-accepted"  # in the outbox dir (not an item: items start with a digit)


class Publisher:
    """What scanning and publishing the inventory needs, by name."""

    __slots__ = ("state_dir", "env", "runtime_type", "agent_id", "outbox", "state", "on_count", "report_now")

    state_dir: Path
    env: Callable[[], dict[str, str]]  # the current settings' environment (reload_config may change skill dirs)
    runtime_type: str
    agent_id: str
    outbox: Outbox
    state: StateFile
    on_count: Callable[[int], None]  # the active skill count, for heartbeats
    report_now: Callable[[], None]

    def __init__(self, state_dir: Path, env: Callable[[], dict[str, str]], runtime_type: str, agent_id: str,
                 outbox: Outbox, state: StateFile, on_count: Callable[[int], None],
                 report_now: Callable[[], None]) -> None:
        self.state_dir = state_dir
        self.env = env
        self.runtime_type = runtime_type
        self.agent_id = agent_id
        self.outbox = outbox
        self.state = state
        self.on_count = on_count
        self.report_now = report_now

    def scanner(self, notifier: Notifier | None = None) -> inventory.Inventory:
        return inventory.Inventory(self.state_dir, self.env() or {}, self.runtime_type, notifier=notifier)

    def send(self, scan: inventory.Scan, trigger: str) -> dict[str, Any]:
        """Queue one inventory; an older one still waiting is dropped (this one supersedes it)."""
        self.on_count(len(scan.active))
        body = inventory.body(self.agent_id, scan, trigger)
        # by name (NNN-kind.json), so a full outbox of results is not read on every send
        for name in sorted(n for n in os.listdir(self.outbox.dir) if n.endswith("-inventory.json")):
            self.outbox.done(name)
        digest = sent_digest(scan)
        self.outbox.put("inventory", {"body": body, "digest": digest})
        self.state.set(SENT_KEY, digest)
        if not scan.complete:
            log.warning("skill scan incomplete (%s); sent as incremental", "; ".join(scan.problems)[:500])
        self.report_now()
        return body

    def scan_and_send(self, trigger: str) -> tuple[inventory.Scan, dict[str, Any]]:
        scan = self.scanner().scan()
        return scan, self.send(scan, trigger)

    def accepted(self, scan: inventory.Scan) -> bool:
        """Whether the plane has already accepted exactly this inventory."""
        return sent_digest(scan) == accepted_digest(self.outbox.dir)

    def send_if_changed(self, scan: inventory.Scan, trigger: str) -> dict[str, Any] | None:
        """send() unless the plane already accepted this very inventory; the body or None."""
        if self.accepted(scan):
            self.on_count(len(scan.active))
            return None
        return self.send(scan, trigger)

    def scan_and_send_if_changed(self, trigger: str) -> tuple[inventory.Scan, dict[str, Any] | None]:
        scan = self.scanner().scan()
        return scan, self.send_if_changed(scan, trigger)


def sent_digest(scan: inventory.Scan) -> str:
    return ("full:" if scan.complete else "partial:") + inventory.digest_of(scan.records)


def delivered(outbox_dir: StrPath, item: dict[str, Any]) -> None:
    """The sender calls this when the plane has accepted an outbox item (a 2xx): for an
    inventory, its digest becomes the one later sends compare with. Other kinds: nothing."""
    digest = item.get("digest") if item.get("kind") == "inventory" else None
    if not isinstance(digest, str) or not digest:
        return
    try:
        atomic_write_bytes(Path(outbox_dir) / ACCEPTED_FILE, digest.encode("ascii", "replace"), mode=0o600)
    except OSError as exc:  # the inventory was delivered; the next run only sends it once more
        log.warning("cannot record the accepted inventory: %s", exc)


def accepted_digest(outbox_dir: StrPath) -> str | None:
    """The digest of the last inventory the plane accepted; None when none is recorded."""
    try:
        fd = os.open(Path(outbox_dir) / ACCEPTED_FILE, os.O_RDONLY | NOFOLLOW)  # never a planted link
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(256).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text or None
