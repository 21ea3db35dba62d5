"""Control-plane commands of adapter mode (SPEC section 8): pause, resume, run_now,
settings_get, settings_set, log_list, log_get; start/stop/restart_openclaw act
only in process mode.

The finish result is {ok, message, held, …}; a refused or failed verb raises
CommandError with the sentence a person reads (the result rides along).
pause, resume and run_now are refused when the manifest names `controls` and
leaves them out.
"""
from __future__ import annotations

from caldera.errors import CommandError

CONTROL_OF = {"pause": "pause", "resume": "resume", "run_now": "run_now"}


def _driver(ctx):
    driver = ctx.driver
    if driver is None:
        raise CommandError(f"{ctx.command.type}: this agent has no adapter (its manifest is not runtime.type: adapter)")
    return driver


def _allowed(driver, control: str) -> None:
    controls = driver.manifest.controls
    if controls is not None and control not in controls:
        named = ", ".join(controls) or "none"
        raise CommandError(f"{control} is not among this agent's controls (its manifest names: {named})")


def _result(answer, extra: dict | None = None) -> dict:
    result = answer.payload()
    result.update(extra or {})
    if not answer.ok:
        raise CommandError(answer.message or "the adapter refused", result=result)
    return result


def _kw(ctx) -> dict:
    return {"cancel": ctx.cancel, "deadline": ctx.deadline or None}


def _control(ctx, command: str, method: str) -> dict:
    driver = _driver(ctx)
    _allowed(driver, CONTROL_OF[command])
    answer = getattr(driver, method)(**_kw(ctx))
    ctx.report_now()  # the state changed: Caldera sees it in the next report, now
    return _result(answer)


def pause(ctx, payload: dict) -> dict:
    return _control(ctx, "pause", "pause")


def resume(ctx, payload: dict) -> dict:
    return _control(ctx, "resume", "resume")


def run_now(ctx, payload: dict) -> dict:
    return _control(ctx, "run_now", "run_now")


def settings_get(ctx, payload: dict) -> dict:
    answer = _driver(ctx).settings_get(**_kw(ctx))
    data = answer.data if answer.ok else {}
    return _result(answer, {"values": data.get("values"), "schema": data.get("schema")} if data else None)


def settings_set(ctx, payload: dict) -> dict:
    values = payload.get("values")
    if not isinstance(values, dict) or not values:
        raise CommandError("settings_set: the payload needs values: {key: value, …}")
    answer = _driver(ctx).settings_set(values, **_kw(ctx))
    if answer.ok:
        ctx.report_now()
    return _result(answer)


def log_list(ctx, payload: dict) -> dict:
    answer = _driver(ctx).log_list(**_kw(ctx))
    return _result(answer, {"logs": answer.data["logs"]} if answer.ok else None)


def log_get(ctx, payload: dict) -> dict:
    name = payload.get("name")
    answer = _driver(ctx).log_get(name, **_kw(ctx))
    extra = {"name": name, "text": answer.text, "truncated": answer.truncated} if answer.ok else None
    return _result(answer, extra)
