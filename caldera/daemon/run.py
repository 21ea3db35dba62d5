"""`caldera run`: the daemon. Starts the loops as threads and handles signals.

Signals (SPEC section 4): the 1st SIGTERM/SIGINT drains (no new commands, the
running one finishes within DRAIN_GRACE, the outbox is flushed for up to 10 s,
a final report says `stopping`); the 2nd cancels the running command; the 3rd
exits at once. SIGHUP lifts a blocked auth path (the configuration may be
fixed). An intended stop exits 0 so that systemd does not fight it.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from caldera.daemon.executor import executor_for
from caldera.daemon.heartbeat import ConnectionStatus, heartbeat_loop
from caldera.daemon.lanes import Lanes
from caldera.daemon.poller import poll_loop
from caldera.daemon.reporter import report_loop
from caldera.daemon.sender import flush, sender_loop
from caldera.daemon.wiring import Parts
from caldera.host import sdnotify
from caldera.host.fsutil import StateLock
from caldera.skills.watcher import skills_loop

log = logging.getLogger("caldera.daemon")

DRAIN_GRACE = 30.0
FLUSH_ON_STOP = 10.0
LIVENESS = 90.0  # a loop silent for longer than this stops the watchdog pings


class Signals:
    """Counts SIGTERM/SIGINT; the main thread acts on the count."""

    def __init__(self, wake, lanes: Lanes | None, auth=None):
        self.wake, self.lanes, self.auth, self.count = wake, lanes, auth, 0
        self.event = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._hup)

    def _stop(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            self.wake.draining.set()
            self.wake.poll.set()
        elif self.count == 2 and self.lanes is not None:
            self.lanes.cancel.set()
        elif self.count > 2:
            os._exit(0)
        self.event.set()

    def _hup(self, signum, frame) -> None:
        if self.auth is not None:
            self.auth.unblock()
            self.wake.heartbeat.set()


def start_threads(parts: Parts, lanes: Lanes, executor) -> list[threading.Thread]:
    """One thread per loop, each given the few parts it uses."""
    client, wake, live, redactor = parts.client, parts.wake, parts.live, parts.redactor
    status = ConnectionStatus(parts.state, redactor, parts.auth, on_recovery=wake.outbox.set)
    bodies = [
        ("heartbeat", heartbeat_loop, (client, parts.auth, parts.reports, status, wake, live,
                                       lanes.desired_revision)),
        ("reporter", report_loop, (client, parts.reports, wake, live, lambda: parts.settings.report_interval,
                                   redactor)),
        ("poller", poll_loop, (client, parts.auth, executor, lanes, wake, live)),
        ("sender", sender_loop, (client, parts.outbox, wake, live, redactor)),
        ("skills", skills_loop, (parts.publisher, wake, live)),
    ]
    threads = []
    for name, body, args in bodies:
        thread = threading.Thread(target=body, name=name, args=args)
        thread.start()
        threads.append(thread)
    return threads


def run(parts: Parts) -> int:
    lock = StateLock(parts.paths.state_dir, "daemon")
    if not lock.acquire():
        print(f"caldera run: agent {parts.paths.name} is already run by pid {lock.holder()}", file=sys.stderr)
        return 1
    with lock:
        if not parts.settings.enabled or parts.client is None:
            return _run_local(parts)
        return _run_connected(parts)


def _run_local(parts: Parts) -> int:
    """CALDERA_AGENT_ENABLED is not true: no control plane; the CLI verbs still work."""
    log.info("control plane disabled (CALDERA_AGENT_ENABLED is not true); staying local")
    signals = Signals(parts.wake, None)
    signals.install()
    agent = start_agent_supervisor(parts)
    sdnotify.notify("READY=1")
    while signals.count == 0:
        signals.event.wait(_watchdog_period())
        sdnotify.notify("WATCHDOG=1")
    sdnotify.notify("STOPPING=1")
    stop_agent_supervisor(agent)
    return 0


def start_agent_supervisor(parts):
    """Process mode: the supervisor thread and the CLI's control socket; None otherwise."""
    driver = parts.current.driver
    if not hasattr(driver, "supervise"):
        return None
    from caldera.agents.process.control import ControlServer

    stop = threading.Event()
    thread = threading.Thread(target=driver.supervise, args=(stop,), name="supervisor")
    thread.start()
    server = ControlServer(driver, parts.paths.state_dir, parts.redactor)
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


def _run_connected(parts: Parts) -> int:
    executor = executor_for(parts)
    lanes = Lanes(executor, on_idle=parts.wake.poll.set)
    parts.live.count_drops("lanes", lambda: lanes.refused)
    signals = Signals(parts.wake, lanes, parts.auth)
    signals.install()
    lanes.start()
    for command in executor.recover():
        lanes.submit(command)
    agent = start_agent_supervisor(parts)
    threads = start_threads(parts, lanes, executor)
    log.info("caldera run: agent %s as %s against %s", parts.paths.name, parts.identity.agent_id,
             parts.settings.base_url)
    sdnotify.notify("READY=1")
    names = [t.name for t in threads]
    while signals.count == 0:
        signals.event.wait(_watchdog_period())
        if signals.count == 0 and parts.live.alive(names, LIVENESS):
            sdnotify.notify("WATCHDOG=1")
    sdnotify.notify("STOPPING=1")
    stop_agent_supervisor(agent)
    log.info("stopping: draining (a second signal cancels the running command)")
    _drain(lanes, signals)
    parts.wake.shutdown()
    for thread in threads:
        thread.join(FLUSH_ON_STOP + 5)
    _final_flush(parts)
    parts.pool.shutdown(wait=False, cancel_futures=True)
    log.info("stopped")
    return 0


def _drain(lanes: Lanes, signals: Signals) -> None:
    deadline = time.monotonic() + DRAIN_GRACE
    while not lanes.idle() and time.monotonic() < deadline and signals.count < 2:
        signals.event.clear()
        signals.event.wait(0.2)
    if not lanes.idle():
        lanes.cancel.set()
        log.warning("cancelling the running command")
    lanes.close(timeout=10.0)


def _final_flush(parts: Parts) -> None:
    deadline = time.monotonic() + FLUSH_ON_STOP
    try:
        flush(parts.client, parts.outbox, parts.wake.stop, deadline=deadline)
    except Exception as exc:  # noqa: BLE001 -- kept in the outbox for next time
        log.warning("outbox not flushed before stop (%d kept): %s", parts.outbox.depth(), parts.redactor(str(exc)))
    try:
        parts.live.mark_stopping()
        parts.client.state_report(parts.reports.state_report(parts.live.last_section))
    except Exception as exc:  # noqa: BLE001
        log.warning("final state report not delivered: %s", parts.redactor(str(exc)))
