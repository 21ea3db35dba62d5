"""`caldera report --once [--deadline S]`: for hosts too small for a daemon (cron).

Register if needed, heartbeat, one full state report, flush the outbox, run
pending commands until the deadline, final report. It takes the agent's lock:
beside a running daemon it says so and exits 0 (the daemon reports); beside
another `report --once` it waits for the lock until its deadline. Exit 0 when
the report was delivered, 1 when not (nothing is lost: results stay in the
outbox for the next run).
"""
from __future__ import annotations

import logging
import sys
import threading
import time


log = logging.getLogger("caldera.report")
LOCK_POLL = 0.2


def take_lock(lock, deadline: float, stop: threading.Event) -> str | None:
    """None when taken; else why not ('daemon' or a timeout)."""
    while True:
        if lock.acquire():
            return None
        holder = lock.holder() or ""
        if holder.endswith(" daemon"):
            return "daemon"
        if time.monotonic() >= deadline:
            return f"timed out waiting for {holder}"
        stop.wait(LOCK_POLL)


def report_once(runtime, deadline: float) -> int:
    from caldera.daemon.executor import execute, recover
    from caldera.daemon.heartbeat import ConnectionStatus, send_heartbeat
    from caldera.daemon.poller import fetch_one
    from caldera.daemon.reporter import send_report
    from caldera.daemon.sender import flush
    from caldera.skills.publish import scan_and_send

    status = ConnectionStatus(runtime)
    cancel = threading.Event()  # a command still running at the deadline is cancelled
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), cancel.set)
    timer.daemon = True
    timer.start()
    try:
        section = runtime.agent_section()  # once: the heartbeat and the report both carry it
        status.ok(send_heartbeat(runtime))
        send_report(runtime, section)
    except Exception as exc:  # noqa: BLE001 -- said on stderr, exit 1, outbox kept
        status.error(exc)
        print(f"caldera report: not delivered: {runtime.redactor(str(exc))}", file=sys.stderr)
        return 1
    try:
        scan_and_send(runtime, "startup")  # no watcher here: one full inventory per run (outbox)
        ran = 0
        for command in recover(runtime):
            execute(runtime, command, cancel)
            ran += 1
        flush(runtime, deadline=deadline)
        while time.monotonic() < deadline:
            command = fetch_one(runtime)
            if command is None:
                break
            execute(runtime, command, cancel)
            ran += 1
            flush(runtime, deadline=deadline)
        if ran:  # commands changed the state: report it once more (else the first report stands)
            send_report(runtime)
    except Exception as exc:  # noqa: BLE001 -- the report itself was delivered
        log.warning("after the report: %s (kept for the next run: %d in the outbox)",
                    runtime.redactor(str(exc)), runtime.outbox.depth())
    finally:
        timer.cancel()
        runtime.pool.shutdown(wait=False, cancel_futures=True)
    return 0
