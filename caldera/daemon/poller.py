"""The command poll loop: every poll interval (from register, default 5 s) and
at once when a heartbeat says `has_pending_command`.

A command is fetched while the lanes have room (caldera.daemon.lanes: no control
pending, at most one main command beside the running one), so a `pause` queued
behind a slow `log_get` is fetched and runs in the controls lane at once; it is
journaled before it is handed on: the server never hands it out again.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from caldera.daemon.executor import Executor
from caldera.daemon.lanes import Lanes, LanesClosed
from caldera.daemon.live import LiveStatus
from caldera.daemon.wakeups import Wakeups, wait_any
from caldera.protocol.command import Command, MalformedCommand, parse_command
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.session import Auth

log = logging.getLogger("caldera.poller")
DEFAULT_INTERVAL = 5.0


def fetch_one(client: ControlPlaneClient, executor: Executor) -> Command | None:
    """Fetch the next command, parse it and journal it; None when there is none, or when
    it cannot be named (then it can be neither started nor finished: it is logged)."""
    raw, too_large = client.next_command()
    if not raw:
        return None
    try:
        command = parse_command(raw, too_large=too_large)
    except MalformedCommand as exc:
        log.error("control plane sent an unusable command (%s): %r", exc, executor.redactor(raw))
        return None
    executor.journal_fetched(command)
    log.info("command %s (%s) received", command.id, command.type)
    return command


def poll_interval(auth: Auth) -> float:
    info = auth.info  # None until the first call registers
    return info.poll_interval if info else DEFAULT_INTERVAL


def poll_loop(client: ControlPlaneClient, auth: Auth, executor: Executor, lanes: Lanes, wake: Wakeups,
              live: LiveStatus) -> None:
    backoff = Backoff()
    while not wake.stop.is_set() and not wake.draining.is_set():
        live.tick("poller")
        if not lanes.ready():
            wait_any(wake.stop, wake.poll, poll_interval(auth))
            continue
        try:
            command = fetch_one(client, executor)
            backoff.reset()
        except Exception as exc:  # noqa: BLE001 -- logged, retried with backoff
            log.debug("command poll failed: %s", executor.redactor(str(exc)))
            wait_any(wake.stop, wake.poll, backoff.after(exc))
            continue
        if command is not None:
            try:
                lanes.submit(command)
            except LanesClosed:  # stopping: the journal keeps it, the next start executes it
                log.info("command %s kept for the next start (stopping)", command.id)
                return
            continue  # there may be more: ask again as soon as the lane is free
        wait_any(wake.stop, wake.poll, poll_interval(auth))
