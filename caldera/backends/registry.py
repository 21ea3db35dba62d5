"""What the daemon needs of the backends before any run: the profile names, the
capabilities they give `register`, and the registry of the runs going on now.

Light on purpose (no backend, no TOML parser, no event or failure tables): a daemon
that never gets an `agent_run` imports only this module of the backends; the rest
(base, service, codex_config with tomllib, events, failures, runlog) waits for the
first run (what that saves: docs/performance.md, section 2). `base` and `service`
re-export these names.
"""
from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar, cast

from caldera import config
from caldera.config import Gateway, gateway_from_env
from caldera.errors import ConfigError
from caldera.host.fsutil import which
from caldera.protocol.llm import EXTERNAL, LLMConfig, gateway_config

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("caldera.backends")
DEFAULT_PROFILE = "codex"
# profile name -> "module:Class"; the class is imported only when a run needs it.
PROFILES = {
    "codex": "caldera.backends.codex.backend:CodexBackend",
    "claude-code": "caldera.backends.claude_code.backend:ClaudeCodeBackend",
    "opencode": "caldera.backends.opencode.driver:OpenCodeBackend",
}
# profile name -> (its binary variable's reader in config, the program's name on PATH):
# enough to say whether it is installed without importing it or starting a process.
BINARIES = {
    "codex": (config.codex_binary, "codex"),
    "claude-code": (config.claude_code_binary, "claude"),
    "opencode": (config.opencode_binary, "opencode"),
}


class LLMSource(NamedTuple):
    """How a backend says what its runs get to reach a model (the state report's LLM fields).

    `describe` is "module:function", called as function(env, secrets_dir, credentials_dir) ->
    caldera.protocol.llm.LLMConfig | None (None: its runs get no provider). `projection` names its secret
    projection (`<secrets>/<it>/`, `$CREDENTIALS_DIRECTORY/<it>/` or `<it>_*` files there): when
    none of it exists and none of `variables` is set, `describe` is not imported (a daemon that
    runs no turn stays light) and the runs get the AI gateway, if there is one (`gateway`;
    False: a backend that never uses it, whose runs then get nothing); None: `describe` is
    always asked."""
    describe: str
    projection: str | None = None
    variables: tuple[str, ...] = ()  # the runtime's variables that, when set, are a source too
    gateway: bool = True


# profile name -> what its runs get (docs/container.md, "What the report says of the LLM configuration").
LLM_SOURCES = {
    "codex": LLMSource("caldera.backends.codex.config:llm_config", projection="codex"),
    # Claude Code on the gateway: its Anthropic Messages route (<BASE>/v1/messages).
    "claude-code": LLMSource("caldera.backends.claude_code.config:llm_config", projection="claude-code"),
    # OpenCode also takes ClawManager's OPENCODE_CONFIG_CONTENT (its provider: the gateway's, or not)
    "opencode": LLMSource("caldera.backends.opencode.provider:llm_config", projection="opencode",
                          variables=("OPENCODE_CONFIG_CONTENT",)),
}


class Refused(Exception):
    """The request is wider than the agent's configured policy, or otherwise not allowed."""


# What keeps a run's commands in: each backend's own sandbox (Codex's and Claude Code's
# bubblewrap, OpenCode's commands under caldera's), or the container the operator declared
# to be the sandbox (CALDERA_RUN_SANDBOX=external; docs/container.md).
CONFINEMENT_BACKEND, CONFINEMENT_EXTERNAL = "backend", "external"


def confinement(env: Mapping[str, str]) -> str:
    """The confinement the agent's workspace-write runs get: CONFINEMENT_EXTERNAL with
    CALDERA_RUN_SANDBOX=external on a container, else CONFINEMENT_BACKEND. Refused (every run
    blocked with the sentence) for a bad value, and for `external` on a host that is not a
    container: nothing would be around the commands there."""
    try:
        external = config.run_sandbox_external(env)
    except ConfigError as exc:
        raise Refused(str(exc)) from None
    if not external:
        return CONFINEMENT_BACKEND
    from caldera.host import container  # here: only a host with the setting reads /proc/1

    # the process's environment and PID 1's only, never `env`: agent.env (which the agent's
    # configuration writes) saying container= would take its commands out of every sandbox
    if container.evidence() is None:
        raise Refused(f"{config.RUN_SANDBOX}=external states that the container is the sandbox, but this "
                      "host is not a container (no container runtime's mark, no Kubernetes pod, caldera "
                      "run is not PID 1): remove it and let each backend's own sandbox confine its commands")
    return CONFINEMENT_EXTERNAL


