"""The command poll loop: every poll interval (from register, default 5 s) and
at once when a heartbeat says `has_pending_command`.

A command is fetched while the lanes have room (caldera.daemon.lanes: no control
pending, at most one main command beside the running one), so a `pause` queued
behind a slow `log_get` is fetched and runs in the controls lane at once. What it
fetches it hands to the command's life (daemon/life.py: `Life.take` journals it, or
refuses it), then the journaled command to a lane: the server never hands it out again.

What cannot be journaled is not taken (issue 26): while a durable write fails (the
`StorageHealth` record) nothing is fetched, so commands wait at the plane, `pending`
and in order; before each fetch then, state.json is written as it is, the cheap
probe of whether there is space again. A fetch that races the disk filling (the
plane handed the command out, the journal refused it) has its life finish that
command `failed` at once, directly through the client (the outbox is on the same
disk), saying that it was not run and why, retried until the plane takes it, and
nothing is fetched meanwhile. The loop's body survives any exception (a logged line and a backoff).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from caldera.daemon.lanes import Lanes, LanesClosed
from caldera.daemon.life import Life
from caldera.daemon.live import LiveStatus
from caldera.daemon.wakeups import Wakeups, wait_any
from caldera.errors import CalderaError
from caldera.host.loopguard import LoopGuard
from caldera.protocol.client import CutShort
from caldera.protocol.command import Command, MalformedCommand, parse_command
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable

    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.session import Auth

log = logging.getLogger("caldera.poller")
DEFAULT_INTERVAL = 5.0


def fetch_one(client: ControlPlaneClient, life: Life, stop: threading.Event | None = None,
              deadline: float | None = None, tick: Callable[[], None] = lambda: None) -> Command | None:
    """Fetch the next command, parse it and hand it to its life (`Life.take`: journaled, or
    refused); the journaled command to hand to a lane, or None: none, one that cannot be named
    (then it can be neither started nor finished: it is logged), or one its life did not take."""
    raw, too_large = client.next_command()
    if not raw:
        return None
    try:
        command = parse_command(raw, too_large=too_large)
    except MalformedCommand as exc:
        log.error("control plane sent an unusable command (%s): %r", exc, life.redactor(raw))
        return None
    return command if life.take(command, stop, deadline, tick) else None


def poll_interval(auth: Auth) -> float:
    info = auth.info  # None until the first call registers
    return info.poll_interval if info else DEFAULT_INTERVAL


def storage_refuses(life: Life) -> bool:
    """While a durable write fails: whether state.json still cannot be written (written as it
    is: the probe clears the record when it succeeds). False at once while writes succeed."""
    if not life.state.storage.failing:
        return False
    try:
        life.state.flush()
    except OSError:
        return True
    return False


def poll_loop(client: ControlPlaneClient, auth: Auth, life: Life, lanes: Lanes, wake: Wakeups,
              live: LiveStatus) -> None:
    backoff = Backoff()
    # Its own backoff: a turn that fails in the plane's way backs off on `backoff` and is a good turn here.
    guard = LoopGuard(log, "command poll", Backoff(), redact=life.redactor)
    while not wake.stop.is_set() and not wake.draining.is_set():
        try:
            delay = poll_once(client, auth, life, lanes, wake, live, backoff)
            guard.ok()
        except LanesClosed as exc:  # stopping: the journal keeps it, the next start executes it
            log.info("%s; kept for the next start (stopping)", exc)
            return
        except Exception as exc:  # noqa: BLE001 -- a bug: logged with its traceback, retried with backoff
            delay = guard.failed(exc)
        if delay > 0:
            wait_any(wake.stop, wake.poll, delay)


def poll_once(client: ControlPlaneClient, auth: Auth, life: Life, lanes: Lanes, wake: Wakeups,
              live: LiveStatus, backoff: Backoff) -> float:
    """One turn: fetch and hand on one command; returns the wait before the next turn (0: at once)."""
    live.tick("poller")
    if not lanes.ready() or storage_refuses(life):
        return poll_interval(auth)
    try:
        command = fetch_one(client, life, wake.stop, tick=lambda: live.tick("poller"))
    except CutShort as exc:  # asked, and no whole answer: a command it held is the plane's, never seen here
        log.warning("command poll got no whole answer (%s): a command the plane handed out in it, if any, "
                    "is lost (the plane gives a command out once)", life.redactor(str(exc)))
        return backoff.after(exc)
    except CalderaError as exc:  # the plane or the network: the heartbeat says so, this retries quietly
        log.debug("command poll failed: %s", life.redactor(str(exc)))
        return backoff.after(exc)
    backoff.reset()
    if command is None:
        return poll_interval(auth)
    try:
        lanes.submit(command)  # LanesClosed: poll_loop ends
    except LanesClosed:
        raise
    except Exception as exc:  # a bug handing it on: journaled, so its life settles it now, not at the next start
        life.fault(command, exc)
        raise
    return 0  # there may be more: ask again as soon as the lane is free
