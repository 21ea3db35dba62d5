"""`caldera run`: the daemon. Wires the loops as threads and handles signals.

Signals (SPEC section 4): the 1st SIGTERM/SIGINT drains (no new commands, the
running one finishes within DRAIN_GRACE, the outbox is flushed for up to 10 s,
a final report goes out); the 2nd cancels the running command; the 3rd exits
at once. SIGHUP lifts a blocked auth path (the configuration may be fixed).
An intended stop exits 0 so that systemd does not fight it.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from caldera.host import sdnotify
from caldera.daemon.executor import recover
from caldera.host.fsutil import StateLock
from caldera.daemon.lanes import Lanes
from caldera.daemon.heartbeat import heartbeat_loop
from caldera.daemon.poller import poll_loop
from caldera.daemon.reporter import report_loop, send_report
from caldera.daemon.sender import flush, sender_loop

log = logging.getLogger("caldera.daemon.run")

DRAIN_GRACE = 30.0
FLUSH_ON_STOP = 10.0
LIVENESS = 90.0  # a loop silent for longer than this stops the watchdog pings


class Signals:
    """Counts SIGTERM/SIGINT; the main thread acts on the count."""

    def __init__(self, runtime, lanes):
        self.runtime, self.lanes, self.count = runtime, lanes, 0
        self.event = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._hup)

    def _stop(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            self.runtime.draining.set()
            self.runtime.poll_wakeup.set()
        elif self.count == 2:
            self.lanes.cancel.set()
        else:
            os._exit(0)
        self.event.set()

    def _hup(self, signum, frame) -> None:
        if self.runtime.auth is not None:
            self.runtime.auth.unblock()
            self.runtime.heartbeat_wakeup.set()


def start_threads(runtime, lanes) -> list[threading.Thread]:
    bodies = [("heartbeat", heartbeat_loop, (runtime,)), ("reporter", report_loop, (runtime,)),
              ("poller", poll_loop, (runtime, lanes)), ("sender", sender_loop, (runtime,))]
    skills = _skills_loop()
    if skills is not None:
        bodies.append(("skills", skills, (runtime,)))
    threads = []
    for name, body, args in bodies:
        thread = threading.Thread(target=body, name=name, args=args)
        thread.start()
        threads.append(thread)
    return threads


def _skills_loop():
    try:
        from caldera.skills.watcher import skills_loop
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("caldera.skills"):
            return None  # skills support not installed in this tree
        raise
    return skills_loop


def alive(runtime, names) -> bool:
    now = time.monotonic()
    return all(now - runtime.ticks.get(name, now) < LIVENESS for name in names)


def run(runtime) -> int:
    lock = StateLock(runtime.paths.state_dir, "daemon")
    if not lock.acquire():
        print(f"caldera run: agent {runtime.paths.name} is already run by pid {lock.holder()}", file=sys.stderr)
        return 1
    with lock:
        if not runtime.settings.enabled or runtime.client is None:
            return _run_local(runtime)
        return _run_connected(runtime)


def _run_local(runtime) -> int:
    """CALDERA_AGENT_ENABLED is not true: no control plane; the CLI verbs still work."""
    log.info("control plane disabled (CALDERA_AGENT_ENABLED is not true); staying local")
    signals = Signals(runtime, Lanes(runtime))
    signals.install()
    agent = start_agent_supervisor(runtime)
    sdnotify.notify("READY=1")
    while signals.count == 0:
        signals.event.wait(_watchdog_period())
        sdnotify.notify("WATCHDOG=1")
    sdnotify.notify("STOPPING=1")
    stop_agent_supervisor(agent)
    return 0


def start_agent_supervisor(runtime):
    """Process mode: the supervisor thread and the CLI's control socket; None otherwise."""
    if not hasattr(runtime.driver, "supervise"):
        return None
    from caldera.agents.process.control import ControlServer

    stop = threading.Event()
    thread = threading.Thread(target=runtime.driver.supervise, args=(stop,), name="supervisor")
    thread.start()
    server = ControlServer(runtime.driver, runtime.paths.state_dir, runtime.redactor)
    server.start()
    return stop, thread, server


def stop_agent_supervisor(agent) -> None:
    """The agent first (SIGTERM to the runtime stops it gracefully), then the control socket."""
    if agent is None:
        return
    stop, thread, server = agent
    log.info("stopping the agent")
    stop.set()
    thread.join()
    server.close()


def _watchdog_period() -> float:
    interval = sdnotify.watchdog_interval()
    return interval / 2 if interval else 3600.0


def _run_connected(runtime) -> int:
    lanes = Lanes(runtime)
    runtime.lanes = lanes
    signals = Signals(runtime, lanes)
    signals.install()
    lanes.start()
    for command in recover(runtime):
        lanes.submit(command)
    agent = start_agent_supervisor(runtime)
    threads = start_threads(runtime, lanes)
    log.info("caldera run: agent %s as %s against %s", runtime.paths.name, runtime.agent_id,
             runtime.settings.base_url)
    sdnotify.notify("READY=1")
    names = [t.name for t in threads]
    while signals.count == 0:
        signals.event.wait(_watchdog_period() if sdnotify.watchdog_interval() else 3600.0)
        if signals.count == 0 and alive(runtime, names):
            sdnotify.notify("WATCHDOG=1")
    sdnotify.notify("STOPPING=1")
    stop_agent_supervisor(agent)
    log.info("stopping: draining (a second signal cancels the running command)")
    _drain(runtime, lanes, signals)
    runtime.shutdown()
    for thread in threads:
        thread.join(FLUSH_ON_STOP + 5)
    _final_flush(runtime)
    runtime.pool.shutdown(wait=False, cancel_futures=True)
    log.info("stopped")
    return 0


def _drain(runtime, lanes, signals) -> None:
    deadline = time.monotonic() + DRAIN_GRACE
    while not lanes.idle() and time.monotonic() < deadline and signals.count < 2:
        signals.event.clear()
        signals.event.wait(0.2)
    if not lanes.idle():
        lanes.cancel.set()
        log.warning("cancelling the running command")
    lanes.close(timeout=10.0)


def _final_flush(runtime) -> None:
    deadline = time.monotonic() + FLUSH_ON_STOP
    try:
        flush(runtime, deadline=deadline)
    except Exception as exc:  # noqa: BLE001 -- kept in the outbox for next time
        log.warning("outbox not flushed before stop (%d kept): %s", runtime.outbox.depth(),
                    runtime.redactor(str(exc)))
    try:
        runtime.last_section = {**runtime.last_section, "runtime": {**runtime.last_section["runtime"],
                                                                    "runtime_status": "stopping"}}
        send_report(runtime)
    except Exception as exc:  # noqa: BLE001
        log.warning("final state report not delivered: %s", runtime.redactor(str(exc)))
