"""The composition root: the parts of one agent's runtime, built once.

`build_parts()` makes each collaborator (client and auth, outbox, state file,
sampler, the agent's driver, the subprocess pool) and the small shared objects
(`Wakeups`, `LiveStatus`, `Current`). `Parts` only holds them for the code that
starts threads and dispatches commands: a thread body or a command handler is
handed the few parts it uses, never `Parts` itself.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from caldera.agents.adapter.driver import open_adapter_driver
from caldera.agents.current import Current
from caldera.agents.updates import load_effective

# The registry, not base/service: those (with codex_config's tomllib) wait for the first
# agent_run (code an adapter daemon never runs; docs/performance.md, section 2).
from caldera.backends.registry import ActiveRuns, BackendServers
from caldera.backends.registry import capabilities as backend_capabilities
from caldera.config import AgentPaths, Settings
from caldera.daemon.governance import LLMFields, SandboxHealth
from caldera.daemon.live import LiveStatus
from caldera.daemon.reporter import ReportFloor, Reports
from caldera.daemon.wakeups import Wakeups
from caldera.errors import ConfigError
from caldera.host import stateformat
from caldera.host.fsutil import ensure_dir
from caldera.host.sampler import Sampler
from caldera.host.statefile import StateFile
from caldera.host.storage import StorageHealth
from caldera.protocol.client import ControlPlaneClient, Transport
from caldera.protocol.outbox import Outbox, outbox_health
from caldera.protocol.payloads import BASE_CAPABILITIES, Identity, register_body
from caldera.protocol.session import Auth, SessionFile
from caldera.redact import Redactor
from caldera.skills.publish import Publisher

if TYPE_CHECKING:
    from collections.abc import Callable

    from caldera.agents.manifest import Manifest
    from caldera.agents.process.driver import ProcessDriver

log = logging.getLogger("caldera.daemon")
SUBPROCESS_WORKERS = 4
STATE_SUBDIRS = ("logs", "cache", "skills", "runs")


class Parts:
    __slots__ = ("paths", "current", "redactor", "wake", "live", "outbox", "state", "sampler", "pool", "identity",
                 "runs", "servers", "reports", "publisher", "client", "auth")

    paths: AgentPaths
    current: Current
    redactor: Redactor
    wake: Wakeups
    live: LiveStatus
    outbox: Outbox
    state: StateFile
    sampler: Sampler
    pool: ThreadPoolExecutor
    identity: Identity
    runs: ActiveRuns  # the code-agent runs going on now
    servers: BackendServers  # what the backends keep between runs (OpenCode's server): closed at stop
    reports: Reports
    publisher: Publisher
    client: ControlPlaneClient | None  # when the agent is enabled
    auth: Auth | None  # with the client

    def __init__(self, paths: AgentPaths, current: Current, redactor: Redactor, wake: Wakeups, live: LiveStatus,
                 outbox: Outbox, state: StateFile, sampler: Sampler, pool: ThreadPoolExecutor, identity: Identity,
                 runs: ActiveRuns, servers: BackendServers, reports: Reports, publisher: Publisher,
                 client: ControlPlaneClient | None = None, auth: Auth | None = None) -> None:
        self.paths = paths
        self.current = current
        self.redactor = redactor
        self.wake = wake
        self.live = live
        self.outbox = outbox
        self.state = state
        self.sampler = sampler
        self.pool = pool
        self.identity = identity
        self.runs = runs
        self.servers = servers
        self.reports = reports
        self.publisher = publisher
        self.client = client
        self.auth = auth

    @property
    def settings(self) -> Settings:
        return self.current.settings

    def connected(self, client: ControlPlaneClient, auth: Auth) -> Parts:
        """A copy with the client and its auth (as dataclasses.replace made: what holds this
        one keeps it as it was)."""
        return Parts(self.paths, self.current, self.redactor, self.wake, self.live, self.outbox, self.state,
                     self.sampler, self.pool, self.identity, self.runs, self.servers, self.reports, self.publisher,
                     client=client, auth=auth)

    def connection(self) -> tuple[ControlPlaneClient, Auth]:
        """The client and auth of a runtime that talks to the plane (`run`'s connected loop,
        `report --once`, the executor). Their callers check `client` first (`run` stays
        local, `report --once` exits 1): a ValueError here is a caller's bug."""
        if self.client is None or self.auth is None:
            raise ValueError("this runtime is not connected to a control plane (CALDERA_AGENT_ENABLED)")
        return self.client, self.auth