def gateway_settings(environ: Mapping[str, str]) -> Gateway | None:
    """ClawManager's AI gateway when the environment carries one (config.gateway_from_env)."""
    return gateway_from_env(environ)


def projected(name: str, secrets_dir: str | None, credentials_dir: str | None) -> bool:
    """Any file of the projection `name` is there (LLMSource.projection)."""
    if secrets_dir and os.path.isdir(os.path.join(secrets_dir, name)):
        return True
    if not credentials_dir:
        return False
    try:
        return any(entry == name or entry.startswith(f"{name}_") for entry in os.listdir(credentials_dir))
    except OSError:
        return False


def llm_configs(env: Mapping[str, str], secrets_dir: str | None, credentials_dir: str | None) -> list[LLMConfig]:
    """What each backend's control-plane runs get to reach a model; none without workspace roots
    (CALDERA_WORKSPACE_ROOTS: no run can start there). A backend whose description fails while
    a projection of its own is there counts as `external` all the same: a provider of its own
    is configured, and the governance view must not lose that to an unreadable file."""
    if not config.workspace_roots(env):
        return []
    out = []
    for profile, source in LLM_SOURCES.items():
        label = f"backend {profile}"
        if (source.projection is not None and not projected(source.projection, secrets_dir, credentials_dir)
                and not any(env.get(name) for name in source.variables)):
            gateway = gateway_from_env(env) if source.gateway else None
            found = gateway_config(gateway, label) if gateway is not None else None
        else:
            module, function = source.describe.split(":")
            try:
                describe: Callable[..., LLMConfig | None] = getattr(importlib.import_module(module), function)
                found = describe(env, secrets_dir, credentials_dir)
            except Exception as exc:  # noqa: BLE001 -- the report goes out; the backend is named
                log.debug("the LLM configuration of %s could not be read: %s", label, type(exc).__name__)
                found = LLMConfig(label, EXTERNAL)
        if found is not None:
            out.append(found)
    return out


def installed(profile: str, env: Mapping[str, str]) -> bool:
    """Whether the profile's CLI is there: its variable names an executable, or its program
    is on PATH (a light look: `caldera backends` and each run look closer)."""
    variable, program = BINARIES.get(profile, (None, profile))
    explicit = variable(env) if variable is not None else None
    if explicit:
        return os.access(explicit, os.X_OK)
    return which(program, env.get("PATH") or os.defpath) is not None


# the backends whose runs caldera's bubblewrap confines (backends/confine.py), and what their
# commands get where it cannot
UNBOXED = {"codex": "Codex's own sandbox only: its commands read every file this account can",
           "opencode": "Bash denied"}


def sandboxes(env: Mapping[str, str]) -> dict[str, str]:
    """What confines the commands of each installed backend of UNBOXED, as the state report
    says it (`health.code_agent_sandbox`): "bubblewrap", or what a run gets without it and
    why. {} without workspace roots (no run can start) or such a backend. Bubblewrap is
    probed once per process (backends/confine.py, imported only then)."""
    if not config.workspace_roots(env):
        return {}
    profiles = [profile for profile in UNBOXED if installed(profile, env)]
    if not profiles:
        return {}
    try:
        if confinement(env) == CONFINEMENT_EXTERNAL:  # the container is the sandbox: no box is made
            return dict.fromkeys(profiles, CONFINEMENT_EXTERNAL)
    except Refused:
        return {}  # every run is blocked: runtime.code_agent_confinement says "refused"
    from caldera.backends.confine import unavailable

    path = env.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
    found = {}
    for profile in profiles:
        why = unavailable(path)
        if why is not None and profile == "codex":  # its box falls back on the bwrap its package bundles
            from caldera.backends.codex.binary import bundled_bwrap, find_binary

            why = unavailable(path, bundled_bwrap(find_binary(env)))
        found[profile] = "bubblewrap" if why is None else f"{UNBOXED[profile]} ({why})"
    return found


