"""Running one command's handler: bound to its route, its payload validated, in its own
thread under the command's timeout (cancel, then a grace). What a command's life is before
and after (journal, start, finish) is daemon/life.py's; this file only runs the handler and
says how it ended: (status, result, error).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.daemon import dispatch
from caldera.errors import CalderaError, CommandError
from caldera.protocol import schemas
from caldera.protocol.command import Command
from caldera.protocol.handlers import Bound, Call

if TYPE_CHECKING:
    from caldera.daemon.wiring import Parts
    from caldera.protocol.client import ControlPlaneClient

log = logging.getLogger("caldera.executor")

CANCEL_GRACE = 5.0  # after the call's cancel is set, how long a handler gets to notice
DEADLINE_GRACE = 1.0  # the same, when the caller's own deadline (report --once) has passed


class Executor:
    """Runs a command's handler. `bind(call)` gives the handler of the call's command type
    with its context (daemon/dispatch.py); `client` is the one its requests go through."""

    __slots__ = ("client", "bind")

    client: ControlPlaneClient
    bind: Callable[[Call], Bound]

    def __init__(self, client: ControlPlaneClient, bind: Callable[[Call], Bound]) -> None:
        self.client = client
        self.bind = bind

    def run_handler(self, command: Command, cancel: threading.Event | None = None,
                    deadline: float | None = None) -> tuple[str, dict[str, Any], str]:
        """(status, result, error_message); the handler runs in its own thread under the timeout
        (and by the caller's `deadline`, when one is given)."""
        if command.refusal is not None:
            return "failed", {}, command.refusal
        timeout, grace = command.timeout_seconds, CANCEL_GRACE
        if deadline is not None:  # report --once: the run ends by its deadline, handler or not
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
            grace = min(grace, DEADLINE_GRACE)
        call = Call(command, cancel or threading.Event(), time.monotonic() + timeout)
        try:
            handler = self.bind(call)
            _validate(command)
        except CommandError as exc:
            return "failed", {}, str(exc)
        outcome = Outcome()
        worker = threading.Thread(target=_call, args=(handler, call, self.client, outcome), name=f"cmd-{command.id}",
                                  daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            call.cancel.set()
            worker.join(grace)
            if worker.is_alive():
                log.error("command %s (%s) ignored its cancel; abandoned", command.id, command.type)
            return "failed", {}, f"timed out after {timeout:g} s"
        if cancel is not None and cancel.is_set() and outcome.error is None:
            return "failed", outcome.result or {}, "cancelled: runtime stopping"
        if outcome.error is not None:
            return "failed", outcome.result or {}, outcome.error
        result = outcome.result
        return "succeeded", result if isinstance(result, dict) else {"value": result}, ""


class Outcome:
    """What a command's thread left: the handler's result, or its error (then the result
    is the one a CommandError carries, if any)."""

    __slots__ = ("result", "error")

    result: Any
    error: str | None

    def __init__(self, result: Any = None, error: str | None = None) -> None:
        self.result = result
        self.error = error


def _call(handler: Bound, call: Call, client: ControlPlaneClient, outcome: Outcome) -> None:
    """The body of a command's thread: the handler's result or error into `outcome`."""
    try:
        with client.within(call.deadline):  # every call the handler makes ends by the command's deadline
            outcome.result = handler(call.command.payload)
    except CommandError as exc:
        outcome.error, outcome.result = str(exc), exc.result
    except CalderaError as exc:  # the plane failed a call the handler needed
        outcome.error = f"control plane: {exc}"
    except Exception as exc:  # a bug in a handler must still finish the command
        log.exception("command %s (%s) crashed", call.command.id, call.command.type)
        outcome.error = f"internal error: {type(exc).__name__}: {exc}"


def _validate(command: Command) -> None:
    name = dispatch.schema_name(command.type)
    if not schemas.schema_exists(name):
        return
    try:
        schemas.validate(name, command.payload)
    except schemas.SchemaError as exc:
        raise CommandError(f"invalid payload for {command.type}: {exc}") from None


def executor_for(parts: Parts) -> Executor:
    """The executor of a connected runtime's parts: each handler is given its domain's context
    of them (daemon/dispatch.py)."""
    client, _ = parts.connection()
    return Executor(client=client, bind=dispatch.binder(parts))
