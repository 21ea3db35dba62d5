"""Run events to the control plane in batches: `POST /api/v1/agent/runs/{run_id}/events`
(a caldera extension). A plane without the route answers 404 (`client.NotFound`):
posting stops for the run and the events stay in the run log and the finish result.
Other errors keep the batch (bounded) for the next attempt; nothing here blocks the run.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.host.loopguard import LoopGuard
from caldera.protocol.client import ApiError, NotFound
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from caldera.protocol.client import ControlPlaneClient

log = logging.getLogger("caldera.backends")
Note = Callable[[str], None]  # where a posting problem is told (a log line)

BATCH = 100
INTERVAL = 1.0
MAX_PENDING = 2000


def post_events_loop(client: ControlPlaneClient, agent_id: str, run_id: str, pending: list[dict[str, Any]],
                     lock: threading.Lock, stop: threading.Event, note: Note) -> None:
    """Thread body: every INTERVAL (or when stopped) send what is pending, BATCH at a time.
    A batch leaves `pending` only once the plane took it; any failure keeps it for the next
    turn, after a backoff (the plane's errors, said through `note`, or anything else: the guard)."""
    guard = LoopGuard(log, f"run events poster ({run_id})", Backoff())
    delay = INTERVAL
    while True:
        stopping = stop.wait(delay)
        delay = INTERVAL
        try:
            if not _post_pending(client, agent_id, run_id, pending, lock, note):
                return
            guard.ok()
        except ApiError as exc:
            note(f"posting run events failed: {exc}")
        except Exception as exc:  # noqa: BLE001 -- a bug, an auth block: the events wait, the thread goes on
            delay = max(INTERVAL, guard.failed(exc))
        if stopping:
            return


def _post_pending(client: ControlPlaneClient, agent_id: str, run_id: str, pending: list[dict[str, Any]],
                  lock: threading.Lock, note: Note) -> bool:
    """Send what is pending, BATCH at a time; False when the plane has no such route."""
    while True:
        with lock:
            batch = pending[:BATCH]
        if not batch:
            return True
        try:
            client.post_run_events(run_id, {"agent_id": agent_id, "run_id": run_id, "events": batch})
        except NotFound:
            note("the control plane has no run-events endpoint: events stay in the run log")
            return False
        with lock:
            del pending[:len(batch)]


class EventPoster:
    """A sink listener plus its thread; `close()` flushes once more and joins."""

    def __init__(self, client: ControlPlaneClient, agent_id: str, run_id: str, note: Note):
        self.pending: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.dropped = 0
        self.thread = threading.Thread(target=post_events_loop, name=f"run-events-{run_id}", daemon=True,
                                       args=(client, agent_id, run_id, self.pending, self.lock, self.stop, note))
        self.thread.start()

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.pending.append(event)
            if len(self.pending) > MAX_PENDING:  # the plane is away: keep the newest
                del self.pending[0]
                self.dropped += 1

    def close(self, timeout: float = 10.0) -> None:
        self.stop.set()
        self.thread.join(timeout)
