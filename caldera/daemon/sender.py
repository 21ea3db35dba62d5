"""The outbox sender: delivers finishes (and queued starts, inventories, run
events) in order, at least once. A retryable failure stops the pass and backs
off; a permanent refusal moves the item to outbox/rejected/ so one bad item
cannot hold back the rest."""
from __future__ import annotations

import logging
import time

from caldera.daemon.live import LiveStatus
from caldera.daemon.wakeups import Wakeups, wait_any
from caldera.protocol.client import ApiError, NotFound
from caldera.protocol.retry import Backoff

log = logging.getLogger("caldera.sender")
IDLE_WAIT = 30.0


def _deliver(client, item: dict) -> None:
    kind = item.get("kind")
    if kind == "finish":
        client.finish_command(item["command_id"], item["body"])
    elif kind == "start":
        client.start_command(item["command_id"], item["body"])
    elif kind == "inventory":
        client.skills_inventory(item["body"])
    else:
        raise ValueError(f"unknown outbox item kind {kind!r}")


def flush(client, outbox, stop, deadline: float | None = None) -> bool:
    """One pass over the outbox; True when it is empty afterwards.

    Raises the retryable error that stopped the pass (the caller backs off).
    """
    for name, item in outbox.items():
        if stop.is_set() and deadline is None:
            return False
        if deadline is not None and time.monotonic() > deadline:
            return False
        try:
            _deliver(client, item)
        except NotFound as exc:
            log.error("control plane does not know %s (%s); kept in outbox/rejected/", name, exc.message)
            outbox.reject(name)
            continue
        except ApiError as exc:
            if exc.retryable or exc.status == 401:
                raise
            log.error("control plane refused %s: %s; kept in outbox/rejected/", name, exc)
            outbox.reject(name)
            continue
        except ValueError as exc:
            log.error("outbox item %s: %s; kept in outbox/rejected/", name, exc)
            outbox.reject(name)
            continue
        outbox.done(name)
    return outbox.depth() == 0


def sender_loop(client, outbox, wake: Wakeups, live: LiveStatus, redactor) -> None:
    backoff, failing = Backoff(), False
    while not wake.stop.is_set():
        live.tick("sender")
        try:
            flush(client, outbox, wake.stop)
            backoff.reset()
            if failing:
                log.info("outbox delivering again (%d waiting)", outbox.depth())
            failing, delay = False, IDLE_WAIT
        except Exception as exc:  # noqa: BLE001 -- logged, retried with backoff
            if not failing:
                log.warning("outbox delivery paused: %s (%d waiting)", redactor(str(exc)), outbox.depth())
            failing = True
            delay = backoff.after(exc)
        wait_any(wake.stop, outbox.wakeup, delay)
