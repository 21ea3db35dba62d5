"""Control-plane commands `agent_run` and `agent_interrupt` (SPEC sections 8 and 10),
given a `RunCall`."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.backends import base, service
from caldera.backends.events import Listener
from caldera.backends.poster import EventPoster, plane_takes_events
from caldera.backends.registry import ActiveRuns, BackendServers
from caldera.backends.runlog import log_path
from caldera.errors import CommandError
from caldera.protocol.handlers import Call

if TYPE_CHECKING:
    import threading

    from caldera.config import AgentPaths
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.command import Command
    from caldera.redact import Redactor

log = logging.getLogger("caldera.backends")


class RunCall(Call):
    """What the run commands use: the agent's id, its paths (state and secrets dirs), its environment
    as current when the command started, the redactor, the client (None when not
    connected: events are not posted), the registry of the runs going on now, and what the
    backends keep for the agent between runs (OpenCode's server)."""

    __slots__ = ("agent_id", "paths", "env", "redactor", "client", "runs", "servers")

    agent_id: str
    paths: AgentPaths
    env: dict[str, str]
    redactor: Redactor
    client: ControlPlaneClient | None
    runs: ActiveRuns
    servers: BackendServers

    def __init__(self, command: Command, cancel: threading.Event, deadline: float, agent_id: str, paths: AgentPaths,
                 env: dict[str, str], redactor: Redactor, client: ControlPlaneClient | None, runs: ActiveRuns,
                 servers: BackendServers) -> None:
        super().__init__(command, cancel, deadline)
        self.agent_id = agent_id
        self.paths = paths
        self.env = env
        self.redactor = redactor
        self.client = client
        self.runs = runs
        self.servers = servers


def environment_for(ctx: RunCall) -> base.Environment:
    env = dict(ctx.env)
    state = ctx.paths.state_dir
    return base.Environment(
        redactor=ctx.redactor, logs_dir=str(state / "logs"), runs_dir=str(state / "runs"),
        secrets_dir=str(ctx.paths.secrets_dir),
        credentials_dir=env.get("CREDENTIALS_DIRECTORY") or os.environ.get("CREDENTIALS_DIRECTORY"),
        env=env, servers=ctx.servers, **base.roots(env))


def agent_run(ctx: RunCall, payload: dict[str, Any]) -> dict[str, Any]:
    environment = environment_for(ctx)
    listeners: list[Listener] = []
    poster = None
    if ctx.client is not None and plane_takes_events(ctx.client):
        poster = EventPoster(ctx.client, ctx.agent_id, payload["run_id"], _note(ctx.redactor),
                             log_file=_run_log(environment, payload["run_id"]), dropped=ctx.runs.count_dropped)
        listeners.append(poster)
    try:
        result = service.execute(
            payload, environment, roots=service.workspace_roots(environment.env), listeners=listeners,
            cancel=ctx.cancel, deadline=ctx.deadline or None, registry=ctx.runs)
    finally:
        if poster is not None:
            poster.close()  # what the plane did not take yet is posted on in the background (poster.py)
    result = ctx.redactor(result)
    if result["status"] == "completed":
        return result
    if result["status"] == "blocked":
        raise CommandError(f"refused: {result['message']}", result=result)
    raise CommandError(f"run {result['status']}: {result['failure_kind']}: {result.get('message') or ''}".rstrip(": "),
                       result=result)


def agent_interrupt(ctx: RunCall, payload: dict[str, Any]) -> dict[str, Any]:
    run_id = payload["run_id"]
    reached = ctx.runs.interrupt(run_id)
    if reached is None:
        raise CommandError(f"no run {run_id} is running or waiting here")
    # "queued": accepted but not started; it ends cancelled as soon as its turn is prepared
    return {"run_id": run_id, "interrupt": "requested", "run": reached}


def _run_log(environment: base.Environment, run_id: Any) -> str | None:
    try:
        return str(log_path(environment.logs_dir, run_id))
    except (TypeError, ValueError):
        return None  # a run id the run refuses: it posts nothing either


def _note(redactor: Redactor) -> Callable[[str], None]:
    return lambda text: log.warning("%s", redactor.text(text))
