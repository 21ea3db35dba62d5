"""Run events to the control plane while the turn runs: `POST /api/v1/agent/runs/{run_id}/events`
(a caldera extension; docs/plane.md, "Runs").

Bounded in size and rate: a post carries at most BATCH_EVENTS events and about BATCH_BYTES of
JSON, posts are at least GAP_SECONDS apart, and the first event of a quiet spell waits
LINGER_SECONDS for the ones that follow it. Nothing lost: a batch leaves memory only once the
plane took it; while the plane is away at most MAX_PENDING events (and about MAX_PENDING_BYTES
of them) wait in memory, and the ones
after them are read back from the run log (which has every event) once there is room, so a
plane that comes back gets every event, in seq order. After the turn the poster goes on trying
for AFTER_END_SECONDS. The plane keeps one event per seq, so a batch sent again (its answer
lost) is harmless.

A plane without the route (ClawManager: 404) is asked once per client, which is once per
runtime process, and then left alone; the log says so once.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

from caldera.host.loopguard import LoopGuard
from caldera.protocol.client import NotFound
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from caldera.protocol.client import ControlPlaneClient

log = logging.getLogger("caldera.backends")
Note = Callable[[str], None]  # where a posting problem is told (a log line)
Event = dict[str, Any]

BATCH_EVENTS = 500
BATCH_BYTES = 512 * 1024
GAP_SECONDS = 0.25
LINGER_SECONDS = 0.1
MAX_PENDING = 2000
MAX_PENDING_BYTES = 8 * 1024 * 1024  # 2,000 diffs of 64 KiB would be 127 MiB: spill past this
AFTER_END_SECONDS = 600.0
LOG_LINE_MAX = 256 * 1024  # an event line of the run log is at most a 64 KiB diff, JSON-escaped
NO_ROUTE_SENTENCE = ("the control plane has no run-events endpoint (404): run events are not posted to it again "
                     "until the runtime restarts; they stay in the run logs and the finish results")

_without_route: weakref.WeakSet[Any] = weakref.WeakSet()  # the clients whose plane answered 404
_without_route_lock = threading.Lock()


def plane_takes_events(client: Any) -> bool:
    """False once this client's plane answered that it has no run-events route."""
    with _without_route_lock:
        return client not in _without_route


def _no_route(client: Any, note: Note) -> None:
    with _without_route_lock:
        first = client not in _without_route
        _without_route.add(client)
    if first:
        note(NO_ROUTE_SENTENCE)


class EventPoster:
    """A sink listener plus its thread. `close()` says the turn ended: the thread posts what is
    left (reading the closed run log for what memory did not keep) and ends, waited for up to
    `timeout`; a plane still away is tried on in the background for AFTER_END_SECONDS."""

    def __init__(self, client: ControlPlaneClient, agent_id: str, run_id: str, note: Note,
                 log_file: str | os.PathLike[str] | None = None, dropped: Callable[[int], None] | None = None):
        self.client, self.agent_id, self.run_id, self.note = client, agent_id, run_id, note
        self.pending: list[Event] = []  # seq order; every seq <= kept_upto is posted or here
        self.pending_bytes = 0  # about the JSON size of `pending`
        self.kept_upto = 0  # every event up to this seq was posted or is pending
        self.latest = 0  # the highest seq the sink handed over
        self.spilled = False  # events after kept_upto are only in the run log
        self.dropped = 0
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.ended = threading.Event()
        self._log_file = log_file
        self._log_offset = _size(log_file)  # a run id used again appends to its old log: skip that part
        self._count_dropped = dropped
        self._pause = threading.Event()  # never set: the wait between two posts
        self.thread = threading.Thread(target=self._loop, name=f"run-events-{run_id}", daemon=True)
        self.thread.start()

    def __call__(self, event: Event) -> None:
        seq = event.get("seq")
        with self.lock:
            if isinstance(seq, int):
                self.latest = max(self.latest, seq)
            if self.spilled or len(self.pending) >= MAX_PENDING or self.pending_bytes >= MAX_PENDING_BYTES:
                self.spilled = True  # the run log has it; read back when there is room
            else:
                self.pending.append(event)
                self.pending_bytes += _json_size(event)
                if isinstance(seq, int):
                    self.kept_upto = max(self.kept_upto, seq)
        self.wake.set()

    def close(self, timeout: float = 10.0) -> None:
        self.ended.set()
        self.wake.set()
        self.thread.join(timeout)

    # ---- the thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        guard = LoopGuard(log, f"run events poster ({self.run_id})", Backoff())
        ended_at: float | None = None
        while True:
            if self.ended.is_set() and ended_at is None:
                ended_at = time.monotonic()
            try:
                has_work = self._has_work()
            except Exception as exc:  # noqa: BLE001 -- reading the run log back: the events wait, the thread goes on
                self._pause.wait(max(GAP_SECONDS, guard.failed(exc)))
                continue
            if not has_work:
                if ended_at is not None:
                    return
                self.wake.wait()
                self.wake.clear()
                self.ended.wait(LINGER_SECONDS)  # let the events that follow join the first
                continue
            if ended_at is not None and time.monotonic() - ended_at > AFTER_END_SECONDS:
                self._give_up()
                return
            delay = GAP_SECONDS
            try:
                if not self._post_one():
                    return
                guard.ok()
            except Exception as exc:  # noqa: BLE001 -- the plane away, a bug, an auth block: the events wait
                delay = max(GAP_SECONDS, guard.failed(exc))  # said once while it repeats, backed off
            self._pause.wait(delay)  # the whole gap, even when the turn just ended: the rate bound holds

    def _has_work(self) -> bool:
        with self.lock:
            if self.pending:
                return True
            spilled = self.spilled
        if spilled:
            self._refill()
            with self.lock:
                return bool(self.pending)
        return False

    def _post_one(self) -> bool:
        """One batch to the plane; False when the plane has no such route."""
        with self.lock:
            batch = _bounded(self.pending)
        try:
            self.client.post_run_events(self.run_id, {"agent_id": self.agent_id, "run_id": self.run_id,
                                                      "events": batch})
        except NotFound:
            _no_route(self.client, self.note)
            return False
        with self.lock:
            del self.pending[:len(batch)]
            self.pending_bytes = max(0, self.pending_bytes - sum(_json_size(event) for event in batch))
        return True

    def _refill(self) -> None:
        """Events after kept_upto, read back from the run log (as far as it was written), into memory."""
        with self.lock:
            room, after = MAX_PENDING - len(self.pending), self.kept_upto
            room_bytes = MAX_PENDING_BYTES - self.pending_bytes
        found, offset = _read_events(self._log_file, self._log_offset, after, room, room_bytes)
        with self.lock:
            for event in found:
                if event.get("seq") == self.kept_upto + 1:
                    self.pending.append(event)
                    self.pending_bytes += _json_size(event)
                    self.kept_upto += 1
            self._log_offset = offset
            if self.kept_upto >= self.latest:
                self.spilled = False
            elif not found and self.ended.is_set():
                self._lost(self.latest - self.kept_upto)  # past the run log's cap: nowhere to read them
                self.spilled = False

    def _give_up(self) -> None:
        with self.lock:
            left = len(self.pending) + (self.latest - self.kept_upto if self.spilled else 0)
            self.pending.clear()
            self.pending_bytes = 0
        self.note(f"the control plane took no run events for {AFTER_END_SECONDS:.0f} s after the turn: "
                  f"{left} events of run {self.run_id} stay in its run log only")
        self._lost(left)

    def _lost(self, count: int) -> None:
        self.dropped += count
        if self._count_dropped is not None and count:
            self._count_dropped(count)