def capabilities(env: Mapping[str, str] | None = None) -> list[str]:
    """Capability strings for `register.capabilities` (cheap: no process is started):
    `backend.<profile>` for each profile whose CLI is installed."""
    env = os.environ if env is None else env
    caps = ["agent.run", "agent.interrupt"]
    for name in PROFILES:
        if installed(name, env):
            caps.append(f"backend.{name}")

    if gateway_settings(env) is not None:
        caps.append("llm.gateway")
    return caps


class Held(Protocol):
    """A part a backend keeps for the agent between runs (OpenCode's server owner)."""

    def close(self) -> None: ...


HeldT = TypeVar("HeldT", bound=Held)


class BackendServers:
    """The long-lived parts the backends keep for the agent (OpenCode: the owner of the
    agent's `opencode serve`), one per profile: made by the backend's own `make(runs_dir)`
    on its first run (a daemon that never runs that backend imports none of it), held for the
    agent's life, closed in the stop sequence once the lanes are done, before a restart in
    place. After `close()`, `get` answers None: a run then keeps its own, for its turn only."""

    def __init__(self, runs_dir: str | os.PathLike[str]) -> None:
        self.runs_dir = str(runs_dir)
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}
        self._closed = False

    def get(self, profile: str, make: Callable[[str], HeldT]) -> HeldT | None:
        with self._lock:
            if self._closed:
                return None
            found = self._held.get(profile)
            if found is None:
                found = self._held[profile] = make(self.runs_dir)
            return cast("HeldT", found)  # made by this profile's own `make`

    def close(self) -> None:
        """Close every part made (each stops what it holds); idempotent."""
        with self._lock:
            self._closed = True
            held, self._held = list(self._held.values()), {}
        for part in held:
            part.close()


class LiveRun(Protocol):
    """A run going on now, as the registry sees it (`service.RunHandle` is one): its id, and the
    interrupt that reaches its backend (at once, or as soon as the turn is prepared)."""

    @property
    def run_id(self) -> str: ...

    def interrupt(self) -> None: ...


QUEUED_KEPT = 1000  # accepted runs not yet started that are remembered (oldest forgotten first)


class ActiveRuns:
    """run_id -> handle, so that agent_interrupt reaches a running agent_run; and the runs
    accepted but not started yet (queued behind another run, or between the command's start
    and the turn's), so that an interrupt sent then is not lost: the run is interrupted as
    soon as it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, LiveRun] = {}
        self._queued: dict[str, bool] = {}  # run_id -> interrupted before it started
        self.events_dropped = 0  # run events the plane never got (it was away too long)

    def queue(self, run_id: object) -> None:
        """An agent_run with this id was accepted (journaled); its turn has not started."""
        if not isinstance(run_id, str):
            return
        with self._lock:
            self._queued.setdefault(run_id, False)
            while len(self._queued) > QUEUED_KEPT:
                self._queued.pop(next(iter(self._queued)))

    def forget(self, run_id: object) -> None:
        """The run's command is finished: whatever it did, nothing waits for it any more."""
        if not isinstance(run_id, str):  # never queued
            return
        with self._lock:
            self._queued.pop(run_id, None)

    def interrupt(self, run_id: str) -> str | None:
        """'running' or 'queued' when the interrupt reached the run (now, or at its start);
        None when no such run is running or waiting here."""
        with self._lock:
            handle = self._runs.get(run_id)
            if handle is None and run_id in self._queued:
                self._queued[run_id] = True
                return "queued"
        if handle is None:
            return None
        handle.interrupt()
        return "running"

    def count_dropped(self, n: int) -> None:
        with self._lock:
            self.events_dropped += n

    def add(self, handle: LiveRun) -> None:
        with self._lock:
            if handle.run_id in self._runs:
                raise Refused(f"run {handle.run_id} is already running")
            self._runs[handle.run_id] = handle
            early = self._queued.pop(handle.run_id, False)
        if early:  # interrupted while it waited: the turn is interrupted as soon as it is prepared
            handle.interrupt()

    def remove(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def get(self, run_id: str) -> LiveRun | None:
        with self._lock:
            return self._runs.get(run_id)
