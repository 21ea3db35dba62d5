"""Shared by the process-mode tests: an agent driven by process_agents/fake_agent.py."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import daemon_helpers

from caldera.config import AgentPaths

HERE = Path(__file__).resolve().parent
FAKE = HERE / "process_agents" / "fake_agent.py"
WAIT = 60.0  # generous: a condition that never comes fails the test, a slow machine does not


def make_process_agent(tmp_path: Path, mode: str = "run", *, extra: str = "", runtime: str = "",
                       name: str = "fake") -> AgentPaths:
    config_dir, workdir = tmp_path / "config", tmp_path / "work"
    config_dir.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(exist_ok=True)
    shutil.copy(FAKE, workdir / FAKE.name)
    lines = [f"name: {name}", "version: \"1.0.0\"", "runtime:", "  type: process",
             f"  command: [{json.dumps(sys.executable)}, {FAKE.name}, {mode}]", "  workdir: ../work",
             "  stop_timeout_seconds: 2"]
    manifest = config_dir / "caldera.agent.yaml"
    manifest.write_text("\n".join(lines) + "\n" + runtime + "status: status.json\nstate: agent\n" + extra)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "logs").mkdir(exist_ok=True)
    return AgentPaths(name, config_dir, manifest, state)


def wait_for(check, what: str, timeout: float = WAIT, step: float = 0.05):
    """Poll `check()` until it is truthy; fail naming `what` after `timeout` (the daemon
    tests' poller, with `what` second as these tests spell it)."""
    return daemon_helpers.wait_for(check, timeout=timeout, step=step, what=what)


def manifest_doc(base: dict, **over) -> dict:
    """A copy of the manifest document `base` with top-level keys replaced and
    `runtime_<key>=` setting runtime.<key>."""
    doc = json.loads(json.dumps(base))
    for key, value in over.items():
        if key.startswith("runtime_"):
            doc["runtime"][key[8:]] = value
        else:
            doc[key] = value
    return doc


def alive(pid: int) -> bool:
    from caldera.host.proc import proc_stat

    stat = proc_stat(pid)
    return stat is not None and stat["state"] not in ("Z", "X")


def read_state(paths) -> dict:
    try:
        return json.loads((paths.state_dir / "state.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def kill_quietly(pid) -> None:
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError, TypeError):
        pass
