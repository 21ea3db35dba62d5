"""One run, end to end, for both `agent_run` and `caldera turn`: the policy check
(workspace under the configured roots, never wider than the caps), the run log,
the event sink and its listeners, the backend contract, and the finish result.

Policy caps come from agent.env (SPEC section 10, docs/backends.md):

| variable | default | meaning |
| --- | --- | --- |
| CALDERA_WORKSPACE_ROOTS | an instance's CLAWMANAGER_PROJECT_PATH, else none: agent_run refused | colon-separated |
| CALDERA_RUN_MAX_TIMEOUT_SECONDS | 3600 | largest timeout_seconds a run may ask for |
| CALDERA_RUN_MAX_SANDBOX | workspace-write | read-only or workspace-write |
| CALDERA_RUN_ALLOW_NETWORK | false | whether network: true may be asked for |
| CALDERA_RUN_ALLOW_APPROVAL | false | whether approval: on-request may be asked for |
| CALDERA_RUN_SANDBOX | (each backend's own sandbox) | external: the container is the sandbox (refused elsewhere) |
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from caldera import config
from caldera.backends import base, confine, events, registry
from caldera.backends import runlog as runlog_mod
from caldera.backends.registry import ActiveRuns, Refused
from caldera.errors import ConfigError

DEFAULT_TIMEOUT_SECONDS = 600
DEFAULT_MAX_TIMEOUT_SECONDS = 3600
FINISH_MARGIN = 5.0  # seconds kept back from the command's deadline to end the run cleanly


# ---------------------------------------------------------------- policy

def caps(env: Mapping[str, str]) -> dict[str, Any]:
    try:
        return config.run_caps(env, sandboxes=base.SANDBOXES, default_max_timeout=DEFAULT_MAX_TIMEOUT_SECONDS)
    except ConfigError as exc:
        raise Refused(str(exc)) from None


def policy_from_request(requested: dict[str, Any] | None, env: Mapping[str, str]) -> base.Policy:
    """The run's policy: the request within the caps. A wider request is refused, not narrowed."""
    requested = requested or {}
    limits = caps(env)
    timeout = requested.get("timeout_seconds", min(DEFAULT_TIMEOUT_SECONDS, limits["max_timeout_seconds"]))
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1:
        raise Refused(f"execution_policy.timeout_seconds={timeout!r}: a whole number of seconds, at least 1")
    if timeout > limits["max_timeout_seconds"]:
        raise Refused(f"execution_policy.timeout_seconds={timeout} exceeds this agent's limit of "
                      f"{limits['max_timeout_seconds']} s")
    sandbox = requested.get("sandbox", limits["max_sandbox"])
    if sandbox not in base.SANDBOXES:
        raise Refused(f"execution_policy.sandbox={sandbox!r}: one of {', '.join(base.SANDBOXES)}")
    if base.SANDBOXES.index(sandbox) > base.SANDBOXES.index(limits["max_sandbox"]):
        raise Refused(f"execution_policy.sandbox={sandbox} is wider than this agent allows ({limits['max_sandbox']})")
    approval = requested.get("approval", "never")
    if approval not in base.APPROVALS:
        raise Refused(f"execution_policy.approval={approval!r}: one of {', '.join(base.APPROVALS)}")
    if approval != "never" and not limits["allow_approval"]:
        raise Refused("execution_policy.approval=on-request is not allowed on this agent")
    network = requested.get("network", False)
    if not isinstance(network, bool):
        raise Refused(f"execution_policy.network={network!r}: true or false")
    if network and not limits["allow_network"]:
        raise Refused("execution_policy.network=true is not allowed on this agent")
    # The container as the sandbox widens a workspace-write run's commands only: a read-only run
    # keeps its backend's own sandbox, which alone can keep a command from writing.
    external = sandbox == "workspace-write" and registry.confinement(env) == registry.CONFINEMENT_EXTERNAL
    return base.Policy(timeout_seconds=timeout, sandbox=sandbox, approval=approval, network=network,
                       external=external)


def model_from_request(model: object) -> str | None:
    """The payload's `model`, or Refused: a name, so one line of printable text. A control
    character would reach a CLI's argv (a NUL byte is a ValueError of subprocess's), an
    environment variable or a TOML file; checked here once for every backend."""
    if model is None:
        return None
    if not isinstance(model, str):
        raise Refused(f"model: a model name (a string) is required, not {type(model).__name__}")
    if not model.isprintable():
        raise Refused(f"model {model[:80]!r}: a model name of printable characters is required "
                      "(no control character)")
    return model


def workspace_roots(env: Mapping[str, str]) -> list[Path]:
    return [Path(os.path.realpath(p)) for p in config.workspace_roots(env)]


def guarded_paths(environment: base.Environment) -> tuple[list[str], list[str]]:
    """What no workspace may be or lie under (the runtime's config and state roots), and what
    it may not be (the instance's persistent dir, the agent's private paths); real paths.
    Bound whole into a run's sandbox, they would show every agent's secrets.env and
    session.json; a workspace above them stays allowed (the sandbox hides them again inside
    it), and one under a private path shows only itself (its secrets stay hidden). Under the
    persistent dir is allowed: ClawManager's default one is `/config`, which holds the project
    (`/config/workspace`) beside the state root (`/config/caldera-agent`)."""
    roots = [environment.config_root, environment.state_root]
    state_dir = os.path.dirname(os.path.abspath(environment.logs_dir))
    private = confine.private_paths(environment.secrets_dir, state_dir, environment.credentials_dir)
    persistent = [os.path.realpath(environment.persistent_dir)] if environment.persistent_dir else []
    return sorted({os.path.realpath(p) for p in roots if p} - {"/"}), [*private, *persistent]


