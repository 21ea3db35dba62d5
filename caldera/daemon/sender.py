"""The outbox sender: delivers finishes (and queued starts, inventories, run
events) in order, at least once. A retryable failure stops the pass and backs
off; a permanent refusal moves the item to outbox/rejected/ so one bad item
cannot hold back the rest."""
from __future__ import annotations

import logging
import time

from caldera.protocol.retry import Backoff
from caldera.daemon.wakeups import wait_any

log = logging.getLogger("caldera.sender")
IDLE_WAIT = 30.0


def _deliver(runtime, item: dict) -> None:
    kind, client = item.get("kind"), runtime.client
    if kind == "finish":
        client.finish_command(item["command_id"], item["body"])
    elif kind == "start":
        client.start_command(item["command_id"], item["body"])
    elif kind == "inventory":
        client.skills_inventory(item["body"])
    elif kind == "events":
        client.post_run_events(item["run_id"], item["body"])
    elif kind == "report":
        client.state_report(item["body"])
    else:
        raise ValueError(f"unknown outbox item kind {kind!r}")


def flush(runtime, deadline: float | None = None) -> bool:
    """One pass over the outbox; True when it is empty afterwards.

    Raises the retryable error that stopped the pass (the caller backs off).
    """
    from caldera.protocol.client import ApiError, NotFound

    for name, item in runtime.outbox.items():
        if runtime.stop.is_set() and deadline is None:
            return False
        if deadline is not None and time.monotonic() > deadline:
            return False
        try:
            _deliver(runtime, item)
        except NotFound as exc:
            if item.get("kind") == "events":
                runtime.outbox.done(name)  # the plane has no events extension: nothing to keep
                continue
            log.error("control plane does not know %s (%s); kept in outbox/rejected/", name, exc.message)
            runtime.outbox.reject(name)
            continue
        except ApiError as exc:
            if exc.retryable or exc.status == 401:
                raise
            log.error("control plane refused %s: %s; kept in outbox/rejected/", name, exc)
            runtime.outbox.reject(name)
            continue
        except ValueError as exc:
            log.error("outbox item %s: %s; kept in outbox/rejected/", name, exc)
            runtime.outbox.reject(name)
            continue
        runtime.outbox.done(name)
    return runtime.outbox.depth() == 0


def sender_loop(runtime) -> None:
    backoff, failing = Backoff(), False
    while not runtime.stop.is_set():
        runtime.tick("sender")
        try:
            flush(runtime)
            backoff.reset()
            if failing:
                log.info("outbox delivering again (%d waiting)", runtime.outbox.depth())
            failing, delay = False, IDLE_WAIT
        except Exception as exc:  # noqa: BLE001 -- logged, retried with backoff
            if not failing:
                log.warning("outbox delivery paused: %s (%d waiting)", runtime.redactor(str(exc)),
                            runtime.outbox.depth())
            failing = True
            delay = backoff.next_delay(getattr(exc, "retry_after", None) or getattr(exc, "retry_in", None))
        wait_any(runtime.stop, runtime.outbox.wakeup, delay)
