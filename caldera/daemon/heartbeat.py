"""The heartbeat loop: every heartbeat interval (from register, default 15 s).

`has_pending_command` wakes the poller at once; a `desired_config_revision_id`
different from the current one is handed on (`on_desired`). Failures are
logged once per state change with "last successful was X ago", and the
connection status is kept in state.json for `caldera status`: best effort, since
heartbeats must go on whatever the state dir does (a full disk, issue 26). The
loop's body survives any exception (a logged line and a backoff).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.daemon.live import LiveStatus, ago
from caldera.daemon.reporter import REVISION_KEY, Reports
from caldera.daemon.wakeups import Wakeups, wait_any
from caldera.errors import CalderaError
from caldera.host.loopguard import LoopGuard
from caldera.host.timefmt import rfc3339
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from caldera.host.statefile import StateFile
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.session import Auth
    from caldera.redact import Redactor

log = logging.getLogger("caldera.heartbeat")
DEFAULT_INTERVAL = 15.0
CONNECTION_KEY = "connection"  # state.json


class ConnectionStatus:
    """Last success / last error of the heartbeat, mirrored into state.json."""

    def __init__(self, state: StateFile, redactor: Redactor, auth: Auth | None = None,
                 on_recovery: Callable[[], None] | None = None):
        self.state, self.redactor, self.auth = state, redactor, auth
        self.on_recovery = on_recovery or (lambda: None)
        self.last_ok: float | None = None  # monotonic
        self.failing = False
        self._mirror_error: str | None = None  # the last failure to write the mirror, logged once

    def _mirror(self, write: Callable[[], object]) -> None:
        """Write the state.json mirror; a failure is logged once per change, never raised."""
        try:
            write()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if reason != self._mirror_error:
                log.warning("could not keep the connection status in state.json (%s); heartbeats go on", reason)
            self._mirror_error = reason
            return
        if self._mirror_error is not None:
            log.info("connection status kept in state.json again")
        self._mirror_error = None

    def ok(self, data: dict[str, Any]) -> None:
        if self.failing:
            log.info("control plane reachable again")
            self.on_recovery()  # deliver what waited, without sitting out the backoff
        self.failing, self.last_ok = False, time.monotonic()
        conn = {"last_heartbeat_ok_at": rfc3339(), "last_error": None, "last_error_at": None,
                "auth_blocked": None, "server_time": data.get("server_time")}
        self._mirror(lambda: self.state.set(CONNECTION_KEY, conn))

    def error(self, exc: Exception) -> None:
        reason = self.redactor(str(exc))
        if not self.failing:
            log.warning("heartbeat failed: %s (last successful was %s)", reason, ago(self.last_ok),
                        exc_info=not isinstance(exc, CalderaError))  # anything else is a bug: show where
        self.failing = True
        blocked = self.auth.blocked_reason if self.auth is not None else None

        def mark(conn: dict[str, Any] | None) -> dict[str, Any]:
            conn = conn or {}
            conn.update(last_error=reason, last_error_at=rfc3339(), auth_blocked=blocked)
            return conn

        self._mirror(lambda: self.state.update(CONNECTION_KEY, mark))


def send_heartbeat(client: ControlPlaneClient, reports: Reports, state: StateFile, wake: Wakeups,
                   on_desired: Callable[[int], None]) -> dict[str, Any]:
    """One heartbeat; returns the response data and acts on its hints."""
    data = client.heartbeat(reports.heartbeat()) or {}
    if data.get("has_pending_command"):
        wake.poll.set()
    desired = desired_revision(data.get("desired_config_revision_id"))
    if desired is not None and desired != state.get(REVISION_KEY):
        on_desired(desired)
    return data


_last_unusable: list[str] = []  # the unusable desired_config_revision_id last logged (the heartbeat thread's)


def desired_revision(value: object) -> int | None:
    """The heartbeat's desired_config_revision_id as a revision id (a whole number >= 1, or
    its digits as a string, as state.json keeps the current one), or None: none named, or
    one that is unusable (a list, an object, a boolean, ...), logged once while it repeats."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and int(value) >= 1:
        return int(value)
    shown = repr(value)[:200]
    if _last_unusable != [shown]:
        _last_unusable[:] = [shown]
        log.warning("ignoring the heartbeat's desired_config_revision_id %s: not a revision id", shown)
    return None


def heartbeat_loop(client: ControlPlaneClient, auth: Auth, reports: Reports, status: ConnectionStatus, wake: Wakeups,
                   live: LiveStatus, on_desired: Callable[[int], None]) -> None:
    backoff = Backoff()
    # Its own backoff: a turn that fails in the plane's way backs off on `backoff` and is a good turn here.
    guard = LoopGuard(log, "heartbeat loop", Backoff(), redact=status.redactor)
    while not wake.stop.is_set():
        try:
            delay = beat(client, auth, reports, status, wake, live, on_desired, backoff)
            guard.ok()
        except Exception as exc:  # noqa: BLE001 -- a bug in the error path itself: the loop goes on
            delay = guard.failed(exc)
        wait_any(wake.stop, wake.heartbeat, delay)


def beat(client: ControlPlaneClient, auth: Auth, reports: Reports, status: ConnectionStatus, wake: Wakeups,
         live: LiveStatus, on_desired: Callable[[int], None], backoff: Backoff) -> float:
    """One turn of the loop: a heartbeat and its bookkeeping; returns the wait before the next."""
    live.tick("heartbeat")
    try:
        status.ok(send_heartbeat(client, reports, status.state, wake, on_desired))
    except Exception as exc:  # noqa: BLE001 -- every failure is logged and retried
        status.error(exc)
        return backoff.after(exc)
    backoff.reset()
    info = auth.info  # read after the call: the first one registers
    return info.heartbeat_interval if info else DEFAULT_INTERVAL
