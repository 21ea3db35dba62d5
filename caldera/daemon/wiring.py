"""`Runtime`: the dependencies the loops and command handlers are given.

It is a plain holder built once by `caldera run` or `caldera report --once`;
it owns no thread. Loops are functions in `caldera/loops/` that take it.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from caldera.config import AgentPaths, Settings
from caldera.host.fsutil import ensure_dir
from caldera.protocol.outbox import Outbox
from caldera.redact import Redactor
from caldera.protocol.payloads import BASE_CAPABILITIES, default_section
from caldera.host.statefile import StateFile

log = logging.getLogger("caldera.daemon.wiring")

SUBPROCESS_WORKERS = 4


@dataclass(eq=False)
class Runtime:
    paths: AgentPaths
    settings: Settings
    redactor: Redactor
    stop: threading.Event
    pool: ThreadPoolExecutor
    outbox: Outbox
    state: StateFile
    sampler: object
    client: object | None = None  # ControlPlaneClient when the agent is enabled
    auth: object | None = None
    driver: object | None = None  # the adapter driver when the manifest is an adapter
    manifest: object | None = None
    runtime_name: str = "caldera"
    draining: threading.Event = field(default_factory=threading.Event)
    report_wakeup: threading.Event = field(default_factory=threading.Event)
    poll_wakeup: threading.Event = field(default_factory=threading.Event)
    inventory_wakeup: threading.Event = field(default_factory=threading.Event)
    heartbeat_wakeup: threading.Event = field(default_factory=threading.Event)
    lanes: object | None = None  # caldera.daemon.lanes.Lanes in the daemon
    last_sample: object | None = None
    skill_count: int | None = None
    last_section: dict = field(default_factory=default_section)
    ticks: dict = field(default_factory=dict)  # loop name -> monotonic time of its last turn
    _desired_seen: set = field(default_factory=set)

    @property
    def agent_id(self) -> str:
        return self.settings.agent_id

    def shutdown(self) -> None:
        """Stop every loop: set `stop` and wake each loop's wait."""
        self.stop.set()
        for event in (self.report_wakeup, self.poll_wakeup, self.inventory_wakeup, self.outbox.wakeup,
                      self.heartbeat_wakeup):
            event.set()

    def report_now(self) -> None:
        self.report_wakeup.set()

    def inventory_changed(self) -> None:
        self.inventory_wakeup.set()

    def desired_revision(self, revision_id) -> None:
        """The heartbeat names a config revision we do not run: apply it (once per id)."""
        if self.lanes is None or revision_id in self._desired_seen:
            return
        self._desired_seen.add(revision_id)
        self.lanes.submit({"local": True, "id": f"desired-{revision_id}", "command_type": "apply_config_revision",
                           "payload": {"revision_id": revision_id}, "timeout_seconds": 120})

    def sample(self):
        return self.sampler.sample()

    def tick(self, loop: str) -> None:
        self.ticks[loop] = time.monotonic()

    def capabilities(self) -> list[str]:
        from caldera.backends.base import capabilities as backend_capabilities

        extra = backend_capabilities(self.settings.env)
        return BASE_CAPABILITIES + [c for c in extra if c not in BASE_CAPABILITIES]

    def agent_section(self) -> dict:
        """The agent's part of a report (adapter status etc.); cached for heartbeats."""
        if self.driver is not None:
            self.last_section = self.driver.report_section()
        return self.last_section


def build_runtime(paths: AgentPaths, settings: Settings, *, stop: threading.Event | None = None,
                  with_client: bool = True, with_driver: bool = True, transport_session=None,
                  schema_checks: bool = True) -> Runtime:
    from caldera.host.sampler import Sampler

    ensure_dir(paths.state_dir)
    for sub in ("logs", "cache", "skills", "runs"):
        ensure_dir(paths.state_dir / sub)
    redactor = Redactor(settings.secret_values)
    manifest = _load_manifest(paths)
    name = getattr(manifest, "name", None) or paths.name
    runtime = Runtime(
        paths=paths, settings=settings, redactor=redactor, stop=stop or threading.Event(),
        pool=ThreadPoolExecutor(SUBPROCESS_WORKERS, thread_name_prefix="caldera-proc"),
        outbox=Outbox(paths.state_dir / "outbox"), state=StateFile(paths.state_dir / "state.json"),
        sampler=Sampler(persistent_dir=str(settings.persistent_dir), runtime_type=settings.runtime_type,
                        runtime_name=name, disk_limit_bytes=settings.disk_limit_bytes),
        manifest=manifest, runtime_name=name,
    )
    if with_driver and manifest is not None and getattr(manifest, "runtime_type", None) == "adapter":
        from caldera.agents.adapter.driver import open_driver

        runtime.driver = open_driver(paths, manifest, pool=runtime.pool, redactor=redactor,
                                     schema_checks=schema_checks)
    if with_driver and manifest is not None and getattr(manifest, "runtime_type", None) == "process":
        runtime.driver = _process_driver(runtime, manifest, supervise=schema_checks)
    if with_client and settings.enabled:
        runtime.client, runtime.auth = _build_client(runtime, transport_session)
    return runtime


def _process_driver(runtime: Runtime, manifest, supervise: bool):
    """Process mode (SPEC 7b). The daemon (the caller that pays for schema checks) supervises;
    `report --once` gets a driver that only reports what state.json and /proc say."""
    from caldera.agents.process.driver import open_driver as open_process_driver

    driver = open_process_driver(runtime.paths, manifest, store=runtime.state, redactor=runtime.redactor,
                                 report_interval=runtime.settings.report_interval, supervise=supervise)
    driver.report_now = runtime.report_now
    return driver


def _load_manifest(paths: AgentPaths):
    if not paths.manifest_path.is_file():
        return None
    from caldera.agents.manifest import load_manifest

    return load_manifest(paths.manifest_path, cache_dir=paths.state_dir / "cache")


def _build_client(runtime: Runtime, transport_session):
    from caldera.protocol.client import ControlPlaneClient, Transport
    from caldera.protocol.payloads import register_body
    from caldera.protocol.session import Auth, SessionFile

    settings = runtime.settings
    transport = Transport(settings.base_url, ca_bundle=settings.ca_bundle, session=transport_session)
    session_file = SessionFile(runtime.paths.state_dir / "session.json", settings.base_url, settings.instance_id)
    client = ControlPlaneClient(transport, None)
    auth = Auth(bootstrap_token=settings.bootstrap_token, session_file=session_file,
                register=lambda: client.register(register_body(runtime)), redactor=runtime.redactor)
    client.auth = auth
    return client, auth