def _bounded(pending: list[Event]) -> list[Event]:
    """The first events of `pending`: at most BATCH_EVENTS and about BATCH_BYTES (one at least)."""
    size = 0
    for index, event in enumerate(pending[:BATCH_EVENTS]):
        size += _json_size(event)
        if size > BATCH_BYTES and index > 0:
            return pending[:index]
    return pending[:BATCH_EVENTS]


def _json_size(event: Event) -> int:
    return len(json.dumps(event, ensure_ascii=False, separators=(",", ":"), default=str))


def _size(path: str | os.PathLike[str] | None) -> int:
    try:
        return os.stat(path).st_size if path is not None else 0
    except OSError:
        return 0


def _read_events(path: str | os.PathLike[str] | None, offset: int, after: int, most: int,
                 most_bytes: int = MAX_PENDING_BYTES) -> tuple[list[Event], int]:
    """Up to `most` events (about `most_bytes` of lines, one at least) with seq > `after` from the
    run log's `event` lines at or past `offset` (whole lines only), and the offset after the last
    line read. A line longer than LOG_LINE_MAX (a backend's stdout line can be 32 MiB) is skipped
    to its newline: only a partial line at the end of the file stops the reading."""
    if path is None or most <= 0:
        return [], offset
    found: list[Event] = []
    size = 0
    try:
        with _open_log(path) as fh:
            fh.seek(offset)
            while len(found) < most and (size < most_bytes or not found):
                line = fh.readline(LOG_LINE_MAX)
                if not line.endswith(b"\n"):
                    if len(line) < LOG_LINE_MAX:
                        break  # the writer's buffer holds the rest of it: next time
                    skipped = _skip_line(fh)
                    if skipped is None:
                        break  # a long line still being written: from its start next time
                    offset += len(line) + skipped
                    continue
                offset += len(line)
                parts = line.split(b" ", 2)
                if len(parts) == 3 and parts[1] == b"event":
                    event = _event(parts[2])
                    if event is not None and isinstance(event.get("seq"), int) and event["seq"] > after:
                        found.append(event)
                        size += len(line)
    except OSError:
        pass
    return found, offset


def _open_log(path: str | os.PathLike[str]) -> BinaryIO:
    """The run log, never through a symlink planted in its place."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")


def _skip_line(fh: BinaryIO) -> int | None:
    """Bytes read up to and including the next newline; None at the end of the file before one."""
    skipped = 0
    while True:
        chunk = fh.readline(LOG_LINE_MAX)
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            return skipped
        if len(chunk) < LOG_LINE_MAX:
            return None


def _event(raw: bytes) -> Event | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
