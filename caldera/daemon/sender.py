"""The outbox sender: delivers results first (queued starts and finishes), then
inventories, at least once.

What an answer means for one item (SPEC section 5, docs/runtime.md):
- taken (2xx, `success` not false): the item is deleted (a finish: its command id recorded
  first, daemon/life.delivered);
- 404 from the plane for that command: it can never be taken; kept in `outbox/rejected/`;
- 400: the body is cut to what the server accepts (result summarised, `error_message`
  capped, no non-finite numbers) and sent again once; a 400 to the cut body rejects it;
- the plane is away (no answer, a passed deadline, 429, 502-504, Retry-After, auth
  blocked): the pass stops and the loop backs off;
- anything else (a 500 for this item, a 403 on it, a 2xx that is not JSON or says
  `success: false`, a redirect): this item is held back with its own backoff and the
  pass goes on, so one bad item never holds up the rest.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from caldera.daemon import life
from caldera.daemon.live import LiveStatus
from caldera.daemon.wakeups import Wakeups, wait_any
from caldera.errors import AuthBlocked, CalderaError, unexpected
from caldera.host.loopguard import LoopGuard
from caldera.protocol.client import ApiError, Invalid, NotFound, Unauthorized, Unsendable
from caldera.protocol.payloads import ERROR_MESSAGE_CAP, cut_finish
from caldera.protocol.retry import Backoff
from caldera.skills import publish

if TYPE_CHECKING:
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.outbox import Outbox
    from caldera.redact import Redactor

log = logging.getLogger("caldera.sender")
IDLE_WAIT = 30.0
PLANE_AWAY = (429, 502, 503, 504)


def _deliver(client: ControlPlaneClient, item: dict[str, Any]) -> None:
    kind = item.get("kind")
    if kind == "finish":
        client.finish_command(item["command_id"], item["body"])
    elif kind == "start":
        client.start_command(item["command_id"], item["body"])
    elif kind == "inventory":
        client.skills_inventory(item["body"])
    else:
        raise ValueError(f"unknown outbox item kind {kind!r}")


def plane_away(exc: BaseException) -> bool:
    """The failure is the plane's or the network's, not this item's: stop the pass."""
    if isinstance(exc, (AuthBlocked, Unauthorized)):
        return True
    return isinstance(exc, ApiError) and exc.retryable and (exc.status is None or exc.status in PLANE_AWAY)


