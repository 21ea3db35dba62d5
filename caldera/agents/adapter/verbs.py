"""The verbs as a person or Caldera asks for them: one implementation for all three doors
(the CLI, control-plane commands, the daemon), each returning an Answer whose
`message` is the sentence to show.
"""
from __future__ import annotations

from caldera import TYPE_CHECKING
from caldera.agents import settings
from caldera.agents.adapter import invoke, logs
from caldera.agents.adapter.answer import DONE, FAILED, REFUSED, UNSUPPORTED, Answer, ContractError, with_held

if TYPE_CHECKING:
    import threading
    from typing import Any

    from caldera.agents.manifest import Manifest
    from caldera.redact import Redactor

ADAPTER_FAILED = "The agent's adapter failed: "
NOTHING_CHANGED = "Nothing changed: "
DEFAULTS = {"pause": "Paused.", "resume": "Pause lifted.", "run-now": "Requested.",
            "settings set": "Saved; the next run uses it."}


def finish(answer: Answer, refused_prefix: str = "") -> Answer:
    """Turn the raw answer into the sentence a person reads."""
    if answer.kind == DONE:
        answer.message = with_held(answer.message or DEFAULTS.get(answer.verb, "Done."), answer.held)
    elif answer.kind == REFUSED:
        reason = answer.message or "refused (the adapter gave no reason)"
        answer.message = with_held(refused_prefix + reason, answer.held)
    elif answer.kind == UNSUPPORTED:
        answer.message = f"{answer.verb}: not supported by this agent"
    else:
        answer.message = ADAPTER_FAILED + (answer.reason or "no reason given")
    return answer


def _refused(verb: str, message: str) -> Answer:
    return Answer(verb=verb, kind=REFUSED, message=message)


def control(manifest: Manifest, verb: str, *, cancel: threading.Event | None = None) -> Answer:
    """pause, resume or run-now (run-now: exit 0 even when held, refused when nothing can run)."""
    return finish(invoke.call(manifest, verb, cancel=cancel))


def fetch_settings(manifest: Manifest, *,
                   cancel: threading.Event | None = None) -> tuple[Answer, dict[str, Any], dict[str, Any]]:
    """(raw answer, values, bounds); an adapter without `settings get` (exit 2) has no bounds."""
    answer = invoke.call(manifest, "settings get", cancel=cancel)
    if answer.kind != DONE:
        return answer, {}, {}
    try:
        values, bounds = settings.check_settings_get(answer.data, manifest.settings_schema)
    except ContractError as exc:
        answer.kind, answer.reason = FAILED, str(exc)
        return answer, {}, {}
    return answer, values, bounds


def settings_get(manifest: Manifest, *, cancel: threading.Event | None = None) -> Answer:
    """Values and the offered (narrowed) schema; `data` = {values, schema, bounds}."""
    answer, values, bounds = fetch_settings(manifest, cancel=cancel)
    if answer.kind not in (DONE, UNSUPPORTED):
        return finish(answer)
    schema = settings.narrow(manifest.settings_schema, bounds)
    answer.kind = DONE
    answer.data = {"values": values or {i["key"]: None for i in schema}, "schema": list(schema),
                   "bounds": bounds}
    answer.message = "Settings." if schema else "This agent declares no settings."
    return answer


def settings_set(manifest: Manifest, values: Any, *, cancel: threading.Event | None = None,
                 bounds: dict[str, Any] | None = None) -> Answer:
    """Manifest check, narrowed check, then the adapter; all or nothing.

    bounds: the adapter's bounds if the caller has fresh ones (the daemon's
    cache); None asks `settings get` first.
    """
    verb = "settings set"
    problem = settings.check_values(values, manifest.settings_schema)
    if problem:
        return _refused(verb, NOTHING_CHANGED + problem)
    if bounds is None:
        got, _, bounds = fetch_settings(manifest, cancel=cancel)
        if got.kind not in (DONE, UNSUPPORTED):
            # Without the adapter's bounds the narrowing can't be done: change nothing.
            return finish(got)
    problem = settings.check_values(values, settings.narrow(manifest.settings_schema, bounds),
                                    grid=manifest.settings_schema)
    if problem:
        return _refused(verb, NOTHING_CHANGED + problem)
    arg = settings.argument(values)  # what the 8 KiB cap counted
    return finish(invoke.call(manifest, verb, (arg,), cancel=cancel), NOTHING_CHANGED)


def log_list(manifest: Manifest, *, cancel: threading.Event | None = None) -> Answer:
    answer = invoke.call(manifest, "log --list", cancel=cancel)
    if answer.kind == DONE:
        try:
            names = logs.check_log_list(answer.data)
        except ContractError as exc:
            answer.kind, answer.reason = FAILED, str(exc)
            return finish(answer)
        answer.data = {"logs": names}
        answer.message = f"{len(names)} log{'' if len(names) == 1 else 's'}." if names else "No logs."
        return answer
    return finish(answer)


def log_get(manifest: Manifest, name: Any, *, cancel: threading.Event | None = None) -> Answer:
    problem = logs.name_problem(name)
    if problem:
        return _refused("log", f"{problem}.")
    answer = invoke.call(manifest, "log", (name,), cancel=cancel)
    if answer.kind == REFUSED:
        answer.message = logs.NO_SUCH_LOG
        return answer
    if answer.kind == DONE:
        answer.message = name
        return answer
    return finish(answer)


def redact_answer(answer: Answer, redactor: Redactor | None) -> Answer:
    """Every string that leaves the process passes the Redactor."""
    if redactor is None:
        return answer
    answer.message = redactor(answer.message) if answer.message else answer.message
    answer.held = redactor(answer.held)
    answer.reason = redactor(answer.reason) if answer.reason else answer.reason
    if answer.text:
        answer.text = redactor(answer.text)
    if answer.data is not None:
        answer.data = redactor(answer.data)
    answer.stderr = redactor(answer.stderr) if answer.stderr else ""
    return answer
