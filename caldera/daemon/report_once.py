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
from typing import Any

from caldera.daemon.heartbeat import ConnectionStatus, send_heartbeat
from caldera.daemon.life import Life, life_for
from caldera.daemon.poller import fetch_one
from caldera.daemon.reporter import MIN_SPACING
from caldera.daemon.sender import flush
from caldera.daemon.wiring import Parts, close_servers
from caldera.errors import Retryable
from caldera.host.fsutil import StateLock
from caldera.protocol.client import ControlPlaneClient

log = logging.getLogger("caldera.report")
LOCK_POLL = 0.2


def take_lock(lock: StateLock, deadline: float, stop: threading.Event) -> str | None:
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
    """Every request is bounded by `deadline` (the client's `within`): it returns by then
    even while the server hangs or trickles."""
    client, _ = parts.connection()
    with client.within(deadline):
        return _report_once(parts, client, deadline)


def _report_once(parts: Parts, client: ControlPlaneClient, deadline: float) -> int:
    life = life_for(parts)
    redactor = parts.redactor
    status = ConnectionStatus(parts.state, redactor, parts.auth)
    cancel = threading.Event()  # a command still running at the deadline is cancelled
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), cancel.set)
    timer.daemon = True
    timer.start()
    try:
        section = parts.reports.section()  # once: the heartbeat and the report both carry it
        status.ok(send_heartbeat(client, parts.reports, parts.state, parts.wake, _ignore_desired))
        _send_report(parts, client, section)
    except Exception as exc:  # noqa: BLE001 -- said on stderr, exit 1, outbox kept
        status.error(exc)
        print(f"caldera report: not delivered: {redactor(str(exc))}", file=sys.stderr)
        return 1
    try:
        # No watcher here: one scan per run, sent only when it differs from what the plane
        # last accepted (skills/publish.py), so an unchanged host costs the plane nothing.
        parts.publisher.scan_and_send_if_changed("startup")
        ran = _run_commands(parts, client, life, cancel, deadline)
        # commands changed the state: report it once more (else the first report stands), when the
        # 2 s floor still leaves time before the deadline (else the next run reports it)
        if ran and time.monotonic() + MIN_SPACING < deadline:
            _send_report(parts, client)
    except Exception as exc:  # noqa: BLE001 -- the report itself was delivered
        log.warning("after the report: %s (kept for the next run: %d in the outbox)",
                    redactor(str(exc)), parts.outbox.depth())
    finally:
        timer.cancel()
        close_servers(parts)  # a backend's server (OpenCode's) ends with the commands that used it
        parts.pool.shutdown(wait=False, cancel_futures=True)
    return 0


def _send_report(parts: Parts, client: ControlPlaneClient, section: dict[str, Any] | None = None) -> None:
    body, _ = parts.reports.send(client, parts.wake.stop, section)  # the one 2 s floor
    if body is None:
        raise Retryable("stopped before the report was sent")


def _run_commands(parts: Parts, client: ControlPlaneClient, life: Life, cancel: threading.Event,
                  deadline: float) -> int:
    """Recovered commands first, then what the plane has, until the deadline; how many ran."""
    ran = 0
    for command in life.recover():
        life.run(command, cancel, deadline)
        ran += 1
    flush(client, parts.outbox, parts.wake.stop, deadline=deadline)
    while time.monotonic() < deadline:
        fetched = fetch_one(client, life, parts.wake.stop, deadline)
        if fetched is None:
            break
        life.run(fetched, cancel, deadline)
        ran += 1
        flush(client, parts.outbox, parts.wake.stop, deadline=deadline)
    return ran


def _ignore_desired(revision_id: int) -> None:
    """A one-shot run applies no revision from a heartbeat hint: the plane sends the command."""