def check_workspace(workspace: object, roots: list[Path] | None,
                    guarded: tuple[list[str], list[str]] = ([], [])) -> str:
    """The workspace's real path; Refused unless it is a directory under one of `roots`, and
    neither one of `guarded`'s roots nor under one, nor one of its other paths
    (`guarded_paths`).

    `roots=None` skips the roots check (the local `caldera turn`, where the person at the
    host picks the directory).
    """
    if not isinstance(workspace, str) or not workspace.startswith("/"):
        raise Refused(f"workspace {workspace!r}: an absolute path is required")
    real = Path(os.path.realpath(workspace))
    holder = confine.within(str(real), guarded[0]) or (str(real) if str(real) in guarded[1] else None)
    if holder is not None:
        raise Refused(f"workspace {workspace} is or lies in {holder}, one of the runtime's roots or this agent's "
                      "private paths, which no run may read: pick a workspace outside them")
    if roots is not None:
        if not roots:
            raise Refused("no workspace roots are configured (CALDERA_WORKSPACE_ROOTS in agent.env, or "
                          "CLAWMANAGER_PROJECT_PATH in a ClawManager instance)")
        if not any(real == root or root in real.parents for root in roots):
            raise Refused(f"workspace {workspace} is not under the configured workspace roots")
    if not real.is_dir():
        raise Refused(f"workspace {workspace} is not a directory")
    return str(real)


# ---------------------------------------------------------------- active runs

class RunHandle:
    """One run in ActiveRuns: an interrupt reaches its backend once the turn is prepared."""

    def __init__(self, run_id: str, backend: base.Backend[Any]):
        self.run_id = run_id
        self.backend = backend
        self.context: base.RunContext | None = None  # the backend's, once prepared
        self.interrupted = False
        self._lock = threading.Lock()

    def prepared(self, context: base.RunContext) -> None:
        with self._lock:
            self.context = context
            early = self.interrupted
        if early:
            self.backend.interrupt(context)

    def interrupt(self) -> None:
        with self._lock:
            self.interrupted = True
            context = self.context
        if context is not None:
            self.backend.interrupt(context)


# ---------------------------------------------------------------- one run

def execute(request: dict[str, Any], environment: base.Environment, *, roots: list[Path] | None,
            listeners: Iterable[events.Listener] = (), cancel: threading.Event | None = None,
            deadline: float | None = None, registry: ActiveRuns | None = None) -> dict[str, Any]:
    """Run one turn described by an agent_run-shaped `request`; return the finish result.

    Never raises for the run's own failures: they are in the result (status, failure_kind)
    and in the events, which always end with one terminal_status.
    """
    run_id = request["run_id"]
    log = runlog_mod.RunLog(runlog_mod.log_path(environment.logs_dir, run_id), environment.redactor)
    sink = events.EventSink(run_id, environment.redactor, log, listeners)
    try:
        log.note(f"run {run_id} requested: backend {request.get('backend_profile') or base.DEFAULT_PROFILE}")
        _run(request, environment, sink, roots, cancel, deadline, registry)
    finally:
        log.close()
    terminal = sink.terminal_data()
    return {"run_id": run_id, "status": terminal["status"], "failure_kind": terminal.get("failure_kind"),
            "message": terminal.get("message"), "events_total": sink.total, "events": list(sink.last),
            "log": str(log.path)}


def _run(request: dict[str, Any], environment: base.Environment, sink: events.EventSink, roots: list[Path] | None,
         cancel: threading.Event | None, deadline: float | None, registry: ActiveRuns | None) -> None:
    try:
        workspace = check_workspace(request.get("workspace"), roots, guarded_paths(environment))
        policy = policy_from_request(request.get("execution_policy"), environment.env)
        model = model_from_request(request.get("model"))
        backend = base.get_backend(request.get("backend_profile") or base.DEFAULT_PROFILE)
    except (Refused, ValueError) as exc:
        sink.emit("terminal_status", {"status": "blocked", "failure_kind": None, "message": str(exc)})
        return
    if deadline is not None:  # end cleanly before the command's own deadline cancels us
        room = int(deadline - time.monotonic() - FINISH_MARGIN)
        if room < policy.timeout_seconds:
            policy = base.Policy(max(1, room), policy.sandbox, policy.approval, policy.network, policy.external)
    run = base.RunRequest(run_id=request["run_id"], prompt=request["prompt"], workspace=workspace,
                          policy=policy, backend_profile=backend.name, model=model)
    handle = RunHandle(run.run_id, backend)
    if registry is not None:
        try:
            registry.add(handle)
        except Refused as exc:
            sink.emit("terminal_status", {"status": "blocked", "failure_kind": None, "message": str(exc)})
            return
    try:
        def prepared(context: base.RunContext) -> None:
            context.cancel = cancel
            context.cancel_is_timeout = (lambda: deadline is not None and time.monotonic() >= deadline - 1.0)
            handle.prepared(context)

        base.run_turn(backend, run, environment, sink, on_prepared=prepared)
    finally:
        if registry is not None:
            registry.remove(run.run_id)
