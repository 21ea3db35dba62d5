"""`caldera check` for process mode: the manifest's process keys against the host, and with
`--start` one real start in a scratch state dir: the agent must stay up and write a
status file that parses (SPEC sections 4 and 7b). Reports into `caldera.agents.check.Report`."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents.adapter.invoke import SAFE_PATH
from caldera.agents.process.spec import build_spec
from caldera.agents.process.statusfile import StatusRead, read_status_file
from caldera.agents.startprobe import probe

if TYPE_CHECKING:
    from caldera.agents.check import Report
    from caldera.agents.manifest import Manifest
    from caldera.agents.process.driver import ProcessDriver
    from caldera.agents.process.spec import ProcessSpec
    from caldera.config import AgentPaths

START_WAIT = 30.0  # how long --start waits for the status file


def check_manifest(paths: AgentPaths, manifest: Manifest, report: Report) -> None:
    """Static checks (ConfigError when the spec can't be built)."""
    spec = build_spec(manifest, paths.state_dir)
    if not spec.workdir.is_dir():
        report.breach("runtime.workdir", f"{spec.workdir} does not exist")
    # The adapter's probe: the program, and the script an interpreter is given (python exits 2
    # for a script it cannot open, and `caldera run` would restart it again and again).
    problem, found = probe(spec.command, spec.workdir, manifest.path, SAFE_PATH, "agent")
    if problem:
        report.breach("runtime.command", problem.removeprefix("runtime.command: "))
    else:
        report.ok("runtime.command", f"{found} (restart: {spec.restart}, stop: signal {spec.stop_signal} then KILL "
                                     f"after {spec.stop_timeout:g} s)")
    if spec.status_file is None:
        report.note("status", "no status file declared: the state comes from the process alone")
    else:
        report.ok("status", f"read from {spec.status_file} (at most 256 KiB, no symlink)")
    if spec.account and Path(paths.state_dir) in spec.state_dir.parents:
        report.breach("state", f"account: {spec.account} can't reach {spec.state_dir} inside the runtime's 0700 "
                               "state dir; give state: an absolute path that account may use")
    if spec.instructions is not None and not spec.instructions.is_file():
        report.breach("instructions", f"{spec.instructions} does not exist")
    _check_secrets(paths, spec, report)


def _check_secrets(paths: AgentPaths, spec: ProcessSpec, report: Report) -> None:
    from caldera.config import read_env_file
    from caldera.errors import ConfigError

    try:
        known = read_env_file(paths.secrets_env, secret=True)
    except (OSError, ConfigError) as exc:
        report.note("secrets", f"secrets.env can't be read here ({exc}); not checked")
        return
    for name in spec.secrets:
        if name not in known and not (paths.secrets_dir / name).is_file():
            report.breach("secrets", f"{name}: named by the manifest, but neither in secrets.env nor secrets/{name}")
    if spec.secrets:
        report.ok("secrets", f"{len(spec.secrets)} named; only these reach the agent (values not shown)")
    if "llm_gateway" in spec.bindings:
        from caldera.agents.process.environment import gateway_values

        got = gateway_values({**os.environ, **known})
        if got:
            report.ok("bindings", f"llm_gateway: {', '.join(sorted(got))} present")
        else:
            report.note("bindings", "llm_gateway: no CLAWMANAGER_LLM_* in this environment (inside an instance "
                                    "ClawManager sets them)")


def check_start(paths: AgentPaths, manifest: Manifest, report: Report, *, wait: float = START_WAIT) -> None:
    """Start the agent once in a scratch state dir and wait for its status file."""
    from caldera.agents.process.driver import open_process_driver
    from caldera.config import AgentPaths
    from caldera.host.statefile import StateFile
    from caldera.redact import Redactor

    scratch = Path(tempfile.mkdtemp(prefix="caldera-check-"))
    try:
        (scratch / "logs").mkdir()
        spaths = AgentPaths(paths.name, paths.config_dir, paths.manifest_path, scratch)
        driver = open_process_driver(spaths, manifest, state=StateFile(scratch / "state.json"),
                                     redactor=Redactor(), report_interval=wait)
        stop = threading.Event()
        thread = threading.Thread(target=driver.supervise, args=(stop,), name="check-supervisor")
        thread.start()
        try:
            _watch(driver, report, wait)
        finally:
            stop.set()
            thread.join()
        last = driver.supervisor.last_exit or {}
        if str(last.get("reason", "")).startswith("the runtime stopped"):
            report.ok("--start: stop", f"stopped: {last['reason'].split(': ', 1)[-1]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _watch(driver: ProcessDriver, report: Report, wait: float) -> None:
    sup, spec = driver.supervisor, driver.spec
    deadline = time.monotonic() + wait
    tick = threading.Event()
    read: StatusRead | None = None
    started = False
    while time.monotonic() < deadline:
        started = started or sup.pid() is not None
        if sup.status == "error" or sup.restarts > 0 or (started and sup.pid() is None):
            tail = _tail(driver.log_path)
            report.breach("--start", f"the agent did not stay up: {sup.reason or sup.last_exit}; "
                                     f"agent.log ends: {tail}")
            return
        if spec.status_file is not None:
            read = read_status_file(spec.status_file, stale_after=wait)
            if read.body is not None:
                break
        elif sup.pid() is not None and (sup.uptime() or 0.0) > 3:
            break
        tick.wait(0.2)
    if sup.pid() is None:
        report.breach("--start", f"the agent is not running: {sup.reason}")
        return
    report.ok("--start", f"started as pid {sup.pid()} in a scratch state dir")
    if spec.status_file is None:
        return
    if read is None or read.body is None:
        reason = read.problem["reason"] if read is not None and read.problem else "never written"
        report.breach("--start: status file", f"no usable status file within {wait:.0f} s: {reason}")
        return
    keys = ", ".join(sorted(read.body)) or "none"
    report.ok("--start: status file", f"written and parsed; forwarded keys: {keys}")


def _tail(path: Path) -> str:
    try:
        return repr(path.read_bytes()[-300:].decode("utf-8", "replace"))
    except OSError:
        return "(no agent.log)"
