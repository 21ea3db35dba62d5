"""The durable outbox: what must reach the control plane at least once.

One JSON file per item in `<state>/outbox/`, named by a sequence number. An item
is written (atomically) before anyone relies on it being sent and deleted only
after the server took it. Send order: results first (starts and finishes, in
the order they were queued, so a command's start goes before its finish), then
inventories.

A delivery that fails for one item only (a 5xx or a 4xx the plane may stop
giving) holds that item back with its own backoff, written into the item
(`retry`: attempts, next try, the reason), so the hold survives a restart and
never stops the items behind it. `held()` lists them for `caldera status` and
the state report's health. Items that can never be taken (404 for that command,
a 400 after the body was cut to what the server accepts) move to
`outbox/rejected/` with the reason: kept for the operator, counted.

Bounded at 10,000 items or 64 MiB: past that the oldest inventories go first;
finish results are never dropped.

A write that fails raises (nothing was stored) and goes into the `StorageHealth`
record; a finish delivered while its `.finishes-delivered` record cannot be written
for want of space stays on disk (skipped until the record is written): deleting it
would let a kill -9 before the journal's last write finish its command twice. Which
state a command is in is daemon/life.py's to say; this file keeps the records it reads.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.host import jsonlimits
from caldera.host.fsutil import NOFOLLOW, atomic_write_bytes, ensure_dir
from caldera.host.storage import StorageHealth
from caldera.host.timefmt import rfc3339
from caldera.protocol.payloads import finite

if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("caldera.protocol.outbox")

MAX_ITEMS = 10_000
MAX_BYTES = 64 * 1024 * 1024
DELIVERED = ".finishes-delivered"  # the command ids of the last finishes the plane took
DELIVERED_KEPT = 256
DELIVERED_MAX_BYTES = 64 * 1024  # 256 ids with room; a larger file is not ours
STALE_TEMP = 600.0  # seconds: a temp file this old is an atomic write cut short by a crash
DROPPABLE = ("inventory",)  # superseded by a newer one; never "finish" or "start"
FIRST = ("start", "finish")  # results go before everything else
REASON_CAP = 500
# A delivered record that cannot be written for these keeps its finish on disk (it is the
# state dir's file system failing, not something planted at the record's name).
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


def _encode(doc: dict[str, Any]) -> bytes:
    try:
        return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:  # a NaN from a handler: stored as null, never sent (Go's decoder refuses it)
        return json.dumps(finite(doc), separators=(",", ":"), allow_nan=False).encode()


def _kind_of(name: str) -> str:
    return name.split("-", 1)[1].removesuffix(".json") if "-" in name else ""


class Outbox:
    def __init__(self, directory: str | os.PathLike[str], max_items: int = MAX_ITEMS, max_bytes: int = MAX_BYTES,
                 wakeup: threading.Event | None = None, clock: Callable[[], float] = time.time,
                 storage: StorageHealth | None = None):
        self.dir = ensure_dir(directory)
        self.storage = storage or StorageHealth()
        self._unrecorded: dict[str, str] = {}  # delivered finishes whose record waits for space: name -> id
        self._holds: dict[str, dict[str, Any]] = {}  # retry records the disk refused: name -> record
        self.max_items, self.max_bytes = max_items, max_bytes
        self._lock = threading.Lock()
        self._clock = clock
        self.wakeup = wakeup or threading.Event()  # set on every put: the sender's wake-up
        self.dropped = 0
        self.rejected = 0
        names = self._names()
        self._seq = int(names[-1].split("-")[0]) if names else 0
        self._sweep_stale_temps()

    def _sweep_stale_temps(self) -> None:
        """A kill -9 or a power cut during an atomic write leaves `.NAME.XXXX.tmp` behind; the
        item itself was never written (its command is settled by the journal). Only old ones
        go: `report --once` opens the outbox beside a running daemon before it takes the lock,
        and a write in progress is seconds old at most."""
        cutoff = time.time() - STALE_TEMP
        for name in os.listdir(self.dir):
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    if os.lstat(self.dir / name).st_mtime < cutoff:
                        os.unlink(self.dir / name)
                except FileNotFoundError:
                    continue
                except OSError as exc:  # e.g. a directory of that name: not ours to remove
                    log.warning("outbox: left %s in place: %s", name, exc.strerror or exc)

    def _names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.dir) if n.endswith(".json") and n[0].isdigit())

    def put(self, kind: str, item: dict[str, Any]) -> str:
        """Store one item durably; returns its name."""
        data = _encode({"kind": kind, **item})
        with self._lock:
            self._seq += 1
            name = f"{self._seq:012d}-{kind}.json"
            self._write(name, data)
            self._enforce_bounds()
        self.wakeup.set()
        return name

    def _write(self, name: str, data: bytes) -> None:
        """One durable item (under the lock); a failure is raised and goes into the storage record."""
        try:
            atomic_write_bytes(self.dir / name, data, mode=0o600)
        except OSError as exc:
            self.storage.failed(self.dir / name, exc)
            raise
        self.storage.ok()

    def names_in_send_order(self) -> list[str]:
        self._record_unrecorded()
        names = [n for n in self._names() if n not in self._unrecorded]
        return [n for n in names if _kind_of(n) in FIRST] + [n for n in names if _kind_of(n) not in FIRST]

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(name, item) in send order; an unreadable file is moved aside, not lost."""
        for name in self.names_in_send_order():
            try:
                with open(self.dir / name, "rb") as fh:
                    item = json.loads(fh.read())
            except FileNotFoundError:
                self._holds.pop(name, None)
                continue
            except ValueError:
                log.error("outbox item %s is not JSON; moved to outbox/rejected/", name)
                self.reject(name, "the stored item is not JSON")
                continue
            held = self._holds.get(name)
            yield name, ({**item, "retry": held} if held and isinstance(item, dict) else item)

    def record_delivered(self, name: str, command_id: str) -> bool:
        """Record that the plane took finish `name` of `command_id` (daemon/life.delivered, which
        then lets the item go); False when the record waits for space: the item is kept (not
        sent again) until it is written. Something else at the record's name only costs a
        redundant finish after a restart: True, so that it never holds a finish up."""
        with self._lock:
            try:
                self._write_delivered([command_id])
            except OSError as exc:
                if exc.errno in STORAGE_ERRNOS:
                    self._unrecorded[name] = command_id
                    self.storage.failed(self.dir / DELIVERED, exc)
                    log.warning("finish %s was delivered but cannot be recorded (%s); kept until it can be",
                                name, exc.strerror or exc)
                    return False
                log.warning("could not record that finish %s was delivered (%s); a restart now could "
                            "finish command %s once more", name, exc.strerror or exc, command_id)
        return True

    def _write_delivered(self, command_ids: list[str]) -> None:
        """Put `command_ids` at the head of the delivered record (under the lock). Raises OSError."""
        ids = command_ids + [i for i in self._delivered_ids() if i not in command_ids]
        atomic_write_bytes(self.dir / DELIVERED, json.dumps(ids[:DELIVERED_KEPT]).encode(), mode=0o600)
        self.storage.ok()

    def _record_unrecorded(self) -> None:
        """Record the delivered finishes kept for want of space, then let them go; still kept
        while the record cannot be written."""
        with self._lock:
            if not self._unrecorded:
                return
            try:
                self._write_delivered(list(self._unrecorded.values()))
            except OSError as exc:
                self.storage.failed(self.dir / DELIVERED, exc)
                return
            names, self._unrecorded = list(self._unrecorded), {}
            for name in names:
                try:
                    os.unlink(self.dir / name)
                except FileNotFoundError:
                    pass
        log.info("recorded %d delivered finish(es) kept while the state dir was full", len(names))

    def _delivered_ids(self) -> list[str]:
        """The record's ids as strings (the journal keys commands by their id as a string);
        [] when it is missing or unusable: a planted fifo, link, directory or huge file is
        refused, never waited on or read whole."""
        try:
            fd = os.open(self.dir / DELIVERED, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file")
                raw = fh.read(DELIVERED_MAX_BYTES + 1)
            ids = jsonlimits.loads(raw, max_bytes=DELIVERED_MAX_BYTES, what=DELIVERED)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("outbox: %s is unusable (%s); starting it again", DELIVERED,
                        getattr(exc, "strerror", None) or exc)
            return []
        if not isinstance(ids, list):
            return []
        return [str(i) for i in ids if isinstance(i, (str, int)) and not isinstance(i, bool)]

    def done(self, name: str) -> None:
        with self._lock:
            try:
                os.unlink(self.dir / name)
            except FileNotFoundError:
                pass

    def rewrite(self, name: str, item: dict[str, Any]) -> bool:
        """Replace a waiting item (a body cut to size, its retry record); False when it is gone
        (delivered or superseded meanwhile): a gone item is never brought back."""
        with self._lock:
            if not (self.dir / name).exists():
                return False
            self._write(name, _encode(item))
            return True

    def hold(self, name: str, item: dict[str, Any], reason: str, delay: float) -> dict[str, Any]:
        """Hold one item back for `delay` seconds after a failed delivery; the record goes into
        the item itself (it survives a restart). Returns the retry record."""
        previous = item.get("retry") or {}
        retry = {"attempts": int(previous.get("attempts") or 0) + 1,
                 "next_at": self._clock() + delay, "reason": reason[:REASON_CAP],
                 "since": previous.get("since") or rfc3339()}
        for gone in [n for n in self._holds if not (self.dir / n).exists()]:  # delivered, rejected, dropped
            self._holds.pop(gone, None)
        try:
            self.rewrite(name, {**item, "retry": retry})
            self._holds.pop(name, None)
        except OSError as exc:
            # A full disk: the record is kept in memory, so the item still backs off (a restart
            # forgets it; the item itself is whole on disk).
            self._holds[name] = retry
            log.debug("outbox item %s: its retry record was not written (%s)", name, exc.strerror or exc)
        return retry

    def due(self, item: dict[str, Any]) -> bool:
        return float((item.get("retry") or {}).get("next_at") or 0) <= self._clock()

    def next_try_in(self) -> float | None:
        """Seconds until the earliest held-back item may be tried again; None when none is held."""
        times = [float((item.get("retry") or {}).get("next_at") or 0) for _, item in self.items()]
        times = [t for t in times if t]
        return max(0.0, min(times) - self._clock()) if times else None

    def reject(self, name: str, reason: str = "") -> None:
        """Move an item the plane can never take to outbox/rejected/, with the reason."""
        rejected = ensure_dir(self.dir / "rejected")
        with self._lock:
            try:
                os.replace(self.dir / name, rejected / name)
            except FileNotFoundError:
                return
            self.rejected += 1
        if reason:
            try:
                (rejected / (name.removesuffix(".json") + ".reason")).write_text(reason[:REASON_CAP] + "\n")
            except OSError as exc:
                log.warning("could not write why %s was rejected: %s", name, exc)

    def depth(self) -> int:
        return len(self._names())

    def held(self) -> list[dict[str, Any]]:
        return held_items(self.dir)

    def has_finish(self, command_id: int | str) -> bool:
        """A finish for this command is waiting here or was taken by the plane."""
        return str(command_id) in self.finish_ids()

    def finish_ids(self) -> set[str]:
        """The command ids (as text) whose finish is waiting here or was taken by the plane."""
        # The outbox first, the delivered record after: the sender writes the record before it
        # removes the item, so a delivery between the two looks is seen by one of them.
        ids = {str(item.get("command_id")) for _, item in self.items() if item.get("kind") == "finish"}
        return ids | set(self._unrecorded.values()) | set(self._delivered_ids())

    def _enforce_bounds(self) -> None:
        names = self._names()
        sizes = {n: (self.dir / n).stat().st_size for n in names}
        total = sum(sizes.values())
        for name in list(names):
            if len(names) <= self.max_items and total <= self.max_bytes:
                return
            if _kind_of(name) in DROPPABLE:
                os.unlink(self.dir / name)
                names.remove(name)
                total -= sizes[name]
                self.dropped += 1
        if len(names) > self.max_items or total > self.max_bytes:
            log.warning("outbox over its bound (%d items, %d bytes) with only results left; keeping them",
                        len(names), total)


def held_items(directory: str | os.PathLike[str], limit: int = 20) -> list[dict[str, Any]]:
    """The items held back after a failed delivery: what, how often tried, why (no bodies)."""
    out: list[dict[str, Any]] = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json") and n[0].isdigit())
    except FileNotFoundError:
        return out
    for name in names:
        try:
            with open(Path(directory) / name, "rb") as fh:
                item = json.loads(fh.read())
        except (OSError, ValueError):
            continue
        retry = item.get("retry") if isinstance(item, dict) else None
        if not retry:
            continue
        out.append({"item": name, "kind": item.get("kind"), "command_id": item.get("command_id"),
                    "attempts": retry.get("attempts"), "since": retry.get("since"),
                    "next_try_at": rfc3339(retry.get("next_at")), "reason": retry.get("reason")})
        if len(out) >= limit:
            break
    return out


def outbox_health(outbox: Outbox) -> dict[str, Any]:
    """The state report's health entry for the outbox: only when something is held back or
    was rejected (`{"outbox": {...}}`), else nothing."""
    held = outbox.held()
    if not held and not outbox.rejected:
        return {}
    return {"outbox": {"level": "degraded" if held else "ok", "waiting": outbox.depth(),
                       "held_back": [{k: h[k] for k in ("kind", "command_id", "attempts", "since", "reason")}
                                     for h in held[:10]],
                       "rejected": outbox.rejected}}


def outbox_depth(state_dir: str | os.PathLike[str]) -> int:
    """For `caldera status`: items waiting, without taking the daemon's lock."""
    try:
        return sum(1 for n in os.listdir(Path(state_dir) / "outbox") if n.endswith(".json"))
    except FileNotFoundError:
        return 0


def rejected_count(state_dir: str | os.PathLike[str]) -> int:
    try:
        return sum(1 for n in os.listdir(Path(state_dir) / "outbox" / "rejected") if n.endswith(".json"))
    except FileNotFoundError:
        return 0
