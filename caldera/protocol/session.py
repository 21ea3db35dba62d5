"""The agent's session with the control plane.

`session.json` (0600, atomic) holds the session token. `Auth` hands the token
to every loop and registers when there is none, single-flight: when several
loops see a 401 at once, one registers and the others take its new token.
Only a refusal of register itself (403, or ClawManager's 400 "invalid agent
bootstrap token") means the configuration is wrong: the auth path is blocked,
one short line is logged, and registration is tried again every 5 minutes or on
SIGHUP (`unblock()`). A 403 on any other call is not the session's business:
"agent id does not match session" renews the session (the client does it, like
a 401), any other 403 refuses that one call (`client.Forbidden`).

A mismatch renews at most once per session: a session registered *because of* a
mismatch was issued to this very agent id, so the same refusal on it is about what
was sent, not the session, and another register would only repeat (every retry a
register, for ever). That call is refused instead (`client.Forbidden`, said once).

The session is kept only for the base URL, instance and agent_id it was issued
to: a changed `agent_id` (another runtime type) registers afresh instead of
sending another agent's token.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from caldera.config import header_safe
from caldera.errors import AuthBlocked  # noqa: F401 -- re-exported: callers catch it from here too
from caldera.host.fsutil import atomic_write_json, read_json
from caldera.protocol.client import Forbidden, Invalid, SessionMismatch, Unaccepted, Unauthorized

MISMATCH_BORN_KEPT = 8  # tokens registered after a mismatch, remembered (the newest is the one in use)

if TYPE_CHECKING:
    from caldera.redact import Redactor

log = logging.getLogger("caldera.protocol.session")

BLOCKED_RETRY_SECONDS = 300


class SessionInfo(NamedTuple):
    token: str
    expires_at: str | None
    heartbeat_interval: float
    poll_interval: float


class SessionFile(NamedTuple):
    """session.json, tied to the base URL, instance and agent_id it was issued for."""

    path: Path
    base_url: str
    instance_id: int
    agent_id: str | None = None

    def load(self) -> SessionInfo | None:
        try:
            doc = read_json(self.path)
        except ValueError:
            log.warning("session.json is corrupt; registering again")
            return None
        if not doc or doc.get("base_url") != self.base_url or doc.get("instance_id") != self.instance_id:
            return None
        if doc.get("agent_id") != self.agent_id:
            log.info("session.json was issued to agent %r, not %r; registering again", doc.get("agent_id"),
                     self.agent_id)
            return None
        if not isinstance(doc.get("session_token"), str) or not header_safe(doc["session_token"]):
            log.warning("session.json holds no usable session token; registering again")
            return None
        return SessionInfo(doc["session_token"], doc.get("session_expires_at"),
                           doc.get("heartbeat_interval_seconds", 15), doc.get("command_poll_interval_seconds", 5))

    def save(self, info: SessionInfo) -> None:
        atomic_write_json(self.path, {
            "base_url": self.base_url, "instance_id": self.instance_id, "agent_id": self.agent_id,
            "session_token": info.token, "session_expires_at": info.expires_at,
            "heartbeat_interval_seconds": info.heartbeat_interval,
            "command_poll_interval_seconds": info.poll_interval,
        }, mode=0o600)

    def clear(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class Auth:
    """Single-flight session handling shared by every loop."""

    def __init__(self, *, bootstrap_token: str, session_file: SessionFile, register: Callable[[], dict[str, Any]],
                 redactor: Redactor, clock: Callable[[], float] = time.monotonic):
        self.bootstrap_token = bootstrap_token
        self._file = session_file
        self._register = register  # -> register's response data (no auth retry)
        self._redactor = redactor
        self._clock = clock
        self._lock = threading.Lock()
        self._info = session_file.load()
        if self._info:
            redactor.add(self._info.token)
        self.blocked_reason: str | None = None
        self._blocked_until = 0.0
        self._mismatch_born: list[str] = []  # tokens registered after a 403 mismatch
        self._mismatch_said = False

    @property
    def info(self) -> SessionInfo | None:
        return self._info

    @property
    def agent_id(self) -> str | None:
        """The agent id the session is issued to (session.json's key): what every body names."""
        return self._file.agent_id

    def token(self) -> str:
        info = self._info
        if info is not None:
            return info.token
        with self._lock:
            return (self._info or self._do_register()).token

    def renew(self, old_token: str | None) -> str:
        """Called after a 401 with the token that got it; registers once for everyone."""
        with self._lock:
            if self._info is None or self._info.token == old_token:
                self._info = None
                self._file.clear()
                return self._do_register().token
            return self._info.token

    def renew_mismatched(self, old_token: str | None, refusal: SessionMismatch) -> str:
        """Called after a 403 "agent id does not match session" with the token that got it:
        registers once for everyone, unless that token was itself registered after such a
        refusal; then a register cannot help and the call is refused (client.Forbidden),
        said once (no register loop)."""
        with self._lock:
            if self._info is not None and self._info.token != old_token:
                return self._info.token  # another loop renewed it meanwhile
            if old_token is not None and old_token in self._mismatch_born:
                if not self._mismatch_said:
                    self._mismatch_said = True
                    log.warning("the control plane says the agent id sent does not match the session, which was "
                                "registered as %r after the same refusal: not registering again (that call is "
                                "refused; said once)", self.agent_id)
                raise Forbidden(refusal.status, f"{refusal.message} (the session was registered as "
                                f"{self.agent_id!r} after the same refusal: not registering again)",
                                from_server=refusal.from_server)
            log.info("session not accepted (%s); registering again", refusal.message)
            self._info = None
            self._file.clear()
            token = self._do_register().token
            self._mismatch_born = [*self._mismatch_born, token][-MISMATCH_BORN_KEPT:]
            return token

    def unblock(self) -> None:
        """SIGHUP: the configuration may have been fixed; try again now."""
        with self._lock:
            self._blocked_until = 0.0

    def blocked_for(self) -> float:
        return max(0.0, self._blocked_until - self._clock()) if self.blocked_reason else 0.0

    def _block(self, reason: str) -> None:
        if self.blocked_reason != reason:
            log.error("control plane refused this agent: %s; retrying every %d s or on SIGHUP",
                      reason, BLOCKED_RETRY_SECONDS)
        self.blocked_reason = reason
        self._blocked_until = self._clock() + BLOCKED_RETRY_SECONDS

    def _do_register(self) -> SessionInfo:
        """Register (the lock held) and keep the new session; returns it."""
        wait = self.blocked_for()
        if wait > 0 and self.blocked_reason:
            raise AuthBlocked(self.blocked_reason, wait)
        try:
            data = self._register() or {}
        except (Forbidden, Unauthorized, SessionMismatch, Invalid) as exc:
            if isinstance(exc, Invalid) and exc.status not in (400, 403):
                raise  # refused before sending (a body the encoder refused): not the plane's word
            self._block(exc.message)
            raise AuthBlocked(exc.message, BLOCKED_RETRY_SECONDS) from None
        token = data.get("session_token")
        if not isinstance(token, str) or not token:
            raise Unaccepted(200, "register answered without a session_token")
        if not header_safe(token):  # never quoted: it is a secret
            raise Unaccepted(200, "register answered a session_token that is not one line of printable "
                                  "characters (it could not be sent as a header); not taken")
        self._redactor.add(token)
        info = SessionInfo(token, data.get("session_expires_at"),
                           _interval(data.get("heartbeat_interval_seconds"), 15),
                           _interval(data.get("command_poll_interval_seconds"), 5))
        self._info = info
        try:
            self._file.save(info)
        except OSError as exc:
            # The plane issued it: using it beats registering again on every call. Unsaved, the
            # next start registers anew, which is all a lost session.json ever costs.
            log.warning("session.json not written (%s): the session is kept in memory; the next start "
                        "registers again", exc.strerror or exc)
        if self.blocked_reason:
            log.info("registration accepted again")
        self.blocked_reason = None
        log.info("registered; heartbeat every %g s, command poll every %g s",
                 info.heartbeat_interval, info.poll_interval)
        return info


def _interval(value: Any, default: float) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return default
    return seconds if seconds >= 1 else default
