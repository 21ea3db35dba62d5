"""Where fetched commands run: the main lane (one command at a time) and the
runs lane (code-agent turns, which can take long, one at a time), each a
thread fed by a queue.Queue and ended by a None sentinel."""
from __future__ import annotations

import logging
import queue
import threading

from caldera.daemon.executor import execute

log = logging.getLogger("caldera.daemon.lanes")
RUN_TYPES = ("agent_run",)


def lane_worker(runtime, work: queue.Queue, busy: threading.Event, cancel: threading.Event, on_idle) -> None:
    while True:
        command = work.get()
        if command is None:
            return
        busy.set()
        try:
            if command.get("local"):
                run_local(runtime, command, cancel)
            else:
                execute(runtime, command, cancel)
        except Exception:  # noqa: BLE001 -- the lane must survive a bug in one command
            log.exception("command %s could not be settled", command.get("id"))
        finally:
            busy.clear()
            on_idle()


def run_local(runtime, command: dict, cancel) -> None:
    """A command the runtime gave itself (a desired config revision): no start/finish."""
    from caldera.daemon.executor import run_handler

    status, _, error = run_handler(runtime, command, cancel)
    log.info("local %s: %s%s", command.get("command_type"), status, f": {error}" if error else "")


class Lanes:
    def __init__(self, runtime):
        self.runtime = runtime
        self.cancel = threading.Event()  # the second SIGTERM: cancel what runs
        self._queues = {"main": queue.Queue(), "runs": queue.Queue()}
        self._busy = {name: threading.Event() for name in self._queues}
        self._threads = []

    def start(self) -> None:
        for name, work in self._queues.items():
            thread = threading.Thread(target=lane_worker, name=f"lane-{name}",
                                      args=(self.runtime, work, self._busy[name], self.cancel,
                                            self.runtime.poll_wakeup.set))
            thread.start()
            self._threads.append(thread)

    def submit(self, command: dict) -> None:
        lane = "runs" if command.get("command_type") in RUN_TYPES else "main"
        if lane == "main":
            self._busy["main"].set()  # busy from now, so the poller waits
        self._queues[lane].put(command)

    def ready(self) -> bool:
        return not self._busy["main"].is_set() and self._queues["main"].empty()

    def idle(self) -> bool:
        return all(q.empty() for q in self._queues.values()) and not any(b.is_set() for b in self._busy.values())

    def close(self, timeout: float | None = None) -> bool:
        """Send the sentinels and join; True when every lane ended in time."""
        for work in self._queues.values():
            work.put(None)
        for thread in self._threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads)
