"""The `ProcessSpec` the supervisor, the environment and the status reader are built from
(SPEC section 7b). The process keys' checks live with every other manifest check in
`caldera.agents.manifest` (a shared module imports no mode); paths given as a string or as
a one-key mapping (`status: {file: …}`) mean the same (docs/process.md says why)."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents.manifest import STOP_TIMEOUT_DEFAULT
from caldera.agents.manifest import path_value as _path_value
from caldera.errors import ConfigError

if TYPE_CHECKING:
    from typing import Any

    from caldera.agents.manifest import Manifest


@dataclass(frozen=True, repr=False)
class ProcessSpec:
    """What process mode reads from a checked manifest; paths resolved, defaults filled."""

    name: str
    version: str | None
    command: tuple[str, ...]
    workdir: Path
    stop_signal: int
    stop_timeout: float  # seconds
    restart: str  # on-failure | always | never
    run_now_signal: int
    status_file: Path | None
    logs_dir: Path | None
    state_dir: Path  # the agent's own (CALDERA_AGENT_STATE_DIR)
    secrets: tuple[str, ...]
    bindings: tuple[str, ...]
    instructions: Path | None
    mcp: dict[str, Any]
    env: dict[str, str]
    account: str | None  # a user name to run as; None: the runtime's own user
    settings_schema: tuple[dict[str, Any], ...]
    settings_defaults: dict[str, Any]
    controls: tuple[str, ...] | None
    health: dict[str, Any] | None

    def __repr__(self) -> str:
        return f"ProcessSpec({self.name!r}, {list(self.command)!r})"


def signal_number(name: str) -> int:
    return int(signal.Signals[f"SIG{name}"])


def build_spec(manifest: Manifest, agent_state_dir: Path) -> ProcessSpec:
    """The spec of a checked process manifest. `agent_state_dir` is the runtime's state dir:
    a relative `state` lies under it; relative `status` and `logs` under `state` when the
    manifest names one (the agent writes there), else under the workdir."""
    if manifest.runtime_type != "process":
        raise ConfigError(f"{manifest.path}: runtime.type: {manifest.runtime_type} is not process mode")
    doc, where = manifest.doc, str(manifest.path)
    runtime = doc["runtime"]
    state_rel = _path_value(doc, "state", where)
    state_dir = _under(Path(agent_state_dir), state_rel) if state_rel else Path(agent_state_dir) / "agent"
    status_rel = _path_value(doc, "status", where)
    status_base = state_dir if state_rel else manifest.workdir
    logs_rel = _path_value(doc, "logs", where)
    instructions = _path_value(doc, "instructions", where)
    account = doc.get("account")
    return ProcessSpec(
        name=manifest.name, version=manifest.version, command=tuple(manifest.command), workdir=manifest.workdir,
        stop_signal=signal_number(runtime.get("stop_signal", "TERM")),
        stop_timeout=float(runtime.get("stop_timeout_seconds", STOP_TIMEOUT_DEFAULT)),
        restart=runtime.get("restart", "on-failure"),
        run_now_signal=signal_number(runtime.get("run_now_signal", "USR1")),
        status_file=_under(status_base, status_rel) if status_rel else None,
        logs_dir=_under(status_base, logs_rel) if logs_rel else None,
        state_dir=state_dir, secrets=tuple(doc.get("secrets") or ()), bindings=tuple(doc.get("bindings") or ()),
        instructions=_under(manifest.workdir, instructions) if instructions else None,
        mcp=dict(doc.get("mcp") or {}), env=dict(doc.get("env") or {}),
        account=account if isinstance(account, str) else None,
        settings_schema=manifest.settings_schema, settings_defaults=manifest.settings_defaults,
        controls=manifest.controls, health=manifest.health,
    )


def _under(base: Path, rel: str) -> Path:
    path = Path(rel)
    return Path(os.path.normpath(path if path.is_absolute() else Path(base) / path))
