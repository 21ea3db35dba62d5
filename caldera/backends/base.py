"""The backend adapter contract of seed 003, the run request and policy, and the
registry of backend profiles.

    resolve_profile(profile, env, probe) -> capability record
    prepare(run, environment, sink) -> context
    start_turn(context) -> events (through the context's EventSink)
    interrupt(context)
    finalize(context) -> terminal status

Seed 003 also hands `prepare` and `interrupt` the command, and names a `redact(value)`:
no backend here uses the command, and every event is redacted by the EventSink with the
Environment's Redactor, so neither is part of the class.

`run_turn` drives one turn through the contract and guarantees exactly one
terminal_status, failures before anything was spawned included.
"""
from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

from caldera import config, errors
from caldera.backends import access
from caldera.backends import failures as fk
from caldera.backends.events import EVENT_TYPES, EventSink

# also named here (base.capabilities): the daemon imports them from the light registry (see there)
from caldera.backends.registry import (
    CONFINEMENT_BACKEND,
    CONFINEMENT_EXTERNAL,
    DEFAULT_PROFILE,
    PROFILES,
    BackendServers,
    Refused,
    capabilities,
)

if TYPE_CHECKING:
    from caldera.redact import Redactor

SANDBOXES = ("read-only", "workspace-write")
APPROVALS = ("never", "on-request")


@dataclass(frozen=True)
class Policy:
    timeout_seconds: int
    sandbox: str = "workspace-write"
    approval: str = "never"
    network: bool = False
    # The container is the sandbox (CALDERA_RUN_SANDBOX=external, a workspace-write run): the
    # backend runs the agent's commands without its own sandbox (registry.confinement).
    external: bool = False

    @property
    def confinement(self) -> str:
        return CONFINEMENT_EXTERNAL if self.external else CONFINEMENT_BACKEND

    def as_dict(self) -> dict[str, Any]:
        return {"timeout_seconds": self.timeout_seconds, "sandbox": self.sandbox,
                "approval": self.approval, "network": self.network, "confinement": self.confinement}


@dataclass(frozen=True)
class RunRequest:
    run_id: str
    prompt: str
    workspace: str
    policy: Policy
    backend_profile: str = DEFAULT_PROFILE
    model: str | None = None


@dataclass(frozen=True)
class Environment:
    """What a backend may use from the runtime: no daemon needed (tests, `caldera turn`)."""
    redactor: Redactor
    logs_dir: str
    runs_dir: str
    secrets_dir: str | None = None
    credentials_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # agent.env merged over os.environ
    servers: BackendServers | None = None  # the daemon's: what a backend keeps between runs (OpenCode's server)
    # The runtime's roots, which no run may read (every agent's config and secrets, every
    # agent's state): filled where the Environment is built, from `roots(env)`.
    config_root: str | None = None  # CALDERA_CONFIG_DIR (/etc/caldera)
    state_root: str | None = None  # CALDERA_STATE_DIR (/var/lib/caldera)
    persistent_dir: str | None = None  # a ClawManager instance's persistent dir (the state lives in it)


class Roots(TypedDict):
    config_root: str
    state_root: str
    persistent_dir: str | None


def roots(env: Mapping[str, str]) -> Roots:
    """Environment's root fields for a runtime with this environment (agent.env over os.environ)."""
    return {"config_root": str(config.config_root(env)), "state_root": str(config.state_root(env)),
            "persistent_dir": config.persistent_dir(env)}


class RunContext(Protocol):
    """What `service` sets on a prepared context: the command's cancel (timeout or operator)
    and whether that cancel was the command's own deadline."""
    cancel: threading.Event | None
    cancel_is_timeout: Callable[[], bool] | None


class Stoppable(RunContext, Protocol):
    """A context whose turn a backend ends early: its interrupt and its own deadline."""
    interrupt_event: threading.Event
    deadline: float  # time.monotonic()


