"""Shared by the adapter tests: an agent in a temp dir driven by one of ./adapters/*.py."""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ADAPTERS = HERE / "adapters"
REPO = HERE.parent.parent
EXAMPLE = REPO / "examples" / "task-agent"

SETTINGS_BLOCK = """\
settings:
  schema:
    - { key: max_7d, label: Weekly limit, type: percent, min: 0.1, max: 1.0 }
  defaults: { max_7d: 0.75 }
"""


def setting(manifest, key: str) -> dict | None:
    """The manifest's declared setting `key`, or None."""
    return next((item for item in manifest.settings_schema if item["key"] == key), None)


@dataclass(frozen=True)
class Paths:
    """The fields of caldera.config.AgentPaths the adapter code uses."""
    name: str
    config_dir: Path
    manifest_path: Path
    state_dir: Path

    @property
    def agent_env(self):
        return self.config_dir / "agent.env"

    @property
    def secrets_env(self):
        return self.config_dir / "secrets.env"

    @property
    def secrets_dir(self):
        return self.config_dir / "secrets"


def make_agent(tmp_path: Path, adapter: str, *, timeout=None, extra: str = SETTINGS_BLOCK,
               name="test-agent") -> Paths:
    """An agent whose workdir holds a copy of adapters/<adapter>; returns its paths."""
    config_dir = tmp_path / "config"
    workdir = tmp_path / "work"
    config_dir.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(exist_ok=True)
    shutil.copy(ADAPTERS / adapter, workdir / adapter)
    lines = [f"name: {name}", "version: 0.1.0", "runtime:", "  type: adapter",
             f"  command: [{json.dumps(sys.executable)}, {adapter}]", "  workdir: ../work"]
    if timeout:
        lines.append(f"  timeout_seconds: {timeout}")
    manifest = config_dir / "caldera.agent.yaml"
    manifest.write_text("\n".join(lines) + "\n" + extra)
    return Paths(name, config_dir, manifest, tmp_path / "state")


def calls(paths: Paths) -> list:
    log = paths.config_dir.parent / "work" / "calls.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def workdir(paths: Paths) -> Path:
    return paths.config_dir.parent / "work"


def copy_example(tmp_path: Path) -> Path:
    dest = tmp_path / "task-agent"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("data", "__pycache__", ".caldera-state"))
    return dest / "caldera.agent.yaml"
