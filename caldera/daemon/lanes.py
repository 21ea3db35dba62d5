"""Where fetched commands run: three lanes, each a thread fed by a queue.Queue and ended
by a None sentinel, each running its commands one at a time in the order they came.

  controls  pause, resume, run_now, settings_get/set, log_list, agent_interrupt: short
            adapter verbs the operator expects at once; they never wait behind slow work
  runs      agent_run (code-agent turns, which can take long)
  main      everything else (skill transfers, log_get, revisions, system info, ...)

The poller keeps fetching while no control is pending, holding fetched main commands in the
main lane's queue (a backlog of at most MAIN_BACKLOG beside the running one, each journaled at
fetch), so a control queued behind a slow command and any number of other main commands up to
that bound reaches its lane (docs/runtime.md, "Lanes").
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from caldera.daemon.life import Life
from caldera.host.loopguard import LoopGuard
from caldera.protocol.command import Command, parse_command
from caldera.protocol.retry import Backoff

log = logging.getLogger("caldera.lanes")
RUN_TYPES = ("agent_run",)
CONTROL_TYPES = ("pause", "resume", "run_now", "settings_get", "settings_set", "log_list", "agent_interrupt")
MAIN_BACKLOG = 32  # main commands fetched ahead (waiting) while one runs
LANE_BACKOFF = (1, 2, 5, 10)  # after a command that raised: short, so that the lane is back soon after the fault


class LanesClosed(RuntimeError):
    """submit() after close(): the runtime is stopping and takes no more work."""


def lane_of(command: Command) -> str:
    if command.local:
        return "main"
    return "runs" if command.type in RUN_TYPES else "controls" if command.type in CONTROL_TYPES else "main"


def lane_worker(life: Life, work: queue.Queue[Command | None], done: Callable[[], None],
                cancel: threading.Event, closing: threading.Event | None = None) -> None:
    """One lane: its commands in order, each handed to its life (`Life.run`, which settles one
    that raises). The exception is logged (once while the same error repeats), the pending
    count given back whatever happens (the poller waits on it), and the lane backs off before
    the next one (`closing` ends the wait: the lanes are closing)."""
    guard = LoopGuard(log, f"lane {threading.current_thread().name}", Backoff(LANE_BACKOFF))
    pause = closing or threading.Event()
    while True:
        command = work.get()
        if command is None:
            return
        delay = 0.0
        try:
            if command.local:
                run_local(life, command, cancel)
            else:
                life.run(command, cancel)
            guard.ok()
        except Exception as exc:  # noqa: BLE001 -- the lane must survive a bug in one command (settled by its life)
            delay = guard.failed(exc)
        finally:
            try:
                done()
            except Exception:  # noqa: BLE001 -- nor a bug in its wake-up
                log.exception("lane wake-up failed")
        if delay:
            pause.wait(delay)


def run_local(life: Life, command: Command, cancel: threading.Event) -> None:
    """A command the runtime gave itself (a desired config revision): no life (no journal,
    start or finish), only its handler."""
    status, _, error = life.executor.run_handler(command, cancel)
    log.info("local %s: %s%s", command.type, status, f": {error}" if error else "")


class Lanes:
    def __init__(self, life: Life, on_idle: Callable[[], None]):
        self.life, self.on_idle = life, on_idle
        self.cancel = threading.Event()  # the second SIGTERM: cancel what runs
        self.closing = threading.Event()  # close() began: a lane backing off after a failure goes on
        self.refused = 0  # commands offered after close (counted: `caldera status`, the report's health)
        self._queues: dict[str, queue.Queue[Command | None]] = {
            "main": queue.Queue(), "controls": queue.Queue(), "runs": queue.Queue()}
        self._pending = dict.fromkeys(self._queues, 0)  # submitted and not yet settled, per lane
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._lock = threading.Lock()
        self._desired_seen: set[Any] = set()

    def start(self) -> None:
        for name, work in self._queues.items():
            thread = threading.Thread(target=lane_worker, name=f"lane-{name}",
                                      args=(self.life, work, self._done_callback(name), self.cancel, self.closing))
            thread.start()
            self._threads.append(thread)

    def _done_callback(self, lane: str) -> Callable[[], None]:
        def done() -> None:
            with self._lock:
                self._pending[lane] -= 1
            self.on_idle()

        return done

    def submit(self, command: Command) -> None:
        """Queue a command; raises LanesClosed once close() began (nothing is queued then)."""
        lane = lane_of(command)
        with self._lock:
            if self._closed:
                self.refused += 1
                raise LanesClosed(f"command {command.id} offered after the lanes closed")
            self._pending[lane] += 1  # counted from now, so the poller waits
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
        """Whether the poller may fetch: no control pending, and room in the main backlog
        (the running command plus at most MAIN_BACKLOG waiting), so that a control the plane
        holds behind several main commands is still fetched while the first of them runs."""
        with self._lock:
            return self._pending["controls"] == 0 and self._pending["main"] <= MAIN_BACKLOG

    def idle(self) -> bool:
        with self._lock:
            return not any(self._pending.values())

    def close(self, timeout: float | None = None) -> bool:
        """Send the sentinels and join; True when every lane ended in time."""
        with self._lock:
            self._closed = True
            self.closing.set()
            for work in self._queues.values():
                work.put(None)
        for thread in self._threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads)
