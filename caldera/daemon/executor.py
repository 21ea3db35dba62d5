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

from caldera.daemon import dispatch as commands
from caldera.daemon.dispatch import DEFAULT_TIMEOUT_SECONDS, CommandContext
from caldera.errors import CommandError
from caldera.protocol.payloads import now_iso

log = logging.getLogger("caldera.daemon.executor")

JOURNAL_KEY = "commands"
CANCEL_GRACE = 5.0  # after ctx.cancel is set, how long a handler gets to notice
INTERRUPTED = "interrupted: runtime restarted"


# ---------------------------------------------------------------- journal

def journal_fetched(runtime, command: dict) -> None:
    cid = str(command["id"])
    runtime.state.update(JOURNAL_KEY, lambda j: {**(j or {}), cid: {"phase": "fetched", "command": command,
                                                                   "fetched_at": now_iso()}})


def _journal_phase(runtime, command_id, phase: str) -> None:
    cid = str(command_id)

    def mark(journal):
        journal = journal or {}
        if cid in journal:
            journal[cid] = {**journal[cid], "phase": phase}
        return journal

    runtime.state.update(JOURNAL_KEY, mark)


def _journal_remove(runtime, command_id) -> None:
    cid = str(command_id)
    runtime.state.update(JOURNAL_KEY, lambda j: {k: v for k, v in (j or {}).items() if k != cid})


def recover(runtime) -> list[dict]:
    """After a restart: the commands to execute now (they never began); the rest is settled."""
    to_run = []
    for cid, entry in sorted((runtime.state.get(JOURNAL_KEY) or {}).items()):
        command = entry.get("command") or {"id": cid}
        if entry.get("phase") == "fetched":
            to_run.append(command)
            continue
        if not runtime.outbox.has_finish(command.get("id")):
            log.warning("command %s (%s) was interrupted by a restart; finishing it failed",
                        cid, command.get("command_type"))
            _put_finish(runtime, command, "failed", {}, INTERRUPTED)
        _journal_remove(runtime, cid)
    return to_run


# ---------------------------------------------------------------- execution

def execute(runtime, command: dict, cancel: threading.Event | None = None) -> str:
    """Run one fetched (journaled) command to its recorded finish; returns the status."""
    cid, ctype = command.get("id"), str(command.get("command_type") or "")
    _journal_phase(runtime, cid, "executing")
    started = _send_start(runtime, command)
    if started is not True:
        status, result, error = "failed", {}, started
    else:
        status, result, error = run_handler(runtime, command, cancel)
    _put_finish(runtime, command, status, result, error)
    _journal_remove(runtime, cid)
    log.info("command %s (%s) %s%s", cid, ctype, status, f": {error}" if error else "")
    runtime.report_now()
    return status


def _send_start(runtime, command: dict):
    """True when execution may go on; else the reason to finish failed."""
    from caldera.protocol.client import ApiError, NotFound
    from caldera.protocol.session import AuthBlocked

    body = {"agent_id": runtime.agent_id, "started_at": now_iso()}
    try:
        runtime.client.start_command(command["id"], body)
    except NotFound as exc:
        return f"the control plane does not know this command: {exc.message}"
    except (ApiError, AuthBlocked) as exc:
        if getattr(exc, "retryable", False) or isinstance(exc, AuthBlocked):
            # The agent keeps working: the start goes out later, before the finish.
            runtime.outbox.put("start", {"command_id": command["id"], "body": body})
        else:
            log.warning("start of command %s refused (%s); executing it anyway", command["id"], exc)
    return True


def run_handler(runtime, command: dict, cancel: threading.Event | None = None):
    """(status, result, error_message); the handler runs in its own thread under the timeout."""
    from caldera.protocol.client import ApiError
    from caldera.protocol.session import AuthBlocked

    ctype = str(command.get("command_type") or "")
    payload = command.get("payload")
    payload = {} if payload is None else payload
    try:
        handler = commands.resolve(ctype)
        _validate(ctype, payload)
    except CommandError as exc:
        return "failed", {}, str(exc)
    timeout = _timeout(command)
    ctx = CommandContext(command=command, runtime=runtime, cancel=cancel or threading.Event(),
                         deadline=time.monotonic() + timeout)
    outcome = {}

    def call():
        try:
            outcome["result"] = handler(ctx, payload)
        except CommandError as exc:
            outcome["error"], outcome["result"] = str(exc), exc.result
        except (ApiError, AuthBlocked) as exc:  # the plane failed a call the handler needed
            outcome["error"] = f"control plane: {exc}"
        except Exception as exc:  # a bug in a handler must still finish the command
            log.exception("command %s (%s) crashed", command.get("id"), ctype)
            outcome["error"] = f"internal error: {type(exc).__name__}: {exc}"

    worker = threading.Thread(target=call, name=f"cmd-{command.get('id')}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        ctx.cancel.set()
        worker.join(CANCEL_GRACE)
        if worker.is_alive():
            log.error("command %s (%s) ignored its cancel; abandoned", command.get("id"), ctype)
        return "failed", {}, f"timed out after {timeout:g} s"
    if cancel is not None and cancel.is_set() and "error" not in outcome:
        return "failed", outcome.get("result") or {}, "cancelled: runtime stopping"
    if "error" in outcome:
        return "failed", outcome.get("result") or {}, outcome["error"]
    result = outcome.get("result")
    return "succeeded", result if isinstance(result, dict) else {"value": result}, ""


def _timeout(command: dict) -> float:
    value = command.get("timeout_seconds")
    try:
        value = float(value)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT_SECONDS
    return value if value > 0 else DEFAULT_TIMEOUT_SECONDS


def _validate(ctype: str, payload) -> None:
    from caldera.protocol import schemas
    if not isinstance(payload, dict):
        raise CommandError(f"invalid payload for {ctype}: must be a JSON object")
    name = commands.schema_name(ctype)
    if not schemas.schema_exists(name):
        return
    try:
        schemas.validate(name, payload)
    except schemas.SchemaError as exc:
        raise CommandError(f"invalid payload for {ctype}: {exc}") from None


def _put_finish(runtime, command: dict, status: str, result, error: str) -> None:
    body = {"agent_id": runtime.agent_id, "status": status, "finished_at": now_iso(),
            "result": runtime.redactor(result or {}), "error_message": runtime.redactor(error or "")}
    runtime.outbox.put("finish", {"command_id": command.get("id"), "command_type": command.get("command_type"),
                                  "body": body})
