"""The heartbeat loop: every heartbeat interval (from register, default 15 s).

`has_pending_command` wakes the poller at once; a `desired_config_revision_id`
different from the current one is handed to the revisions path. Failures are
logged once per state change with "last successful was X ago", and the
connection status is kept in state.json for `caldera status`.
"""
from __future__ import annotations

import logging
import time

from caldera.protocol.retry import Backoff
from caldera.daemon.wakeups import ago, wait_any
from caldera.protocol.payloads import heartbeat_body, now_iso

log = logging.getLogger("caldera.heartbeat")
DEFAULT_INTERVAL = 15.0


class ConnectionStatus:
    """Last success / last error of the heartbeat, mirrored into state.json."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.last_ok: float | None = None  # monotonic
        self.failing = False

    def ok(self, data: dict) -> None:
        if self.failing:
            log.info("control plane reachable again")
            self.runtime.outbox.wakeup.set()  # deliver what waited, without sitting out the backoff
        self.failing, self.last_ok = False, time.monotonic()
        self.runtime.state.set("connection", {"last_heartbeat_ok_at": now_iso(), "last_error": None,
                                              "last_error_at": None, "auth_blocked": None,
                                              "server_time": data.get("server_time")})

    def error(self, exc: Exception) -> None:
        reason = self.runtime.redactor(str(exc))
        if not self.failing:
            log.warning("heartbeat failed: %s (last successful was %s)", reason, ago(self.last_ok),
                        exc_info=not _expected(exc))
        self.failing = True
        blocked = getattr(self.runtime.auth, "blocked_reason", None)

        def mark(conn):
            conn = conn or {}
            conn.update(last_error=reason, last_error_at=now_iso(), auth_blocked=blocked)
            return conn

        self.runtime.state.update("connection", mark)


def send_heartbeat(runtime) -> dict:
    """One heartbeat; returns the response data and acts on its hints."""
    body = heartbeat_body(runtime, runtime.last_section, runtime.last_sample)
    data = runtime.client.heartbeat(body) or {}
    if data.get("has_pending_command"):
        runtime.poll_wakeup.set()
    desired = data.get("desired_config_revision_id")
    if desired is not None and desired != runtime.state.get("current_config_revision_id"):
        runtime.desired_revision(desired)
    return data


def heartbeat_loop(runtime) -> None:
    status, backoff = ConnectionStatus(runtime), Backoff()
    wake = runtime.heartbeat_wakeup
    while not runtime.stop.is_set():
        runtime.tick("heartbeat")
        try:
            status.ok(send_heartbeat(runtime))
            backoff.reset()
            info = runtime.auth.info  # read after the call: the first one registers
            delay = info.heartbeat_interval if info else DEFAULT_INTERVAL
        except Exception as exc:  # noqa: BLE001 -- every failure is logged and retried
            status.error(exc)
            delay = backoff.next_delay(_retry_after(exc))
        wait_any(runtime.stop, wake, delay)


def _expected(exc) -> bool:
    """Network and server trouble is expected; anything else is a bug worth a traceback."""
    from caldera.protocol.client import ApiError
    from caldera.protocol.session import AuthBlocked

    return isinstance(exc, (ApiError, AuthBlocked))


def _retry_after(exc) -> float | None:
    return getattr(exc, "retry_after", None) or getattr(exc, "retry_in", None)
