"""Running one control-plane command, durably.

The server hands a command out once, so nothing fetched may be lost:
  fetched   -> recorded in the journal (state.json) before anything else
  executing -> marked before `start`; a crash from here on means "interrupted"
  result    -> the finish goes into the durable outbox, then the journal entry goes
A restarted runtime executes what never began, finishes `failed` ("interrupted:
runtime restarted") what began without a recorded result, and leaves recorded
results to the outbox sender. Nothing runs twice.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from caldera.daemon import dispatch
from caldera.daemon.dispatch import DEFAULT_TIMEOUT_SECONDS, CommandContext
from caldera.errors import AuthBlocked, CalderaError, CommandError, Retryable
from caldera.host.timefmt import rfc3339
from caldera.protocol import schemas
from caldera.protocol.client import NotFound, Unsendable
from caldera.protocol.payloads import finish_body

log = logging.getLogger("caldera.executor")

JOURNAL_KEY = "commands"
RECENT_KEY, RECENT_KEPT = "recent_commands", 10  # what `caldera status` shows as the last commands
CANCEL_GRACE = 5.0  # after ctx.cancel is set, how long a handler gets to notice
DEADLINE_GRACE = 1.0  # the same, when the caller's own deadline (report --once) has passed
INTERRUPTED = "interrupted: runtime restarted"


@dataclass(frozen=True, eq=False)
class Executor:
    """Runs fetched commands to their durable finish. `context` builds a handler's
    CommandContext for (command, cancel, deadline)."""

    agent_id: str
    client: object
    state: object  # StateFile: the journal
    outbox: object
    redactor: Callable
    report_now: Callable[[], None]
    context: Callable[[dict, threading.Event, float], CommandContext]
    runs: object = None  # caldera.backends.registry.ActiveRuns: accepted agent runs, for agent_interrupt

    # ------------------------------------------------------------ journal

    def journal_fetched(self, command: dict) -> None:
        cid = str(command["id"])
        self.state.update(JOURNAL_KEY, lambda j: {**(j or {}), cid: {"phase": "fetched", "command": command,
                                                                    "fetched_at": rfc3339()}})
        self._announce(command)

    def _announce(self, command: dict) -> None:
        """An accepted agent_run is known from now on: an interrupt that arrives before its turn
        starts (queued behind another run, or just after its start) reaches it then."""
        if self.runs is not None and command.get("command_type") == "agent_run":
            self.runs.queue((command.get("payload") or {}).get("run_id"))

    def _journal_phase(self, command_id, phase: str) -> None:
        cid = str(command_id)

        def mark(journal):
            journal = journal or {}
            if cid in journal:
                journal[cid] = {**journal[cid], "phase": phase}
            return journal

        self.state.update(JOURNAL_KEY, mark)

    def _journal_remove(self, command_id) -> None:
        cid = str(command_id)
        self.state.update(JOURNAL_KEY, lambda j: {k: v for k, v in (j or {}).items() if k != cid})

    def recover(self) -> list[dict]:
        """After a restart: the commands to execute now (they never began); the rest is settled."""
        to_run = []
        for cid, entry in sorted((self.state.get(JOURNAL_KEY) or {}).items()):
            command = entry.get("command") or {"id": cid}
            if entry.get("phase") == "fetched":
                self._announce(command)
                to_run.append(command)
                continue
            if not self.outbox.has_finish(command.get("id")):
                log.warning("command %s (%s) was interrupted by a restart; finishing it failed",
                            cid, command.get("command_type"))
                self._put_finish(command, "failed", {}, INTERRUPTED)
            self._journal_remove(cid)
        return to_run

    # ------------------------------------------------------------ execution

    def execute(self, command: dict, cancel: threading.Event | None = None, deadline: float | None = None) -> str:
        """Run one fetched (journaled) command to its recorded finish; returns the status.
        `deadline` (report --once's) bounds the handler's time and its cancel grace."""
        cid, ctype = command.get("id"), str(command.get("command_type") or "")
        self._journal_phase(cid, "executing")
        started = self._send_start(command)
        if started is not True:
            status, result, error = "failed", {}, started
        else:
            status, result, error = self.run_handler(command, cancel, deadline)
        self._put_finish(command, status, result, error)
        if self.runs is not None and ctype == "agent_run":
            self.runs.forget((command.get("payload") or {}).get("run_id"))
        self._remember(command, status, error)
        self._journal_remove(cid)
        log.info("command %s (%s) %s%s", cid, ctype, status, f": {error}" if error else "")
        self.report_now()
        return status

    def _remember(self, command: dict, status: str, error: str) -> None:
        """The last few finished commands, newest first, for `caldera status` (state.json, bounded)."""
        entry = {"id": command.get("id"), "command_type": str(command.get("command_type") or ""),
                 "status": status, "finished_at": rfc3339(), "error": self.redactor(error or "")[:300]}
        self.state.update(RECENT_KEY, lambda items: ([entry] + [i for i in (items or []) if isinstance(i, dict)
                                                                and i.get("id") != entry["id"]])[:RECENT_KEPT])

    def _send_start(self, command: dict):
        """True when execution may go on; else the reason to finish failed."""
        body = {"agent_id": self.agent_id, "started_at": rfc3339()}
        try:
            self.client.start_command(command["id"], body)
        except NotFound as exc:
            if exc.from_server:
                return f"the control plane does not know this command: {exc.message}"
            self.outbox.put("start", {"command_id": command["id"], "body": body})  # a proxy's 404: try later
        except Unsendable as exc:
            return str(exc)  # an id that cannot go into a URL: not executed (its finish is refused too)
        except (Retryable, AuthBlocked):
            # The agent keeps working: the start goes out later, before the finish.
            self.outbox.put("start", {"command_id": command["id"], "body": body})
        except CalderaError as exc:
            log.warning("start of command %s refused (%s); executing it anyway", command["id"], exc)
        return True

    def run_handler(self, command: dict, cancel: threading.Event | None = None, deadline: float | None = None):
        """(status, result, error_message); the handler runs in its own thread under the timeout
        (and by the caller's `deadline`, when one is given)."""
        ctype = str(command.get("command_type") or "")
        if command.get("payload_too_large"):  # only its head was read (client.next_command)
            return "failed", {}, f"payload too large: the command's answer was {command['payload_too_large']}"
        payload = command.get("payload")
        payload = {} if payload is None else payload
        try:
            handler = dispatch.resolve(ctype)
            _validate(ctype, payload)
        except CommandError as exc:
            return "failed", {}, str(exc)
        timeout = _timeout(command)
        grace = CANCEL_GRACE
        if deadline is not None:  # report --once: the run ends by its deadline, handler or not
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
            grace = min(grace, DEADLINE_GRACE)
        ctx = self.context(command, cancel or threading.Event(), time.monotonic() + timeout)
        outcome = {}
        worker = threading.Thread(target=_call, args=(handler, ctx, payload, outcome),
                                  name=f"cmd-{command.get('id')}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            ctx.cancel.set()
            worker.join(grace)
            if worker.is_alive():
                log.error("command %s (%s) ignored its cancel; abandoned", command.get("id"), ctype)
            return "failed", {}, f"timed out after {timeout:g} s"
        if cancel is not None and cancel.is_set() and "error" not in outcome:
            return "failed", outcome.get("result") or {}, "cancelled: runtime stopping"
        if "error" in outcome:
            return "failed", outcome.get("result") or {}, outcome["error"]
        result = outcome.get("result")
        return "succeeded", result if isinstance(result, dict) else {"value": result}, ""

    def _put_finish(self, command: dict, status: str, result, error: str) -> None:
        body = finish_body(self.agent_id, status, self.redactor(result or {}), self.redactor(error or ""))
        self.outbox.put("finish", {"command_id": command.get("id"), "command_type": command.get("command_type"),
                                   "body": body})


def _call(handler, ctx: CommandContext, payload: dict, outcome: dict) -> None:
    """The body of a command's thread: the handler's result or error into `outcome`."""
    try:
        if ctx.client is not None:  # every call the handler makes ends by the command's deadline
            with ctx.client.within(ctx.deadline):
                outcome["result"] = handler(ctx, payload)
        else:
            outcome["result"] = handler(ctx, payload)
    except CommandError as exc:
        outcome["error"], outcome["result"] = str(exc), exc.result
    except CalderaError as exc:  # the plane failed a call the handler needed
        outcome["error"] = f"control plane: {exc}"
    except Exception as exc:  # a bug in a handler must still finish the command
        log.exception("command %s (%s) crashed", ctx.command_id, ctx.command_type)
        outcome["error"] = f"internal error: {type(exc).__name__}: {exc}"


def _timeout(command: dict) -> float:
    value = command.get("timeout_seconds")
    try:
        value = float(value)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT_SECONDS
    return value if value > 0 else DEFAULT_TIMEOUT_SECONDS


def _validate(ctype: str, payload) -> None:
    if not isinstance(payload, dict):
        raise CommandError(f"invalid payload for {ctype}: must be a JSON object")
    name = dispatch.schema_name(ctype)
    if not schemas.schema_exists(name):
        return
    try:
        schemas.validate(name, payload)
    except schemas.SchemaError as exc:
        raise CommandError(f"invalid payload for {ctype}: {exc}") from None


def executor_for(parts) -> Executor:
    """The executor of a runtime's parts: handlers get a CommandContext of those parts."""
    return Executor(agent_id=parts.identity.agent_id, client=parts.client, state=parts.state, outbox=parts.outbox,
                    redactor=parts.redactor, report_now=parts.wake.report_now, runs=parts.runs,
                    context=lambda command, cancel, deadline: CommandContext.for_command(parts, command, cancel,
                                                                                          deadline))
