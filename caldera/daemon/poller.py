"""The command poll loop: every poll interval (from register, default 5 s) and
at once when a heartbeat says `has_pending_command`.

A command is fetched while the lanes have room (caldera.daemon.lanes: no control
pending, at most one main command beside the running one), so a `pause` queued
behind a slow `log_get` is fetched and runs in the controls lane at once; it is
journaled before it is handed on: the server never hands it out again.

What cannot be journaled is not taken (issue 26): while a durable write fails (the
`StorageHealth` record) nothing is fetched, so commands wait at the plane, `pending`
and in order; before each fetch then, state.json is written as it is, the cheap
probe of whether there is space again. A fetch that races the disk filling (the
plane handed the command out, the journal refused it) finishes that command `failed`
at once, directly through the client (the outbox is on the same disk), saying that
it was not run and why, retried until the plane takes it, and nothing is fetched
meanwhile. The loop's body survives any exception (a logged line and a backoff).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from caldera.daemon.executor import Executor
from caldera.daemon.lanes import Lanes, LanesClosed, settle
from caldera.daemon.live import LiveStatus
from caldera.daemon.wakeups import Wakeups, wait_any
from caldera.errors import CalderaError
from caldera.host.loopguard import LoopGuard
from caldera.host.storage import describe
from caldera.protocol.client import NotFound, Unsendable
from caldera.protocol.command import Command, MalformedCommand, parse_command
from caldera.protocol.payloads import finish_body
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable

    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.session import Auth

log = logging.getLogger("caldera.poller")
DEFAULT_INTERVAL = 5.0


def fetch_one(client: ControlPlaneClient, executor: Executor, stop: threading.Event | None = None,
              deadline: float | None = None, tick: Callable[[], None] = lambda: None) -> Command | None:
    """Fetch the next command, parse it and journal it; None when there is none, when it
    cannot be named (then it can be neither started nor finished: it is logged), or when
    the journal refused it (then it is finished failed, not run: `refuse_unjournaled`,
    which tries until `stop` is set or `deadline` (time.monotonic()) passes, calling `tick`
    on each try: the loop's liveness while it does)."""
    raw, too_large = client.next_command()
    if not raw:
        return None
    try:
        command = parse_command(raw, too_large=too_large)
    except MalformedCommand as exc:
        log.error("control plane sent an unusable command (%s): %r", exc, executor.redactor(raw))
        return None
    try:
        executor.journal_fetched(command)
    except OSError as exc:
        refuse_unjournaled(client, executor, command, exc, stop or threading.Event(), deadline, tick)
        return None
    except Exception as exc:  # a bug in (or after) the journal's write: finished now, not at the next start
        settle(executor, command, exc)
        raise
    log.info("command %s (%s) received", command.id, command.type)
    return command


def unjournaled_reason(exc: OSError, path: object) -> str:
    return (f"not run: the runtime could not record the command before running it ({describe(exc)}: {path}); "
            "the control plane hands a command out once, so it is finished failed rather than lost")


def refuse_unjournaled(client: ControlPlaneClient, executor: Executor, command: Command, exc: OSError,
                       stop: threading.Event, deadline: float | None,
                       tick: Callable[[], None] = lambda: None) -> bool:
    """Finish a command the journal refused `failed` (never run), straight through the client:
    retried with backoff until the plane takes it, the outbox takes it (the sender then
    delivers it), `stop` is set or `deadline` passes. True when settled."""
    reason = unjournaled_reason(exc, executor.state.path)
    log.error("command %s (%s) %s", command.id, command.type, reason)
    body = finish_body(executor.agent_id, "failed", {}, reason)
    backoff = Backoff()
    while True:
        tick()  # a plane away as well may keep this up for minutes: the watchdog must not take it for a hang
        try:
            client.finish_command(command.id, body)
            log.warning("command %s finished failed (not run: it could not be recorded)", command.id)
            return True
        except (NotFound, Unsendable) as refused:
            if isinstance(refused, Unsendable) or refused.from_server:  # the plane never takes it: nothing to do
                log.error("command %s: its failed finish is refused for good (%s)", command.id, refused)
                return True
            failure: Exception = refused
        except Exception as other:  # noqa: BLE001 -- the plane is away or failed: retried
            failure = other
        if _outbox_takes(executor, command, body):
            return True
        delay = backoff.after(failure)
        if deadline is not None and time.monotonic() + delay > deadline or stop.wait(delay):
            log.error("command %s: its failed finish did not reach the plane before the stop (%s); the plane "
                      "keeps it dispatched", command.id, executor.redactor(str(failure)))
            return False


def _outbox_takes(executor: Executor, command: Command, body: dict[str, object]) -> bool:
    """The finish into the outbox, if space came back meanwhile: the sender delivers it."""
    try:
        executor.outbox.put("finish", {"command_id": command.id, "command_type": command.type, "body": body})
    except OSError:
        return False
    log.warning("command %s: its failed finish (not run) is in the outbox", command.id)
    return True


def poll_interval(auth: Auth) -> float:
    info = auth.info  # None until the first call registers
    return info.poll_interval if info else DEFAULT_INTERVAL


def storage_refuses(executor: Executor) -> bool:
    """While a durable write fails: whether state.json still cannot be written (written as it
    is: the probe clears the record when it succeeds). False at once while writes succeed."""
    if not executor.state.storage.failing:
        return False
    try:
        executor.state.flush()
    except OSError:
        return True
    return False


def poll_loop(client: ControlPlaneClient, auth: Auth, executor: Executor, lanes: Lanes, wake: Wakeups,
              live: LiveStatus) -> None:
    backoff = Backoff()
    # Its own backoff: a turn that fails in the plane's way backs off on `backoff` and is a good turn here.
    guard = LoopGuard(log, "command poll", Backoff(), redact=executor.redactor)
    while not wake.stop.is_set() and not wake.draining.is_set():
        try:
            delay = poll_once(client, auth, executor, lanes, wake, live, backoff)
            guard.ok()
        except LanesClosed as exc:  # stopping: the journal keeps it, the next start executes it
            log.info("%s; kept for the next start (stopping)", exc)
            return
        except Exception as exc:  # noqa: BLE001 -- a bug: logged with its traceback, retried with backoff
            delay = guard.failed(exc)
        if delay > 0:
            wait_any(wake.stop, wake.poll, delay)


def poll_once(client: ControlPlaneClient, auth: Auth, executor: Executor, lanes: Lanes, wake: Wakeups,
              live: LiveStatus, backoff: Backoff) -> float:
    """One turn: fetch and hand on one command; returns the wait before the next turn (0: at once)."""
    live.tick("poller")
    if not lanes.ready() or storage_refuses(executor):
        return poll_interval(auth)
    try:
        command = fetch_one(client, executor, wake.stop, tick=lambda: live.tick("poller"))
    except CalderaError as exc:  # the plane or the network: the heartbeat says so, this retries quietly
        log.debug("command poll failed: %s", executor.redactor(str(exc)))
        return backoff.after(exc)
    backoff.reset()
    if command is None:
        return poll_interval(auth)
    try:
        lanes.submit(command)  # LanesClosed: poll_loop ends
    except LanesClosed:
        raise
    except Exception as exc:  # a bug handing it on: journaled, so finished now rather than at the next start
        settle(executor, command, exc)
        raise
    return 0  # there may be more: ask again as soon as the lane is free
