"""The daemon's side of process mode: the same interface as the adapter driver
(`report_section()`, the verbs returning an Answer, `controls()`, `manifest`), plus
start / stop / restart and the supervisor thread's body (`supervise(stop)`).

Verbs (SPEC section 7b): pause = graceful stop and stay stopped (kept in
state.json), resume = start, run-now = the run-now signal to the agent's main
process, settings = `<agent state>/settings.json` then SIGHUP, logs = agent.log
(and its rotations) plus the `*.log` files of the manifest's `logs` directory.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents import settings as settings_rules
from caldera.agents import status
from caldera.agents.adapter import logs as log_names
from caldera.agents.adapter.answer import DONE, FAILED, REFUSED, Answer
from caldera.agents.manifest import CONTROLS
from caldera.agents.process import files
from caldera.agents.process.launcher import Launcher
from caldera.agents.process.logpump import LogPump
from caldera.agents.process.spec import build_spec
from caldera.agents.process.statusfile import read_status_file
from caldera.agents.process.supervisor import FAILED as P_FAILED
from caldera.agents.process.supervisor import RUNNING, STARTING, STOPPED, Supervisor, supervise_loop
from caldera.agents.updates import load_effective
from caldera.errors import ConfigError
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from caldera.agents.manifest import Manifest
    from caldera.config import AgentPaths
    from caldera.host.statefile import StateFile
    from caldera.redact import Redactor

log = logging.getLogger("caldera.agents.process")
VERSION_MAX = 50  # ClawManager's openclaw_version column
LOG_TAIL = 512 * 1024
AGENT_LOG = "agent.log"
HEALTH_MAX = 50
LABELS = {STARTING: ("warn", "Starting"), RUNNING: ("ok", "Running"), STOPPED: ("off", "Stopped"),
          P_FAILED: ("bad", "Failed")}


def open_process_driver(paths: AgentPaths, manifest: Manifest, *, state: StateFile, redactor: Redactor,
                        report_interval: float = 5.0, environ: Mapping[str, str] = os.environ,
                        supervise: bool = True, report_now: Callable[[], None] | None = None) -> ProcessDriver:
    """supervise=False: a driver that only reports (report --once); it starts nothing.
    report_now: called when the agent's state changes (the daemon's report wake-up)."""
    if manifest.runtime_type != "process":
        raise ConfigError(f"{manifest.path}: runtime.type: {manifest.runtime_type} is not process mode")
    return ProcessDriver(paths, manifest, state=state, redactor=redactor, report_interval=report_interval,
                         environ=environ, supervise=supervise, report_now=report_now)


class ProcessDriver:
    def __init__(self, paths: AgentPaths, manifest: Manifest, *, state: StateFile, redactor: Redactor,
                 report_interval: float, environ: Mapping[str, str], supervise: bool,
                 report_now: Callable[[], None] | None) -> None:
        self.paths, self.manifest, self.state, self.redactor = paths, manifest, state, redactor
        self.spec = build_spec(manifest, paths.state_dir)
        self.report_interval = report_interval
        self.supervising = supervise
        self.log_path = Path(paths.state_dir) / "logs" / AGENT_LOG
        self.launcher = Launcher(self, paths, environ=environ)
        self.pump: LogPump | None = None
        self.supervisor = Supervisor(launch=self.launcher, store=state, pump=None,
                                     stop_signal=self.spec.stop_signal, stop_timeout=self.spec.stop_timeout,
                                     restart=self.spec.restart, on_change=self._changed)
        self.report_now = report_now or (lambda: None)
        self._manifest_problem: str | None = None
        self._health_entry: dict[str, Any] | None = None
        self._health_due = 0.0
        self._health_thread: threading.Thread | None = None
        self.last_level: str | None = None  # no blueprint window judges a process agent's reports

    def _changed(self) -> None:
        self.report_now()

    # ------------------------------------------------------------ the supervisor thread

    def supervise(self, stop: threading.Event) -> None:
        """Thread body: run the agent until `stop`, then stop it gracefully."""
        try:
            self.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:  # the pump says so for every write it cannot do; the agent is supervised anyway
            log.warning("%s cannot be made: %s", self.log_path.parent, exc.strerror or exc)
        self.pump = LogPump(self.log_path)
        self.supervisor.attach_pump(self.pump)
        try:
            supervise_loop(self.supervisor, stop)
        finally:
            self.pump.close()

    def refresh_manifest(self) -> None:
        """A changed (effective) manifest applies at the agent's next start, never mid-run; only its
        told part, the mcp entries, is rewritten and signalled at once."""
        try:
            fresh = load_effective(self.paths, cache_dir=self.paths.state_dir / "cache")
            spec = build_spec(fresh, self.paths.state_dir)
        except ConfigError as exc:
            self._manifest_problem = str(exc)
            return
        self._manifest_problem = None
        told_changed = fresh.doc.get("mcp") != self.manifest.doc.get("mcp")
        self.manifest, self.spec = fresh, spec
        if told_changed and self.supervising:
            self.files_changed()  # an update's mcp url entries reach the running agent now (SIGHUP)
        self.supervisor.configure(stop_signal=spec.stop_signal, stop_timeout=spec.stop_timeout,
                                  restart=spec.restart)

    # ------------------------------------------------------------ start / stop / restart

    def _answer(self, verb: str, message: str, ok: bool = True) -> Answer:
        return Answer(verb=verb, kind=DONE if ok else FAILED, message=self.redactor(message),
                      reason=None if ok else self.redactor(message))

    def _supervised(self, verb: str, act: Callable[[], Answer]) -> Answer:
        """act() when this driver supervises; a refusal with a sentence otherwise (report --once)."""
        if not self.supervising:
            return Answer(verb=verb, kind=REFUSED,
                          message="this runtime only reports; the daemon (caldera run) runs the agent")
        return act()

    def start(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self._supervised("start", lambda: self._started("start", self.supervisor.start()))

    def stop(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self._supervised("stop", lambda: self._answer("stop", self.supervisor.stop(hold="stopped")))

    def restart(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self._supervised("restart", lambda: self._started("restart", self.supervisor.restart()))

    def _started(self, verb: str, message: str) -> Answer:
        return self._answer(verb, message, ok=self.supervisor.pid() is not None)

    # ------------------------------------------------------------ the verbs

    def pause(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self._supervised("pause", lambda: self._answer(
            "pause", "Paused; the agent stays stopped until resume. " + self.supervisor.stop(hold="paused")))

    def resume(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        def act() -> Answer:
            lifted = "Pause lifted. " if self.supervisor.hold == "paused" else ""
            return self._started("resume", lifted + self.supervisor.start())

        return self._supervised("resume", act)

    def run_now(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        return self._supervised("run-now", self._run_now)

    def _run_now(self) -> Answer:
        if self.supervisor.send(self.spec.run_now_signal):
            name = signal.Signals(self.spec.run_now_signal).name
            return self._answer("run-now", f"Requested ({name} sent to pid {self.supervisor.pid()}).")
        held = self.supervisor.hold
        why = "it is paused" if held == "paused" else "it is not running"
        return Answer(verb="run-now", kind=REFUSED, message=f"Nothing can run now: {why}.",
                      held=["Paused"] if held == "paused" else [])

    def controls(self) -> list[str]:
        return list(self.manifest.controls if self.manifest.controls is not None else CONTROLS)

    def settings_get(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        values = files.read_settings(self.spec)
        schema = list(self.spec.settings_schema)
        answer = Answer(verb="settings get", kind=DONE,
                        message="Settings." if schema else "This agent declares no settings.")
        answer.data = {"values": values, "schema": schema, "bounds": {}}
        return answer

    def settings_set(self, values: dict[str, Any], *, cancel: threading.Event | None = None,
                     deadline: float | None = None) -> Answer:
        problem = settings_rules.check_values(values, self.spec.settings_schema)
        if problem:
            return Answer(verb="settings set", kind=REFUSED, message="Nothing changed: " + problem)
        merged = {**files.read_settings(self.spec), **values}
        try:
            files.write_settings(self.spec, merged)
        except OSError as exc:
            return self._answer("settings set", f"Nothing changed: settings.json can't be written ({exc.strerror})",
                                ok=False)
        told = self.supervisor.send(signal.SIGHUP)
        self.report_now()
        return self._answer("settings set", "Saved; the agent was told (SIGHUP)." if told
                            else "Saved; the agent reads it when it starts.")

    def check_told(self, content: dict[str, Any]) -> list[str]:
        """A config revision's `instructions`/`mcp`: why they may not be applied ([] = allowed)."""
        from caldera.agents.process.told import check_told

        return check_told(self.spec, self.manifest.doc, content)

    def apply_told(self, content: dict[str, Any]) -> dict[str, Any]:
        from caldera.agents.process.told import apply_told

        return {"told": apply_told(self.paths.state_dir, content, self.files_changed)}

    def files_changed(self) -> bool:
        """A revision changed instructions or mcp: rebuild the agent's files, then SIGHUP it.
        True when a running agent was told."""
        from caldera.agents.process.launcher import account_ids

        files.prepare(self.spec, self.paths.state_dir, account_ids(self.spec.account))
        self.report_now()
        return self.supervisor.send(signal.SIGHUP)

    def _logs(self) -> dict[str, Path]:
        """name -> path of every log that may be read (agent.log first, at most 50)."""
        found: dict[str, Path] = {}
        for path in [self.log_path] + [self.log_path.with_name(f"{AGENT_LOG}.{i}") for i in (1, 2, 3)]:
            if path.is_file():
                found[path.name] = path
        if self.spec.logs_dir is not None:
            try:
                entries = sorted(os.scandir(self.spec.logs_dir), key=lambda e: e.name)
            except OSError:
                entries = []
            for entry in entries:
                if (entry.name.endswith(".log") and entry.is_file(follow_symlinks=False)
                        and log_names.name_problem(entry.name) is None and entry.name not in found):
                    found[entry.name] = Path(entry.path)
        return dict(list(found.items())[:log_names.LIST_MAX])

    def log_list(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        names = list(self._logs())
        answer = Answer(verb="log --list", kind=DONE,
                        message=f"{len(names)} log{'' if len(names) == 1 else 's'}." if names else "No logs.")
        answer.data = {"logs": names}
        return answer

    def log_get(self, name: str, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer:
        problem = log_names.name_problem(name)
        if problem:
            return Answer(verb="log", kind=REFUSED, message=f"{problem}.")
        path = self._logs().get(name)
        if path is None:
            return Answer(verb="log", kind=REFUSED, message=log_names.NO_SUCH_LOG)
        try:
            text, truncated = _tail(path, LOG_TAIL)
        except OSError as exc:
            return self._answer("log", f"{name} can't be read: {exc.strerror}", ok=False)
        answer = Answer(verb="log", kind=DONE, message=name)
        answer.text, answer.truncated = self.redactor(text), truncated
        return answer

    # ------------------------------------------------------------ the health check

    def _health(self) -> dict[str, Any] | None:
        """The manifest's health check, as in adapter mode (its workdir, the adapter's environment),
        on its interval in a thread of its own; the report carries the last result, never waits."""
        if not self.manifest.health or not self.supervising:
            return None
        running = self._health_thread is not None and self._health_thread.is_alive()
        if not running and time.monotonic() >= self._health_due:
            from caldera.agents.adapter import health

            self._health_due = time.monotonic() + health.interval(self.manifest)
            self._health_thread = threading.Thread(target=self._run_health, name="health-check", daemon=True)
            self._health_thread.start()
        return self._health_entry

    def _run_health(self) -> None:
        from caldera.agents.adapter import health  # imported by _health already

        try:
            self._health_entry = health.check(self.manifest)
        except Exception as exc:  # noqa: BLE001 -- a bug shows in health rather than ending the thread
            log.exception("health check failed")
            self._health_entry = {"name": health.NAME, "level": "bad", "reason": f"internal error: {exc}"}

    # ------------------------------------------------------------ the report

    def process_info(self) -> dict[str, Any]:
        snap = self.supervisor.snapshot() if self.supervising else _observed(self.state)
        return {"pid": snap["pid"], "status": snap["status"], "uptime_seconds": _round(snap.get("uptime")),
                "restarts": snap["restarts"], "last_exit": snap["last_exit"], "hold": snap["hold"],
                "reason": snap.get("reason") or ""}

    def status_body(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(agent_status body, process_info()) from the status file and the process."""
        info = self.process_info()
        read = read_status_file(self.spec.status_file, stale_after=3 * self.report_interval)
        started = (self.state.get("agent_process") or {}).get("started_at")
        if read.body is not None and read.mtime and started and rfc3339(read.mtime) >= started:
            self.supervisor.mark_running()
            info["status"] = self.supervisor.status if self.supervising else info["status"]
        body = dict(read.body or {})
        entries = list(body.get("health") or [])
        if info["status"] != RUNNING or "state" not in body:
            level, label = LABELS.get(info["status"], ("bad", "Unknown"))
            if info["status"] == STOPPED and info["hold"] == "paused":
                label = "Paused"
            body["state"] = {"level": level, "label": label}
            if info["reason"]:
                body["detail"] = info["reason"][:status.STRING_MAX]
        if info["hold"] == "paused":
            body["held"] = (["Paused"] + [h for h in body.get("held", []) if h != "Paused"])[:status.LIST_MAX]
        if read.problem:
            entries.append(read.problem)
        for problem in self.launcher.problems + self.supervisor.notes:
            entries.append({"name": "Process", "level": "warn", "reason": problem[:status.STRING_MAX]})
        checked = self._health()
        if checked:
            entries.append(checked)
        if self._manifest_problem:
            entries.append({"name": "Manifest", "level": "warn", "reason": self._manifest_problem[:1000]})
        if self.pump is not None and self.pump.dropped_total:
            dropped = f"{self.pump.dropped_total} bytes of output dropped (disk slower than the agent)"
            entries.append({"name": "Agent log", "level": "warn", "reason": dropped})
        body["health"] = entries[:HEALTH_MAX]
        return body, info

    def report_section(self) -> dict[str, Any]:
        body, info = self.status_body()
        agent = body.get("agent") or {}
        version = (agent.get("version") or self.manifest.version or "")[:VERSION_MAX] or None
        section = {
            "runtime": {"openclaw_status": info["status"], "openclaw_pid": info["pid"], "runtime_pid": info["pid"],
                        "openclaw_version": version, "runtime_status": "running"},
            "health": {"agent": status.health_word(body), "entries": body["health"], "agent_process": info},
            "agent_status": body,
            "settings": {"schema": list(self.spec.settings_schema), "values": files.read_settings(self.spec)},
            "controls": self.controls(),
        }
        return self.redactor(section)


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


def _observed(store: StateFile) -> dict[str, Any]:
    """Without a supervisor (report --once, caldera status): the recorded agent, checked against /proc."""
    from caldera.host.proc import same_process

    record = store.get("agent_process") or {}
    pid, start_time = record.get("pid"), record.get("start_time")
    alive = isinstance(pid, int) and isinstance(start_time, int) and same_process(pid, start_time)
    hold = store.get("agent_hold")
    uptime = None
    if alive and record.get("started_at"):
        import datetime as dt

        try:
            started = dt.datetime.strptime(record["started_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
            uptime = time.time() - started.timestamp()
        except ValueError:
            uptime = None
    return {"status": RUNNING if alive else STOPPED, "pid": pid if alive else None, "uptime": uptime,
            "restarts": record.get("restarts") or 0, "last_exit": record.get("last_exit"), "hold": hold,
            "reason": "" if alive else ("paused" if hold == "paused" else "not running")}


def _tail(path: Path, cap: int) -> tuple[str, bool]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - cap)
        os.lseek(fd, start, os.SEEK_SET)
        chunks: list[bytes] = []
        left = cap
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace"), start > 0


if TYPE_CHECKING:
    from caldera.agents.driver import AgentDriver

    _satisfies: type[AgentDriver] = ProcessDriver  # mypy checks the driver against the interface
