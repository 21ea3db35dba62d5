"""Control-plane commands `agent_run` and `agent_interrupt` (SPEC sections 8 and 10).

Of the CommandContext a handler uses only `paths` (`state_dir`, `secrets_dir`),
`settings.env`, `redactor`, `client` (or None), `agent_id`, `runs` (the ActiveRuns
registry), `cancel` and `deadline`.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.backends import base, service
from caldera.backends.events import Listener
from caldera.backends.poster import EventPoster
from caldera.errors import CommandError

if TYPE_CHECKING:
    from caldera.daemon.dispatch import CommandContext
    from caldera.redact import Redactor

log = logging.getLogger("caldera.backends")


def environment_for(ctx: CommandContext) -> base.Environment:
    env = dict(ctx.settings.env)
    state = ctx.paths.state_dir
    return base.Environment(
        redactor=ctx.redactor, logs_dir=str(state / "logs"), runs_dir=str(state / "runs"),
        secrets_dir=str(ctx.paths.secrets_dir),
        credentials_dir=env.get("CREDENTIALS_DIRECTORY") or os.environ.get("CREDENTIALS_DIRECTORY"),
        env=env)


def agent_run(ctx: CommandContext, payload: dict[str, Any]) -> dict[str, Any]:
    environment = environment_for(ctx)
    listeners: list[Listener] = []
    poster = None
    if ctx.client is not None:
        poster = EventPoster(ctx.client, ctx.agent_id, payload["run_id"], _note(ctx.redactor))
        listeners.append(poster)
    try:
        result = service.execute(
            payload, environment, roots=service.workspace_roots(environment.env), listeners=listeners,
            cancel=ctx.cancel, deadline=ctx.deadline or None, registry=ctx.runs)
    finally:
        if poster is not None:
            poster.close()
            ctx.runs.count_dropped(poster.dropped)
    result = ctx.redactor(result)
    if result["status"] == "completed":
        return result
    if result["status"] == "blocked":
        raise CommandError(f"refused: {result['message']}", result=result)
    raise CommandError(f"run {result['status']}: {result['failure_kind']}: {result.get('message') or ''}".rstrip(": "),
                       result=result)


def agent_interrupt(ctx: CommandContext, payload: dict[str, Any]) -> dict[str, Any]:
    run_id = payload["run_id"]
    reached = ctx.runs.interrupt(run_id)
    if reached is None:
        raise CommandError(f"no run {run_id} is running or waiting here")
    # "queued": accepted but not started; it ends cancelled as soon as its turn is prepared
    return {"run_id": run_id, "interrupt": "requested", "run": reached}


def _note(redactor: Redactor) -> Callable[[str], None]:
    return lambda text: log.warning("%s", redactor.text(text))
