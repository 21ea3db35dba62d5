"""`caldera run`: the daemon. Wires the loops as threads and handles signals.

Signals (SPEC section 4): the 1st SIGTERM/SIGINT drains (no new commands, the
running one finishes within DRAIN_GRACE, the outbox is flushed for up to 10 s,
a final report goes out); the 2nd cancels the running command; the 3rd exits
at once. SIGHUP (`systemctl reload`) re-reads agent.env and secrets.env
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

from caldera.host import sdnotify
from caldera.daemon.executor import recover
from caldera.daemon.reload import reread
from caldera.daemon.signals import Signals
from caldera.daemon.snapshot import write_snapshot
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
REEXEC = -1  # run()'s answer after a reload that changed the configuration


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
    """0 after a stop, 1 when another daemon runs this agent, REEXEC after a changing reload."""
    lock = StateLock(runtime.paths.state_dir, "daemon")
    if not lock.acquire():
        print(f"caldera run: agent {runtime.paths.name} is already run by pid {lock.holder()}", file=sys.stderr)
        return 1
    signals = Signals()
    signals.install()
    try:
        with lock:
            if not runtime.settings.enabled or runtime.client is None:
                return _run_local(runtime, signals)
            return _run_connected(runtime, signals)
    finally:
        signals.close()


def _run_local(runtime, signals) -> int:
    """CALDERA_AGENT_ENABLED is not true: no control plane; the CLI verbs still work."""
    log.info("control plane disabled (CALDERA_AGENT_ENABLED is not true); staying local "
             "(after editing %s: systemctl reload)", runtime.paths.agent_env)
    write_snapshot(runtime)
    sdnotify.notify("READY=1")
    while signals.count == 0:
        signals.wait(_watchdog_period())
        if signals.take_hup() and reread(runtime):
            sdnotify.notify("RELOADING=1")  # not STOPPING=1: systemd would wait for an exit
            return REEXEC
        sdnotify.notify("WATCHDOG=1")
    sdnotify.notify("STOPPING=1")
    return 0


def _watchdog_period() -> float:
    interval = sdnotify.watchdog_interval()
    return interval / 2 if interval else 3600.0


def _run_connected(runtime, signals) -> int:
    lanes = Lanes(runtime)
    runtime.lanes = lanes
    lanes.start()
    for command in recover(runtime):
        lanes.submit(command)
    threads = start_threads(runtime, lanes)
    log.info("caldera run: agent %s as %s against %s", runtime.paths.name, runtime.agent_id,
             runtime.settings.base_url)
    write_snapshot(runtime)  # `caldera status` works from the moment systemd says started
    sdnotify.notify("READY=1")
    names = [t.name for t in threads]
    outcome = 0
    while signals.count == 0:
        signals.wait(_watchdog_period())
        if signals.take_hup() and reread(runtime):
            outcome = REEXEC
            break
        if signals.count == 0 and alive(runtime, names):
            sdnotify.notify("WATCHDOG=1")
    # RELOADING=1 keeps the unit `reloading` until the restarted daemon's READY=1;
    # STOPPING=1 would make systemd wait for an exit that a reload never does.
    sdnotify.notify("STOPPING=1" if outcome == 0 else "RELOADING=1")
    runtime.draining.set()  # the poller fetches no more commands
    runtime.poll_wakeup.set()
    log.info("stopping: draining (a second signal cancels the running command)")
    _drain(runtime, lanes, signals)
    runtime.shutdown()
    for thread in threads:
        thread.join(FLUSH_ON_STOP + 5)
    _final_flush(runtime)
    runtime.pool.shutdown(wait=False, cancel_futures=True)
    log.info("stopped" if outcome == 0 else "stopped; restarting with the new configuration")
    return outcome


def _drain(runtime, lanes, signals) -> None:
    deadline = time.monotonic() + DRAIN_GRACE
    while not lanes.idle() and time.monotonic() < deadline and signals.count < 2:
        signals.wait(0.2)
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
