"""The command poll loop: every poll interval (from register, default 5 s) and
at once when a heartbeat says `has_pending_command`.

A command is fetched only when the main lane is free (one command at a time;
agent runs have their own lane so `agent_interrupt` can still arrive), and it
is journaled before it is handed on: the server never hands it out again.
"""
from __future__ import annotations

import logging

from caldera.protocol.retry import Backoff
from caldera.daemon.executor import journal_fetched
from caldera.daemon.wakeups import wait_any

log = logging.getLogger("caldera.poller")
DEFAULT_INTERVAL = 5.0


def fetch_one(runtime) -> dict | None:
    """Fetch the next command and journal it; None when there is none."""
    command = runtime.client.next_command()
    if not command:
        return None
    if not isinstance(command, dict) or command.get("id") is None:
        log.error("control plane sent a command without an id: %r", runtime.redactor(command))
        return None
    journal_fetched(runtime, command)
    log.info("command %s (%s) received", command["id"], command.get("command_type"))
    return command


def _interval(runtime) -> float:
    info = runtime.auth.info  # None until the first call registers
    return info.poll_interval if info else DEFAULT_INTERVAL


def poll_loop(runtime, lanes) -> None:
    backoff = Backoff()
    while not runtime.stop.is_set() and not runtime.draining.is_set():
        runtime.tick("poller")
        if not lanes.ready():
            wait_any(runtime.stop, runtime.poll_wakeup, _interval(runtime))
            continue
        try:
            command = fetch_one(runtime)
            backoff.reset()
        except Exception as exc:  # noqa: BLE001 -- logged, retried with backoff
            log.debug("command poll failed: %s", runtime.redactor(str(exc)))
            delay = backoff.next_delay(getattr(exc, "retry_after", None) or getattr(exc, "retry_in", None))
            wait_any(runtime.stop, runtime.poll_wakeup, delay)
            continue
        if command is not None:
            lanes.submit(command)
            continue  # there may be more: ask again as soon as the lane is free
        wait_any(runtime.stop, runtime.poll_wakeup, _interval(runtime))