def build_parts(paths: AgentPaths, settings: Settings, *, with_client: bool = True, with_driver: bool = True,
                supervise: bool = True) -> Parts:
    """supervise: the daemon supervises a process-mode agent; `report --once` passes False
    and gets a driver that only reports what state.json and /proc say."""
    ensure_dir(paths.state_dir)
    # First, before any part opens a file there: a newer caldera's state is refused
    # untouched, an older release's migrated (caldera/host/stateformat.py).
    stateformat.prepare(paths.state_dir)
    for sub in STATE_SUBDIRS:
        ensure_dir(paths.state_dir / sub)
    redactor = Redactor(settings.secret_values)
    manifest = _load_manifest(paths)
    name = (manifest.name if manifest is not None else None) or paths.name
    wake = Wakeups()
    storage = StorageHealth()  # the state dir's failing writes (a full disk), shared by the state file and the outbox
    outbox = Outbox(paths.state_dir / "outbox", wakeup=wake.outbox, storage=storage)
    current = Current(settings=settings, manifest=manifest)
    live = LiveStatus()
    live.count_drops("outbox", lambda: outbox.dropped)
    runs = ActiveRuns()
    live.count_drops("events", lambda: runs.events_dropped)
    state = StateFile(paths.state_dir / "state.json", storage=storage)
    sampler = Sampler(persistent_dir=str(settings.persistent_dir), runtime_type=settings.runtime_type,
                      runtime_name=name, disk_limit_bytes=settings.disk_limit_bytes)
    identity = Identity(agent_id=settings.agent_id, agent_name=paths.name, runtime_name=name,
                        capabilities=tuple(_capabilities(settings)))
    parts = Parts(
        paths=paths, current=current, redactor=redactor, wake=wake, live=live, outbox=outbox, state=state,
        sampler=sampler, pool=ThreadPoolExecutor(SUBPROCESS_WORKERS, thread_name_prefix="caldera-proc"),
        identity=identity, runs=runs, servers=BackendServers(paths.state_dir / "runs"),
        reports=Reports(identity=identity, current=current, state=state, sampler=sampler, live=live,
                        redactor=redactor,
                        health_extra=_health_extra(outbox, storage, SandboxHealth(current, redactor)),
                        floor=ReportFloor(generation=wake.generation), llm=LLMFields(current, paths, redactor)),
        publisher=Publisher(state_dir=paths.state_dir, env=lambda: current.settings.env,
                            runtime_type=settings.runtime_type, agent_id=identity.agent_id, outbox=outbox,
                            state=state, on_count=live.set_skill_count, report_now=wake.report_now),
    )
    if with_driver and manifest is not None and manifest.runtime_type == "adapter":
        # The plain checks of the adapter's answers and of the manifest (the schemas' verdict:
        # tests hold the two together), as `report --once` has them: jsonschema on every
        # report kept the manifest schema, its validator and the garbage of its branches in
        # the daemon (docs/performance.md, section 2) and cost CPU each time. Command payloads
        # are still validated against their schemas.
        current.replace(driver=open_adapter_driver(paths, manifest, pool=parts.pool, redactor=redactor,
                                                   schema_checks=False, state=parts.state))
    if with_driver and manifest is not None and manifest.runtime_type == "process":
        current.replace(driver=_process_driver(parts, manifest, supervise=supervise))
    if with_client and settings.enabled:
        client, auth = _build_client(parts)
        parts = parts.connected(client, auth)
    return parts


def close_servers(parts: Parts) -> None:
    """Stop what the backends keep between runs (OpenCode's server), once no command can use
    it: `run`'s stop sequence after the lanes (and before a restart in place: exec keeps the
    pid, and a server whose owner still runs is never removed as a leftover), `report --once`
    at its end. A failure is logged and the stop goes on (the next start removes what is left)."""
    try:
        parts.servers.close()
    except Exception:  # noqa: BLE001 -- the rest of the stop sequence must run
        log.exception("stopping the backends' servers failed")


def _health_extra(outbox: Outbox, storage: StorageHealth,
                  sandbox: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """The state report's health entries beyond the reporter's own: the outbox's held-back
    items, the state dir's failing writes, what confines the code agents' commands."""
    return lambda: {**outbox_health(outbox), **storage.health(), **sandbox()}


def _capabilities(settings: Settings) -> list[str]:
    extra = backend_capabilities(settings.env)
    return BASE_CAPABILITIES + [c for c in extra if c not in BASE_CAPABILITIES]


def _process_driver(parts: Parts, manifest: Manifest, supervise: bool) -> ProcessDriver:
    """Process mode (SPEC 7b). The daemon supervises; `report --once` gets a driver that
    only reports what state.json and /proc say."""
    # deferred: an adapter-mode daemon never loads process mode (docs/performance.md, section 2)
    from caldera.agents.process.driver import open_process_driver

    return open_process_driver(parts.paths, manifest, state=parts.state, redactor=parts.redactor,
                               report_interval=parts.current.settings.report_interval, supervise=supervise,
                               report_now=parts.wake.report_now)


def _load_manifest(paths: AgentPaths) -> Manifest | None:
    """The effective manifest: the installed one with a stored blueprint update over it."""
    if not paths.manifest_path.is_file():
        return None
    return load_effective(paths, cache_dir=paths.state_dir / "cache")


def _build_client(parts: Parts) -> tuple[ControlPlaneClient, Auth]:
    settings = parts.settings
    base_url, token, instance_id = settings.base_url, settings.bootstrap_token, settings.instance_id
    if base_url is None or token is None or instance_id is None:  # load_settings refuses that when enabled
        raise ConfigError("an enabled agent needs CALDERA_BASE_URL, CALDERA_TOKEN and CALDERA_INSTANCE_ID")
    transport = Transport(base_url, ca_bundle=settings.ca_bundle, on_reconnect=parts.wake.reconnected)
    session_file = SessionFile(parts.paths.state_dir / "session.json", base_url, instance_id,
                               parts.identity.agent_id)
    client: ControlPlaneClient  # assigned below: register is called only after both exist

    def register() -> dict[str, Any]:  # the first call that needs a session makes it
        return client.register(register_body(parts.identity, parts.settings))

    auth = Auth(bootstrap_token=token, session_file=session_file, register=register, redactor=parts.redactor)
    client = ControlPlaneClient(transport, auth)
    return client, auth