def stop_reason(context: Stoppable) -> str | None:
    """Why the turn must end now: "cancelled" (agent_interrupt, the command's cancel),
    "timeout" (the policy's deadline, or the command's own) or None."""
    if context.interrupt_event.is_set():
        return "cancelled"
    if context.cancel is not None and context.cancel.is_set():
        is_timeout = context.cancel_is_timeout() if context.cancel_is_timeout else False
        return "timeout" if is_timeout else "cancelled"
    if time.monotonic() >= context.deadline:
        return "timeout"
    return None


ContextT = TypeVar("ContextT", bound=RunContext)


class Backend(Generic[ContextT]):
    """The seed-003 contract. A backend instance serves many runs; state lives in contexts."""

    name: ClassVar[str] = ""

    def resolve_profile(self, profile: str, env: Mapping[str, str] | None = None,
                        probe: bool = False) -> dict[str, Any]:
        raise NotImplementedError

    def prepare(self, run: RunRequest, environment: Environment, sink: EventSink) -> ContextT:
        raise NotImplementedError

    def start_turn(self, context: ContextT) -> None:
        raise NotImplementedError

    def interrupt(self, context: ContextT) -> bool:
        raise NotImplementedError

    def finalize(self, context: ContextT) -> dict[str, Any]:
        raise NotImplementedError


def get_backend(profile: str) -> Backend[Any]:
    target = PROFILES.get(profile or DEFAULT_PROFILE)
    if target is None:
        raise ValueError(f"unknown backend profile {profile!r} (known: {', '.join(PROFILES)})")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()


def describe(env: Mapping[str, str] | None = None, probe: bool = False) -> dict[str, Any]:
    """`caldera backends --json`: every profile's capability record."""
    env = os.environ if env is None else env
    return {"default": DEFAULT_PROFILE, "capabilities": capabilities(env),
            "backends": [get_backend(name).resolve_profile(name, env=env, probe=probe)
                         for name in PROFILES],
            "event_types": list(EVENT_TYPES), "failure_kinds": list(fk.FAILURE_KINDS)}


def run_turn(backend: Backend[ContextT], run: RunRequest, environment: Environment, sink: EventSink,
             on_prepared: Callable[[ContextT], None] | None = None) -> dict[str, Any]:
    """prepare -> start_turn -> finalize; returns the terminal event's data.

    `on_prepared(context)` is called once the context exists (before any process), so that
    an interrupt can reach the run.
    """
    context = None
    try:
        # Before the backend reads a file of it: a projection the account cannot use is one
        # sentence with its fix, never a PermissionError deep in a backend (issue 39).
        wrong = access.problem(environment.secrets_dir, backend.name, access.Reader.current())
        if wrong:
            raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, wrong)
        context = backend.prepare(run, environment, sink)
        if on_prepared is not None:
            on_prepared(context)
        backend.start_turn(context)
    except fk.BackendFailure as exc:
        _fail(sink, exc.kind, exc.message)
    except (Refused, errors.Refused) as exc:
        # not allowed as asked: a policy the backend cannot honour (refused, never widened), a
        # model the AI gateway does not offer
        if not sink.done:
            sink.emit("terminal_status", {"status": "blocked", "failure_kind": None, "message": str(exc)})
    except Exception as exc:
        # A bug in the adapter: the run still ends with its terminal event, and the error propagates.
        _fail(sink, fk.BACKEND_FAILED, f"internal error: {type(exc).__name__}: {exc}")
        raise
    finally:
        if context is not None:
            backend.finalize(context)
    if not sink.done:  # a bug path: never leave a run without its terminal event
        sink.emit("terminal_status", {"status": "failed", "failure_kind": fk.BACKEND_FAILED,
                                      "message": "the backend ended without a terminal status"})
    return sink.terminal_data()


def _fail(sink: EventSink, kind: str, message: str) -> None:
    if not sink.done:
        sink.emit("error", {"failure_kind": kind, "message": message})
        sink.emit("terminal_status", {"status": "failed", "failure_kind": kind, "message": message})
