"""Where fetched commands run: the main lane (one command at a time) and the
runs lane (code-agent turns, which can take long, one at a time), each a
thread fed by a queue.Queue and ended by a None sentinel."""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from caldera.daemon.executor import Executor
from caldera.protocol.command import Command, parse_command

log = logging.getLogger("caldera.lanes")
RUN_TYPES = ("agent_run",)


class LanesClosed(RuntimeError):
    """submit() after close(): the runtime is stopping and takes no more work."""


def lane_worker(executor: Executor, work: queue.Queue[Command | None], busy: threading.Event,
                cancel: threading.Event, on_idle: Callable[[], None]) -> None:
    while True:
        command = work.get()
        if command is None:
            return
        busy.set()
        try:
            if command.local:
                run_local(executor, command, cancel)
            else:
                executor.execute(command, cancel)
        except Exception:  # noqa: BLE001 -- the lane must survive a bug in one command
            log.exception("command %s could not be settled", command.id)
        finally:
            busy.clear()
            on_idle()


def run_local(executor: Executor, command: Command, cancel: threading.Event) -> None:
    """A command the runtime gave itself (a desired config revision): no start/finish."""
    status, _, error = executor.run_handler(command, cancel)
    log.info("local %s: %s%s", command.type, status, f": {error}" if error else "")


class Lanes:
    def __init__(self, executor: Executor, on_idle: Callable[[], None]):
        self.executor, self.on_idle = executor, on_idle
        self.cancel = threading.Event()  # the second SIGTERM: cancel what runs
        self.refused = 0  # commands offered after close (counted: `caldera status`, the report's health)
        self._queues: dict[str, queue.Queue[Command | None]] = {"main": queue.Queue(), "runs": queue.Queue()}
        self._busy = {name: threading.Event() for name in self._queues}
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._lock = threading.Lock()
        self._desired_seen: set[Any] = set()

    def start(self) -> None:
        for name, work in self._queues.items():
            thread = threading.Thread(target=lane_worker, name=f"lane-{name}",
                                      args=(self.executor, work, self._busy[name], self.cancel, self.on_idle))
            thread.start()
            self._threads.append(thread)

    def submit(self, command: Command) -> None:
        """Queue a command; raises LanesClosed once close() began (nothing is queued then)."""
        lane = "runs" if command.type in RUN_TYPES else "main"
        with self._lock:
            if self._closed:
                self.refused += 1
                raise LanesClosed(f"command {command.id} offered after the lanes closed")
            if lane == "main":
                self._busy["main"].set()  # busy from now, so the poller waits
            self._queues[lane].put(command)

    def desired_revision(self, revision_id: int) -> None:
        """The heartbeat names a config revision we do not run: apply it (once per id)."""
        if revision_id in self._desired_seen:
            return
        self._desired_seen.add(revision_id)
        try:
            self.submit(parse_command({"id": f"desired-{revision_id}", "command_type": "apply_config_revision",
                                       "payload": {"revision_id": revision_id}, "timeout_seconds": 120}, local=True))
        except LanesClosed:
            self._desired_seen.discard(revision_id)  # the next runtime sees it again

    def ready(self) -> bool:
        return not self._busy["main"].is_set() and self._queues["main"].empty()

    def idle(self) -> bool:
        return all(q.empty() for q in self._queues.values()) and not any(b.is_set() for b in self._busy.values())

    def close(self, timeout: float | None = None) -> bool:
        """Send the sentinels and join; True when every lane ended in time."""
        with self._lock:
            self._closed = True
            for work in self._queues.values():
                work.put(None)
        for thread in self._threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads)
