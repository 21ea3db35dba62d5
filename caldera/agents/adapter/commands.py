"""Control-plane commands of adapter mode (SPEC section 8): pause, resume, run_now,
settings_get, settings_set, log_list, log_get, through whichever driver there is
(start/stop/restart_openclaw act only in process mode: agents/process/commands.py).

The finish result is {ok, message, held, …}; a refused or failed verb raises
CommandError with the sentence a person reads (the result rides along).
pause, resume and run_now are refused when the manifest names `controls` and
leaves them out.
"""
from __future__ import annotations

from caldera import TYPE_CHECKING
from caldera.errors import CommandError

if TYPE_CHECKING:
    from typing import Any

    from caldera.agents.adapter.answer import Answer
    from caldera.agents.driver import AgentCall, AgentDriver


def _driver(ctx: AgentCall) -> AgentDriver:
    driver: AgentDriver | None = ctx.driver
    if driver is None:
        raise CommandError(f"{ctx.command.type}: this agent has no adapter (its manifest is not runtime.type: adapter)")
    return driver


def _allowed(driver: AgentDriver, control: str) -> None:
    controls = driver.manifest.controls
    if controls is not None and control not in controls:
        named = ", ".join(controls) or "none"
        raise CommandError(f"{control} is not among this agent's controls (its manifest names: {named})")


def _result(answer: Answer, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    result = answer.payload()
    result.update(extra or {})
    if not answer.ok:
        raise CommandError(answer.message or "the adapter refused", result=result)
    return result


def _deadline(ctx: AgentCall) -> float | None:
    return ctx.deadline or None  # 0.0: no deadline


def _control(ctx: AgentCall, control: str) -> dict[str, Any]:
    """pause, resume, run_now: the command's name is the manifest's control."""
    driver = _driver(ctx)
    _allowed(driver, control)
    verb = {"pause": driver.pause, "resume": driver.resume, "run_now": driver.run_now}[control]
    answer = verb(cancel=ctx.cancel, deadline=_deadline(ctx))
    ctx.report_now()  # the state changed: Caldera sees it in the next report, now
    return _result(answer)


def pause(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    return _control(ctx, "pause")


def resume(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    return _control(ctx, "resume")


def run_now(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    return _control(ctx, "run_now")


def settings_get(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    answer = _driver(ctx).settings_get(cancel=ctx.cancel, deadline=_deadline(ctx))
    data = answer.data if answer.ok else {}
    return _result(answer, {"values": data.get("values"), "schema": data.get("schema")} if data else None)


def settings_set(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    values = payload.get("values")
    if not isinstance(values, dict) or not values:
        raise CommandError("settings_set: the payload needs values: {key: value, …}")
    answer = _driver(ctx).settings_set(values, cancel=ctx.cancel, deadline=_deadline(ctx))
    if answer.ok:
        ctx.report_now()
    return _result(answer)


def log_list(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    answer = _driver(ctx).log_list(cancel=ctx.cancel, deadline=_deadline(ctx))
    return _result(answer, {"logs": answer.data["logs"]} if answer.ok and answer.data else None)


def log_get(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    name = payload.get("name")
    # Anything but text is refused as "a log name is required", as the empty name is.
    answer = _driver(ctx).log_get(name if isinstance(name, str) else "", cancel=ctx.cancel, deadline=_deadline(ctx))
    extra = {"name": name, "text": answer.text, "truncated": answer.truncated} if answer.ok else None
    return _result(answer, extra)
