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

from caldera.daemon.executor import executor_for
from caldera.daemon.heartbeat import ConnectionStatus, send_heartbeat
from caldera.daemon.poller import fetch_one
from caldera.daemon.sender import flush
from caldera.daemon.wiring import Parts

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


def report_once(parts: Parts, deadline: float) -> int:
    executor = executor_for(parts)
    client, redactor = parts.client, parts.redactor
    status = ConnectionStatus(parts.state, redactor, parts.auth)
    cancel = threading.Event()  # a command still running at the deadline is cancelled
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), cancel.set)
    timer.daemon = True
    timer.start()
    try:
        section = parts.reports.section()  # once: the heartbeat and the report both carry it
        status.ok(send_heartbeat(client, parts.reports, parts.state, parts.wake, _ignore_desired))
        client.state_report(parts.reports.state_report(section))
    except Exception as exc:  # noqa: BLE001 -- said on stderr, exit 1, outbox kept
        status.error(exc)
        print(f"caldera report: not delivered: {redactor(str(exc))}", file=sys.stderr)
        return 1
    try:
        # No watcher here: one scan per run, sent only when it differs from what the plane
        # last accepted (skills/publish.py), so an unchanged host costs the plane nothing.
        parts.publisher.scan_and_send_if_changed("startup")
        ran = _run_commands(parts, executor, cancel, deadline)
        if ran:  # commands changed the state: report it once more (else the first report stands)
            client.state_report(parts.reports.state_report())
    except Exception as exc:  # noqa: BLE001 -- the report itself was delivered
        log.warning("after the report: %s (kept for the next run: %d in the outbox)",
                    redactor(str(exc)), parts.outbox.depth())
    finally:
        timer.cancel()
        parts.pool.shutdown(wait=False, cancel_futures=True)
    return 0


def _run_commands(parts: Parts, executor, cancel: threading.Event, deadline: float) -> int:
    """Recovered commands first, then what the plane has, until the deadline; how many ran."""
    ran = 0
    for command in executor.recover():
        executor.execute(command, cancel)
        ran += 1
    flush(parts.client, parts.outbox, parts.wake.stop, deadline=deadline)
    while time.monotonic() < deadline:
        command = fetch_one(parts.client, executor)
        if command is None:
            break
        executor.execute(command, cancel)
        ran += 1
        flush(parts.client, parts.outbox, parts.wake.stop, deadline=deadline)
    return ran


def _ignore_desired(revision_id) -> None:
    """A one-shot run applies no revision from a heartbeat hint: the plane sends the command."""