class Pass:
    """One pass over the outbox; `held` and `rejected` count what it set aside."""

    def __init__(self, client: ControlPlaneClient, outbox: Outbox, backoff: Backoff | None = None):
        self.client, self.outbox = client, outbox
        self.backoff = backoff or Backoff()
        self.held = self.rejected = 0

    def run(self, stop: threading.Event, deadline: float | None) -> None:
        held_commands: set[Any] = set()  # a held-back start keeps its command's finish behind it
        for name, item in self.outbox.items():
            if (stop.is_set() and deadline is None) or (deadline is not None and time.monotonic() > deadline):
                return
            command_id = item.get("command_id")
            if item.get("kind") == "finish" and command_id in held_commands:
                continue
            if not self.outbox.due(item) or not self.one(name, item):
                if item.get("kind") == "start":
                    held_commands.add(command_id)

    def one(self, name: str, item: dict[str, Any]) -> bool:
        """Deliver one item; True when it left the outbox. Raises when the plane is away."""
        try:
            _deliver(self.client, item)
        except NotFound as exc:
            if not exc.from_server:  # a proxy's 404 page is not the plane speaking of this command
                return self._hold(name, item, exc)
            return self._reject(name, f"the control plane does not know this command: {exc.message}")
        except Unsendable as exc:
            return self._reject(name, str(exc))
        except Invalid as exc:
            if exc.status != 400:
                return self._hold(name, item, exc)
            return self._cut_or_reject(name, item, exc)
        except CalderaError as exc:
            if plane_away(exc):
                raise
            return self._hold(name, item, exc)
        except (KeyError, ValueError) as exc:
            return self._reject(name, f"malformed outbox item: {exc}")
        except OSError:
            raise  # the host's (a full disk, no descriptors left): every item meets it, the pass stops
        except Exception as exc:  # noqa: BLE001 -- a bug this one item meets: it waits, the rest goes on
            return self._hold(name, item, exc, f"unexpected {unexpected(exc)} while delivering it")
        publish.delivered(self.outbox.dir, item)  # an inventory: the digest the plane accepted
        life.delivered(self.outbox, name, item)  # a finish: finish queued -> delivered
        return True

    def _hold(self, name: str, item: dict[str, Any], exc: BaseException, reason: str | None = None) -> bool:
        attempts = int((item.get("retry") or {}).get("attempts") or 0)
        delay = self.backoff.delay_for(attempts, getattr(exc, "retry_after", None))
        reason = reason or str(exc)
        retry = self.outbox.hold(name, item, reason, delay)
        if attempts == 0:
            log.warning("outbox item %s held back (%s); retrying it on its own, the rest goes on", name, reason)
        log.debug("outbox item %s: try %d failed, next in %.0f s", name, retry["attempts"], delay)
        self.held += 1
        return False

    def _reject(self, name: str, reason: str) -> bool:
        log.error("outbox item %s can never be delivered (%s); kept in outbox/rejected/", name, reason)
        self.outbox.reject(name, reason)
        self.rejected += 1
        return True

    def _cut_or_reject(self, name: str, item: dict[str, Any], exc: ApiError) -> bool:
        if item.get("kind") != "finish" or item.get("cut"):
            return self._reject(name, f"refused: {exc}")
        cut = {**item, "body": cut_finish(item["body"], f"HTTP 400: {exc.message}"), "cut": True}
        log.warning("finish %s refused as sent (%s); sending it cut to what the server accepts "
                    "(result summarised, error_message at most %d bytes)", name, exc, ERROR_MESSAGE_CAP)
        if not self.outbox.rewrite(name, cut):
            return True
        return self.one(name, cut)


def flush(client: ControlPlaneClient, outbox: Outbox, stop: threading.Event, deadline: float | None = None,
          backoff: Backoff | None = None) -> bool:
    """One pass over the outbox; True when nothing is waiting afterwards.

    Raises the error that stopped the pass when the plane is away (the caller backs off)."""
    Pass(client, outbox, backoff).run(stop, deadline)
    return outbox.depth() == 0


def sender_loop(client: ControlPlaneClient, outbox: Outbox, wake: Wakeups, live: LiveStatus,
                redactor: Redactor) -> None:
    """An item leaves the outbox only once the plane took it: whatever fails in a turn (the
    plane away, a full disk, no descriptors left, a bug) leaves every item in place."""
    backoff, failing = Backoff(), False
    guard = LoopGuard(log, "outbox sender", backoff, redact=redactor)
    while not wake.stop.is_set():
        live.tick("sender")
        try:
            flush(client, outbox, wake.stop)
            if failing:
                log.info("outbox delivering again (%s waiting)", _waiting(outbox))
            guard.ok()
            due = outbox.next_try_in()
            failing, delay = False, IDLE_WAIT if due is None else min(IDLE_WAIT, max(due, 0.5))
        except CalderaError as exc:  # the plane is away: said once, retried with backoff
            if not failing:
                log.warning("outbox delivery paused: %s (%s waiting)", redactor(str(exc)), _waiting(outbox))
            failing = True
            delay = backoff.after(exc)
        except Exception as exc:  # noqa: BLE001 -- the host's or a bug: logged by the guard, retried
            failing = True
            delay = guard.failed(exc)
        wait_any(wake.stop, outbox.wakeup, delay)


def _waiting(outbox: Outbox) -> str:
    """The outbox's depth for a log line; "?" when the directory cannot be listed (no descriptors left)."""
    try:
        return str(outbox.depth())
    except OSError:
        return "?"
