"""The durable outbox: what must reach the control plane at least once.

One JSON file per item in `<state>/outbox/`, named by a sequence number so the
directory's order is the send order. An item is written (atomically) before
anyone relies on it being sent and deleted only after the server took it.
Bounded at 10,000 items or 64 MiB: past that the oldest inventories go
first; finish results are never dropped. Items the server
rejects for good (a 4xx other than 401) move to `outbox/rejected/`: kept for
the operator, not retried for ever.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from caldera.host.fsutil import atomic_write_bytes, ensure_dir

log = logging.getLogger("caldera.protocol.outbox")

MAX_ITEMS = 10_000
MAX_BYTES = 64 * 1024 * 1024
DROPPABLE = ("inventory",)  # superseded by a newer one; never "finish" or "start"


class Outbox:
    def __init__(self, directory, max_items: int = MAX_ITEMS, max_bytes: int = MAX_BYTES,
                 wakeup: threading.Event | None = None):
        self.dir = ensure_dir(directory)
        self.max_items, self.max_bytes = max_items, max_bytes
        self._lock = threading.Lock()
        self.wakeup = wakeup or threading.Event()  # set on every put: the sender's wake-up
        self.dropped = 0
        names = self._names()
        self._seq = int(names[-1].split("-")[0]) if names else 0

    def _names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.dir) if n.endswith(".json") and n[0].isdigit())

    def put(self, kind: str, item: dict) -> str:
        """Store one item durably; returns its name."""
        data = json.dumps({"kind": kind, **item}, separators=(",", ":")).encode()
        with self._lock:
            self._seq += 1
            name = f"{self._seq:012d}-{kind}.json"
            atomic_write_bytes(self.dir / name, data, mode=0o600)
            self._enforce_bounds()
        self.wakeup.set()
        return name

    def items(self):
        """(name, item) in send order; an unreadable file is moved aside, not lost."""
        for name in self._names():
            try:
                with open(self.dir / name, "rb") as fh:
                    yield name, json.loads(fh.read())
            except FileNotFoundError:
                continue
            except ValueError:
                log.error("outbox item %s is not JSON; moved to outbox/rejected/", name)
                self.reject(name)

    def done(self, name: str) -> None:
        try:
            os.unlink(self.dir / name)
        except FileNotFoundError:
            pass

    def reject(self, name: str) -> None:
        rejected = ensure_dir(self.dir / "rejected")
        try:
            os.replace(self.dir / name, rejected / name)
        except FileNotFoundError:
            pass

    def depth(self) -> int:
        return len(self._names())

    def has_finish(self, command_id) -> bool:
        return any(item.get("command_id") == command_id and item.get("kind") == "finish"
                   for _, item in self.items())

    def _enforce_bounds(self) -> None:
        names = self._names()
        sizes = {n: (self.dir / n).stat().st_size for n in names}
        total = sum(sizes.values())
        for name in list(names):
            if len(names) <= self.max_items and total <= self.max_bytes:
                return
            if name.split("-", 1)[1].removesuffix(".json") in DROPPABLE:
                self.done(name)
                names.remove(name)
                total -= sizes[name]
                self.dropped += 1
        if len(names) > self.max_items or total > self.max_bytes:
            log.warning("outbox over its bound (%d items, %d bytes) with only results left; keeping them",
                        len(names), total)


def outbox_depth(state_dir) -> int:
    """For `caldera status`: items waiting, without taking the daemon's lock."""
    try:
        return sum(1 for n in os.listdir(Path(state_dir) / "outbox") if n.endswith(".json"))
    except FileNotFoundError:
        return 0
