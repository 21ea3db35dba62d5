"""`caldera run`: the daemon. Starts the loops as threads and handles signals.

Signals (SPEC section 4): the 1st SIGTERM/SIGINT drains (no new commands, the
running one finishes within DRAIN_GRACE, the outbox is flushed for up to 10 s,
a final report says `stopping`); the 2nd cancels the running command; the 3rd
exits at once. SIGHUP (`systemctl reload`) re-reads agent.env and secrets.env
(caldera.daemon.reload): unchanged, it lifts a blocked auth path; changed, the
daemon stops as on SIGTERM and `run` returns REEXEC, on which `caldera run`
restarts itself in place. The handlers only count (caldera.daemon.signals); the
main thread acts. An intended stop exits 0 so that systemd does not fight it.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

from caldera.daemon.executor import executor_for
from caldera.daemon.heartbeat import ConnectionStatus, heartbeat_loop
from caldera.daemon.lanes import Lanes
from caldera.daemon.poller import poll_loop
from caldera.daemon.reload import reread
from caldera.daemon.reporter import report_loop
from caldera.daemon.sender import flush, sender_loop
from caldera.daemon.signals import Signals
from caldera.daemon.snapshot import write_snapshot
from caldera.daemon.wiring import Parts
from caldera.host import sdnotify
from caldera.host.fsutil import StateLock
from caldera.skills.watcher import skills_loop

log = logging.getLogger("caldera.daemon")

DRAIN_GRACE = 30.0
FLUSH_ON_STOP = 10.0
LIVENESS = 90.0  # a loop silent for longer than this stops the watchdog pings
REEXEC = -1  # run()'s answer after a reload that changed the configuration


def start_threads(parts: Parts, lanes: Lanes, executor) -> list[threading.Thread]:
    """One thread per loop, each given the few parts it uses."""
    client, wake, live, redactor = parts.client, parts.wake, parts.live, parts.redactor
    status = ConnectionStatus(parts.state, redactor, parts.auth, on_recovery=wake.outbox.set)
    bodies = [
        ("heartbeat", heartbeat_loop, (client, parts.auth, parts.reports, status, wake, live,
                                       lanes.desired_revision)),
        ("reporter", report_loop, (client, parts.reports, wake, live, lambda: parts.settings.report_interval,
                                   redactor, lambda: write_snapshot(parts))),
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
    """0 after a stop, 1 when another daemon runs this agent, REEXEC after a changing reload."""
    lock = StateLock(parts.paths.state_dir, "daemon")
    if not lock.acquire():
        print(f"caldera run: agent {parts.paths.name} is already run by pid {lock.holder()}", file=sys.stderr)
        return 1
    signals = Signals()
    signals.install()
    try:
        with lock:
            if not parts.settings.enabled or parts.client is None:
                return _run_local(parts, signals)
            return _run_connected(parts, signals)
    finally:
        signals.close()


def _run_local(parts: Parts, signals: Signals) -> int:
    """CALDERA_AGENT_ENABLED is not true: no control plane; the CLI verbs still work."""
    log.info("control plane disabled (CALDERA_AGENT_ENABLED is not true); staying local "
             "(after editing %s: systemctl reload)", parts.paths.agent_env)
    write_snapshot(parts)
    agent = start_agent_supervisor(parts)
    sdnotify.notify("READY=1")
    while signals.count == 0:
        signals.wait(_watchdog_period())
        if signals.take_hup() and reread(parts):
            sdnotify.notify("RELOADING=1")  # not STOPPING=1: systemd would wait for an exit
            stop_agent_supervisor(agent)  # the restarted runtime starts it again, with the new env
            return REEXEC
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


def _run_connected(parts: Parts, signals: Signals) -> int:
    executor = executor_for(parts)
    lanes = Lanes(executor, on_idle=parts.wake.poll.set)
    parts.live.count_drops("lanes", lambda: lanes.refused)
    lanes.start()
    for command in executor.recover():
        lanes.submit(command)
    agent = start_agent_supervisor(parts)
    threads = start_threads(parts, lanes, executor)
    log.info("caldera run: agent %s as %s against %s", parts.paths.name, parts.identity.agent_id,
             parts.settings.base_url)
    write_snapshot(parts)  # `caldera status` works from the moment systemd says started
    sdnotify.notify("READY=1")
    names = [t.name for t in threads]
    outcome = 0
    while signals.count == 0:
        signals.wait(_watchdog_period())
        if signals.take_hup() and reread(parts):
            outcome = REEXEC
            break
        if signals.count == 0 and parts.live.alive(names, LIVENESS):
            sdnotify.notify("WATCHDOG=1")
    # RELOADING=1 keeps the unit `reloading` until the restarted daemon's READY=1;
    # STOPPING=1 would make systemd wait for an exit that a reload never does.
    sdnotify.notify("STOPPING=1" if outcome == 0 else "RELOADING=1")
    stop_agent_supervisor(agent)  # the agent first: SIGTERM stops it gracefully (a reload restarts it)
    parts.wake.draining.set()  # the poller fetches no more commands
    parts.wake.poll.set()
    log.info("stopping: draining (a second signal cancels the running command)")
    _drain(lanes, signals)
    parts.wake.shutdown()
    for thread in threads:
        thread.join(FLUSH_ON_STOP + 5)
    _final_flush(parts)
    parts.pool.shutdown(wait=False, cancel_futures=True)
    log.info("stopped" if outcome == 0 else "stopped; restarting with the new configuration")
    return outcome


def _drain(lanes: Lanes, signals: Signals) -> None:
    deadline = time.monotonic() + DRAIN_GRACE
    while not lanes.idle() and time.monotonic() < deadline and signals.count < 2:
        signals.wait(0.2)
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
