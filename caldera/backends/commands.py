"""Control-plane commands `agent_run` and `agent_interrupt` (SPEC sections 8 and 10).

Usable without the daemon: a handler needs only `ctx.runtime` with `paths`
(`state_dir`, `secrets_dir`), `settings.env`, `redactor` and `client` (or None),
plus `ctx.cancel` and `ctx.deadline`.
"""
from __future__ import annotations

import logging
import os

from caldera.backends import base, service
from caldera.backends.poster import EventPoster
from caldera.errors import CommandError


def environment_for(runtime) -> base.Environment:
    env = dict(runtime.settings.env)
    state = runtime.paths.state_dir
    return base.Environment(
        redactor=runtime.redactor, logs_dir=str(state / "logs"), runs_dir=str(state / "runs"),
        secrets_dir=str(runtime.paths.secrets_dir),
        credentials_dir=env.get("CREDENTIALS_DIRECTORY") or os.environ.get("CREDENTIALS_DIRECTORY"),
        env=env)


def agent_run(ctx, payload: dict) -> dict:
    runtime = ctx.runtime
    environment = environment_for(runtime)
    listeners, poster = [], None
    if getattr(runtime, "client", None) is not None:
        poster = EventPoster(runtime.client, runtime.agent_id, payload["run_id"], _note(runtime))
        listeners.append(poster)
    try:
        result = service.execute(
            payload, environment, roots=service.workspace_roots(environment.env), listeners=listeners,
            cancel=ctx.cancel, deadline=ctx.deadline or None, registry=service.active_runs(runtime))
    finally:
        if poster is not None:
            poster.close()
    result = runtime.redactor(result)
    if result["status"] == "completed":
        return result
    if result["status"] == "blocked":
        raise CommandError(f"refused: {result['message']}", result=result)
    raise CommandError(f"run {result['status']}: {result['failure_kind']}: {result.get('message') or ''}".rstrip(": "),
                       result=result)


def agent_interrupt(ctx, payload: dict) -> dict:
    run_id = payload["run_id"]
    handle = service.active_runs(ctx.runtime).get(run_id)
    if handle is None:
        raise CommandError(f"no run {run_id} is running here")
    handle.interrupt(ctx.command if hasattr(ctx, "command") else None)
    return {"run_id": run_id, "interrupt": "requested"}


def _note(runtime):
    log = logging.getLogger("caldera.backends")
    return lambda text: log.warning("%s", runtime.redactor.text(text))
