"""The daemon's side of adapter mode: the report section, the verbs through the pool,
the health check on its interval, settings cached, the blueprint window.

Every adapter call runs on the daemon's ThreadPoolExecutor, so a hanging
adapter never blocks a loop: the report loop waits for `status` at most its
timeout plus the kill grace plus a second, and then reports "Adapter not
answering" without the answer. Answers get the plain checks the local verbs
use (they give the published schemas' verdict; tests hold the two together);
`schema_checks=True` runs the schemas too (jsonschema: not in the daemon, where
it cost memory and CPU on every report; docs/performance.md, section 2).
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time

from caldera import TYPE_CHECKING
from caldera.agents import outcomes, status, trust, updates, window
from caldera.agents.adapter import health, invoke, verbs
from caldera.agents.adapter.answer import DONE, FAILED, UNSUPPORTED, Answer, ContractError
from caldera.agents.manifest import CONTROLS
from caldera.errors import ConfigError
from caldera.protocol.schemas import SchemaError, validate

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from caldera.agents.manifest import Manifest
    from caldera.config import AgentPaths
    from caldera.host.statefile import StateFile
    from caldera.redact import Redactor

    T = TypeVar("T")

log = logging.getLogger("caldera.agents.adapter")
WAIT_SLACK = invoke.GRACE_SECONDS + 1.0  # TERM -> grace -> KILL, and the pool's hand-over
SETTINGS_TTL = 60.0  # seconds a `settings get` answer is used for reports
# Seconds a `status` answer stands for a new call in the periodic reports (docs/adapter.md,
# "How fresh a report is"). Every verb sent through the driver (pause, resume, run-now,
# settings set, …) and a changed manifest drop it, so a report after a command always asks
# the adapter. 4 s: under the 5 s report interval, so every periodic report asks and a change
# the agent makes through its own channel (its chat command) reaches the plane within two
# report intervals (10 s); a burst of reports (report_now) within 4 s shares one answer. The
# cost, one adapter process per 5 s, is in docs/performance.md (bench/bench_runtime.py).
STATUS_FRESH = 4.0
VERSION_MAX = 50  # ClawManager's openclaw_version column
BACKGROUND_WAIT = 1.0  # seconds a report waits for the health check and settings refresh it started


def open_adapter_driver(paths: AgentPaths, manifest: Manifest, *, pool: cf.ThreadPoolExecutor, redactor: Redactor,
                        schema_checks: bool = True, state: StateFile | None = None) -> AdapterDriver:
    """schema_checks: validate answers and the manifest with jsonschema too. The daemon and
    `report --once` run the plain-Python checks only, which give the schemas' verdict
    (tests hold the two together) without jsonschema's validators and their garbage.
    state: the durable key-value state (`state.json`); a window rollback puts the previous
    `current_config_revision_id` back in it. The driver starts from the effective manifest
    (the installed one with a stored blueprint update over it)."""
    if manifest.runtime_type != "adapter":
        raise ConfigError(f"{manifest.path}: runtime.type: {manifest.runtime_type} is not adapter mode")
    driver = AdapterDriver(paths, manifest, pool=pool, redactor=redactor, schema_checks=schema_checks, state=state)
    driver.refresh_manifest()
    return driver


def schema_problem(name: str, document: Any) -> str | None:
    try:
        validate(name, document)
    except SchemaError as exc:
        return str(exc)
    return None


def adapter_status(paths: AgentPaths, manifest: Manifest) -> dict[str, Any]:
    """For `caldera status`: the filtered body, or the "Adapter not answering" body. Plain
    Python (no jsonschema), one `status` call in this thread."""
    return ask_status(manifest)[0]


def ask_status(manifest: Manifest) -> tuple[dict[str, Any], str]:
    """(adapter_status's body, the adapter's stderr when it did not answer, else ""): what
    `caldera status` shows below a failed call (cut and redacted there)."""
    answer = invoke.call(manifest, "status")
    body, answered = _status_body(answer, validate=False)
    return body, "" if answered else answer.stderr


def _status_body(answer: Answer, validate: bool) -> tuple[dict[str, Any], bool]:
    if answer.kind == DONE:
        problem = schema_problem("adapter-status.schema.json", answer.data) if validate else None
        if problem is None:
            try:
                return status.filter_status(answer.data), True
            except ContractError as exc:
                problem = str(exc)
        return status.not_answering(f"status: the answer breaks the contract: {problem}"), False
    if answer.kind == UNSUPPORTED:
        return status.not_answering("status: the adapter says it does not know this verb (exit 2)"), False
    reason = answer.reason or (f"status: refused ({answer.message})" if answer.message else "status: refused")
    return status.not_answering(reason), False


class AdapterDriver:
    def __init__(self, paths: AgentPaths, manifest: Manifest, *, pool: cf.ThreadPoolExecutor, redactor: Redactor,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 schema_checks: bool = True, state: StateFile | None = None) -> None:
        self.paths, self.manifest, self.pool, self.redactor = paths, manifest, pool, redactor
        self.state = state
        self.last_level: str | None = None  # the agent's level in the last report (for the window)
        self.schema_checks = schema_checks
        self.clock, self.wall = clock, wall
        self._lock = threading.Lock()
        self._status_future: cf.Future[Answer] | None = None
        self._status_kept: tuple[float, dict[str, Any]] | None = None  # (clock, body) of the last answered `status`
        self._status_generation = 0  # moved by forget_status: an answer asked before is not kept
        self._settings_future: cf.Future[tuple[Answer, dict[str, Any], dict[str, Any]]] | None = None
        # (values, bounds) of the last good `settings get`
        self._settings: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self._settings_at: float | None = None
        self._health_future: cf.Future[dict[str, Any]] | None = None
        self._health_entry: dict[str, Any] | None = None
        self._health_due = 0.0
        self._manifest_problem: str | None = None

    # ------------------------------------------------------------ manifest

    def refresh_manifest(self) -> None:
        """Pick up a changed manifest (an update, a rollback, an edit); a bad one keeps the old."""
        try:
            fresh = updates.load_effective(self.paths, cache_dir=self.paths.state_dir / "cache",
                                           validate_schema=self.schema_checks)
        except ConfigError as exc:
            if str(exc) != self._manifest_problem:
                log.warning("manifest not reloaded, keeping the last good one: %s", exc)
            self._manifest_problem = str(exc)
            return
        self._manifest_problem = None
        if (fresh.doc != self.manifest.doc or fresh.workdir != self.manifest.workdir
                or fresh.update != self.manifest.update):
            log.info("manifest reloaded: %s %s", fresh.name, fresh.version or "")
            with self._lock:
                self.manifest = fresh
                self._settings_at = None
                self._health_due = 0.0
                self._status_kept = None

    # ------------------------------------------------------------ the pool

    def _submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> cf.Future[T]:
        return self.pool.submit(fn, *args, **kwargs)

    def run(self, fn: Callable[..., Answer], *args: Any, cancel: threading.Event | None = None,
            deadline: float | None = None) -> Answer:
        """Run a verb function on the pool and wait for it (a command's thread may wait)."""
        cancel = cancel or threading.Event()
        self.forget_status()  # a verb may change what `status` says: the next report asks again
        future = self._submit(fn, self.manifest, *args, cancel=cancel)
        wait = None if deadline is None else max(0.0, deadline - self.clock())
        try:
            answer = future.result(timeout=wait)
        except cf.TimeoutError:
            cancel.set()  # proc.run kills the adapter's group on it
            answer = verbs.finish(Answer(verb=getattr(fn, "__name__", "verb"), kind=FAILED,
                                         reason="no answer before the command's deadline"))
        self.forget_status()  # and once more when it is done: a report may have asked meanwhile
        return verbs.redact_answer(answer, self.redactor)

    def forget_status(self) -> None:
        with self._lock:
            self._status_kept = None
            self._status_generation += 1

    # ------------------------------------------------------------ the verbs

    def pause(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self.run(verbs.control, "pause", cancel=cancel, deadline=deadline)

    def resume(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self.run(verbs.control, "resume", cancel=cancel, deadline=deadline)

    def run_now(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self.run(verbs.control, "run-now", cancel=cancel, deadline=deadline)

    def settings_get(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        answer = self.run(verbs.settings_get, cancel=cancel, deadline=deadline)
        if answer.ok and answer.data is not None:
            self._remember_settings(answer.data["values"], answer.data["bounds"])
        return answer

    def settings_set(self, values: dict[str, Any], *, cancel: threading.Event | None = None,
                     deadline: float | None = None) -> Answer:
        answer = self.run(verbs.settings_set, values, cancel=cancel, deadline=deadline)
        with self._lock:
            self._settings_at = None  # the next report asks again
        return answer

    def log_list(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self.run(verbs.log_list, cancel=cancel, deadline=deadline)

    def log_get(self, name: str, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self.run(verbs.log_get, name, cancel=cancel, deadline=deadline)

    def controls(self) -> list[str]:
        return list(self.manifest.controls if self.manifest.controls is not None else CONTROLS)

    def check_told(self, content: dict[str, Any]) -> list[str]:
        return []  # told, not run: nothing to refuse, nothing reaches the agent (apply_told says so)

    def apply_told(self, content: dict[str, Any]) -> dict[str, Any]:
        return trust.not_told(content)  # an adapter agent reads no file of the runtime's

    # ------------------------------------------------------------ the report

    def _remember_settings(self, values: dict[str, Any], bounds: dict[str, Any]) -> None:
        with self._lock:
            self._settings, self._settings_at = (values, bounds), self.clock()

    def _kick_background(self) -> None:
        """Start the health check and a settings refresh when due; never waits."""
        now = self.clock()
        if self.manifest.health and now >= self._health_due and not _running(self._health_future):
            self._health_due = now + health.interval(self.manifest)
            self._health_future = self._submit(health.check, self.manifest)
        stale = self._settings_at is None or now - self._settings_at >= SETTINGS_TTL
        if self.manifest.settings_schema and stale and not _running(self._settings_future):
            self._settings_future = self._submit(verbs.fetch_settings, self.manifest)

    def _collect_background(self) -> None:
        pending: list[cf.Future[Any]] = [f for f in (self._health_future, self._settings_future) if f is not None]
        if pending:
            # Started with the status call, they are usually done with it; a short wait
            # lets the first report carry them, and never adds more than a second.
            cf.wait(pending, timeout=BACKGROUND_WAIT)
        checked = self._health_future
        if checked is not None and checked.done():
            self._health_entry = _result_or_failure(checked, health.NAME)
            self._health_future = None
        fetched = self._settings_future
        if fetched is not None and fetched.done():
            self._settings_future = None
            try:
                answer, values, bounds = fetched.result()
            except Exception as exc:  # a bug in a verb function: say so, keep the last values
                log.error("settings get raised: %s", exc)
                return
            if answer.kind == DONE or answer.kind == UNSUPPORTED:
                self._remember_settings(values, bounds)
            else:
                log.warning("settings get failed: %s", self.redactor(answer.reason or answer.message or ""))

    def status_body(self) -> tuple[dict[str, Any], bool]:
        """(filtered body, answered) within status timeout + grace + 1 s, never longer; the
        last answered body while it is younger than STATUS_FRESH."""
        with self._lock:
            kept, generation = self._status_kept, self._status_generation
        if kept is not None and self.clock() - kept[0] < STATUS_FRESH and not _window_open(self.paths):
            return kept[1], True
        asked_at = self.clock()
        body, answered = self._ask_status()
        with self._lock:
            if answered and generation == self._status_generation:
                self._status_kept = (asked_at, body)
        return body, answered

    def _ask_status(self) -> tuple[dict[str, Any], bool]:
        future = self._status_future
        if future is None or future.done():
            future = self._status_future = self._submit(invoke.call, self.manifest, "status")
        timeout = invoke.timeout_for(self.manifest, invoke.VERBS["status"]) + WAIT_SLACK
        try:
            answer = future.result(timeout=timeout)
        except cf.TimeoutError:
            return status.not_answering(f"status: no answer within {timeout:.0f} s (the call is still running)"), False
        except Exception as exc:  # a bug in our own code: this one report says so, the next one tries again
            log.error("status call raised: %s", exc)
            return status.not_answering(f"status: internal error ({type(exc).__name__})"), False
        return _status_body(answer, validate=self.schema_checks)

    def report_section(self) -> dict[str, Any]:
        self.refresh_manifest()
        self._kick_background()
        body, answered = self.status_body()
        self._collect_background()
        entries = list(body.get("health", []))
        if self._health_entry:
            entries.append(self._health_entry)
        if self._manifest_problem:
            entries.append({"name": "Manifest", "level": "warn",
                            "reason": f"not reloaded, the last good one is in use: {self._manifest_problem}"[:1000]})
        bad = status.level_of(body) == "bad" or (self._health_entry or {}).get("level") == "bad"
        changed = window.observe(self.paths, bad, now=self.wall())
        if changed:
            self._after_window(changed)
        self.last_level = "bad" if bad else status.level_of(body)
        entries.extend(window.health_entries(self.paths, now=self.wall()))
        values, bounds = self._settings
        agent = body.get("agent") or {}
        section = {
            "runtime": {"openclaw_status": status.openclaw_status(body), "openclaw_pid": None,
                        "openclaw_version": (agent.get("version") or self.manifest.version or "")[:VERSION_MAX] or None,
                        "runtime_status": "running"},
            "health": {"agent": status.health_word(body), "adapter": "ok" if answered else "error",
                       "entries": entries},
            "agent_status": body,
            "settings": {"schema": list(verbs.settings.narrow(self.manifest.settings_schema, bounds)),
                         "values": {i["key"]: values.get(i["key"]) for i in self.manifest.settings_schema}},
            "controls": self.controls(),
        }
        return self.redactor(section)

    def _after_window(self, record: dict[str, Any]) -> None:
        """A rollback put the previous effective manifest back: use it, and report its revision."""
        if record.get("status") == "rolled_back":
            log.warning("blueprint update (revision %s) rolled back: %s", record.get("revision_id"),
                        record.get("reason"))
            if self.state is not None:
                self.state.set(window.REVISION_KEY, record.get("previous_revision_id"))
                outcomes.record(self.state, record.get("revision_id"), "rolled_back",
                                f"rolled back to revision {record.get('previous_revision_id')} "
                                f"(version {record.get('previous_version')}): {record.get('reason')}", via="window")
        self.refresh_manifest()


def _window_open(paths: AgentPaths) -> bool:
    return (window.current(paths) or {}).get("status") == "open"


def _running(future: cf.Future[Any] | None) -> bool:
    return future is not None and not future.done()


def _result_or_failure(future: cf.Future[dict[str, Any]], name: str) -> dict[str, Any]:
    try:
        return future.result()
    except Exception as exc:  # a bug, not the adapter: visible in health rather than lost
        log.error("%s raised: %s", name, exc)
        return {"name": name, "level": "bad", "reason": f"internal error: {exc}"}


if TYPE_CHECKING:
    from caldera.agents.driver import AgentDriver

    _satisfies: type[AgentDriver] = AdapterDriver  # mypy checks the driver against the interface
