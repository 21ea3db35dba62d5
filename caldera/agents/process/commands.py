"""`start_openclaw`, `stop_openclaw`, `restart_openclaw` (seed 004's v1 slots; SPEC sections 7b, 8).

They act on the process the runtime supervises. In adapter mode caldera starts
and stops nothing, so they fail there with a sentence saying so. (pause, resume,
run_now, settings_* and log_* go through `caldera.agents.adapter.commands`, which
calls the driver: the process driver answers them the same way.)
"""
from __future__ import annotations

from caldera import TYPE_CHECKING
from caldera.agents.narrow import as_process_driver
from caldera.errors import CommandError

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from caldera.agents.adapter.answer import Answer
    from caldera.agents.driver import AgentCall
    from caldera.agents.process.driver import ProcessDriver


def _process_driver(ctx: AgentCall) -> ProcessDriver:
    driver = as_process_driver(ctx.driver)
    if driver is None:
        raise CommandError(f"{ctx.command.type} acts only in process mode; this agent runs in adapter mode, "
                           "where caldera starts and stops nothing (use pause / resume)")
    return driver


def _act(ctx: AgentCall, verb: str, act: Callable[[ProcessDriver], Answer]) -> dict[str, Any]:
    driver = _process_driver(ctx)
    answer = act(driver)
    ctx.report_now()
    info = driver.process_info()
    result = {**answer.payload(), "pid": info["pid"], "openclaw_status": info["status"]}
    if not answer.ok:
        raise CommandError(answer.message or f"{verb} failed", result=result)
    return result


def start_openclaw(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    return _act(ctx, "start", lambda driver: driver.start())


def stop_openclaw(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    return _act(ctx, "stop", lambda driver: driver.stop())


def restart_openclaw(ctx: AgentCall, payload: dict[str, Any]) -> dict[str, Any]:
    return _act(ctx, "restart", lambda driver: driver.restart())
