"""The files the runtime hands the agent (SPEC section 7b), under the agent's state dir.

- `state`: the agent's persistent directory, made 0700 (owned by `account` where given).
- `settings.json`: the settings values (defaults, then what was set), atomic; the
  runtime re-checks every value it reads back against the manifest's schema.
- `instructions`: a copy of the manifest's instructions file, or the content a
  config revision put in `<runtime state>/process/instructions` (that wins).
- `mcp.json`: the manifest's `mcp` servers, with the `url` entries a revision changed or added
  (`<runtime state>/process/mcp-urls.json`); `command` entries only ever from the manifest.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents.settings import value_problem
from caldera.host.fsutil import atomic_write_bytes, atomic_write_json, ensure_dir, read_json

if TYPE_CHECKING:
    from typing import Any

    from caldera.agents.process.spec import ProcessSpec

    Owner = tuple[int, int] | None  # (uid, gid) the agent's files go to; None: the runtime's own

SETTINGS = "settings.json"
INSTRUCTIONS = "instructions"
MCP = "mcp.json"
OVERRIDES = "process"  # under the runtime's state dir: what revisions changed
INSTRUCTIONS_MAX = 1024 * 1024


def overrides_dir(runtime_state: Path) -> Path:
    return Path(runtime_state) / OVERRIDES


def settings_path(spec: ProcessSpec) -> Path:
    return spec.state_dir / SETTINGS


def read_settings(spec: ProcessSpec) -> dict[str, Any]:
    """Current values: defaults, then the file's values that still pass the schema."""
    values = {item["key"]: spec.settings_defaults.get(item["key"]) for item in spec.settings_schema}
    try:
        stored = read_json(settings_path(spec), {}) or {}
    except (OSError, ValueError):
        stored = {}
    if isinstance(stored, dict):
        for item in spec.settings_schema:
            key = item["key"]
            if key in stored and value_problem(item, stored[key]) is None:
                values[key] = stored[key]
    return values


def write_settings(spec: ProcessSpec, values: dict[str, Any], owner: Owner = None) -> None:
    atomic_write_json(settings_path(spec), values, mode=0o600)
    _chown(settings_path(spec), owner)


def prepare(spec: ProcessSpec, runtime_state: Path, owner: Owner = None) -> dict[str, Path]:
    """Make the agent's files; the CALDERA_* variables that point at them."""
    ensure_dir(spec.state_dir)
    os.chmod(spec.state_dir, 0o700)
    _chown(spec.state_dir, owner)
    files: dict[str, Path] = {"CALDERA_AGENT_STATE_DIR": spec.state_dir}
    if spec.settings_schema or settings_path(spec).exists():
        write_settings(spec, read_settings(spec), owner)
    files["CALDERA_SETTINGS_FILE"] = settings_path(spec)
    if spec.instructions is not None:
        files["CALDERA_INSTRUCTIONS_FILE"] = _instructions(spec.instructions, spec.state_dir, runtime_state, owner)
    servers = effective_mcp(spec, runtime_state)
    if servers:
        path = spec.state_dir / MCP
        atomic_write_json(path, {"mcpServers": servers}, mode=0o600)
        _chown(path, owner)
        files["CALDERA_MCP_CONFIG"] = path
    return files


def _instructions(declared: Path, agent_state: Path, runtime_state: Path, owner: Owner) -> Path:
    """The agent's copy: a config revision's content over the manifest's file."""
    override = overrides_dir(runtime_state) / INSTRUCTIONS
    source = override if override.is_file() else declared
    try:
        with open(source, "rb") as fh:
            data = fh.read(INSTRUCTIONS_MAX + 1)[:INSTRUCTIONS_MAX]
    except OSError:
        data = b""  # named but absent: the agent gets an empty file, `caldera check` says why
    path = agent_state / INSTRUCTIONS
    atomic_write_bytes(path, data, mode=0o600)
    _chown(path, owner)
    return path


def effective_mcp(spec: ProcessSpec, runtime_state: Path) -> dict[str, Any]:
    """The manifest's servers; a revision's url for a server that is a url server in the manifest."""
    servers = json.loads(json.dumps(spec.mcp))
    try:
        urls = read_json(overrides_dir(runtime_state) / "mcp-urls.json", {}) or {}
    except (OSError, ValueError):
        urls = {}
    for name, url in (urls.items() if isinstance(urls, dict) else ()):
        # a url server changed or added; a command server is never replaced (checked again here)
        if isinstance(url, str) and (name not in servers or "url" in servers[name]):
            servers[name] = {"url": url}
    return servers


def _chown(path: Path, owner: Owner) -> None:
    if owner is not None and os.geteuid() == 0:
        os.chown(path, owner[0], owner[1])
