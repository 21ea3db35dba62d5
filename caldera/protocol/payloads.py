"""The payloads of register, heartbeat and state report (seed 004 + SPEC section 5).

`current_config_revision_id` and `openclaw_pid` are always sent: ClawManager
sets them to null when they are omitted. Strings stay inside the server's
columns (agent_version <= 50, openclaw_status <= 30 characters).
"""
from __future__ import annotations

import math
import os

from caldera import TYPE_CHECKING, __version__
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from typing import Any

    from caldera.config import Settings
    from caldera.host.sampler import Sample

OPENCLAW_STATUSES = ("running", "stopped", "error", "unknown", "starting")
BASE_CAPABILITIES = ["runtime.status", "runtime.health", "metrics.report", "commands.poll",
                     "skills.inventory", "skills.upload", "adapter.verbs"]


ERROR_MESSAGE_CAP = 16 * 1024  # finish.error_message: the column is TEXT (64 KiB); a message is a sentence


def cap_text(text: str, cap: int) -> str:
    """`text` cut to at most `cap` UTF-8 bytes (whole characters), saying it was cut."""
    data = text.encode("utf-8")
    if len(data) <= cap:
        return text
    note = f" ... [cut: {len(data)} bytes]"
    return data[: cap - len(note.encode())].decode("utf-8", "ignore") + note


def finish_body(agent_id: str, status: str, result: Any, error: str) -> dict[str, Any]:
    """A finish body the server's decoder takes: `result` an object without non-finite
    numbers, cut field by field past 1 MiB (caldera.protocol.resultcut, SPEC section 8),
    `error_message` at most ERROR_MESSAGE_CAP bytes."""
    from caldera.protocol.resultcut import cut_result  # only a finish needs it (`caldera status` does not)

    result = cut_result(result if isinstance(result, dict) else {"value": result} if result is not None else {})
    return {"agent_id": agent_id, "status": status, "finished_at": rfc3339(), "result": result,
            "error_message": cap_text(error or "", ERROR_MESSAGE_CAP)}


def cut_finish(body: dict[str, Any], why: str) -> dict[str, Any]:
    """The smallest finish the server accepts after it refused `body` (400): status kept,
    result replaced by a note, error_message capped."""
    status = body.get("status") if body.get("status") in ("succeeded", "failed") else "failed"
    note = {"cut": True, "reason": cap_text(why, 1000)}
    return {"agent_id": str(body.get("agent_id") or ""), "status": status,
            "finished_at": body.get("finished_at") or rfc3339(), "result": note,
            "error_message": cap_text(str(body.get("error_message") or ""), ERROR_MESSAGE_CAP)}


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None: Go's decoder refuses them (400)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def agent_version() -> str:
    return f"caldera-{__version__}"[:50]


def _arch() -> str:
    machine = os.uname().machine.lower()  # not platform: 0.14 MiB a daemon for two uname fields
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


class Identity:
    """Who this runtime is to the control plane; fixed for the life of the process. (A plain
    class: a NamedTuple would bring `typing` into `caldera status`, docs/performance.md
    section 1; a dataclass `dataclasses` into the daemon, section 10.)"""

    __slots__ = ("agent_id", "agent_name", "runtime_name", "capabilities")

    def __init__(self, agent_id: str, agent_name: str, runtime_name: str,
                 capabilities: tuple[str, ...] = tuple(BASE_CAPABILITIES)) -> None:
        self.agent_id = agent_id
        self.agent_name = agent_name
        self.runtime_name = runtime_name
        self.capabilities = capabilities

    def __repr__(self) -> str:
        return (f"Identity(agent_id={self.agent_id!r}, agent_name={self.agent_name!r}, "
                f"runtime_name={self.runtime_name!r}, capabilities={self.capabilities!r})")


def register_body(identity: Identity, settings: Settings) -> dict[str, Any]:
    return {
        "instance_id": settings.instance_id,
        "agent_id": identity.agent_id,
        "agent_version": agent_version(),
        "protocol_version": "v1",
        "capabilities": list(identity.capabilities),
        "host_info": {
            "runtime_type": settings.runtime_type,
            "runtime_name": identity.runtime_name,
            "persistent_dir": str(settings.persistent_dir),
            "arch": _arch(),
            "hostname": os.uname().nodename,
            "agent_name": identity.agent_name,
        },
    }


def default_section(status: str = "unknown") -> dict[str, Any]:
    """The agent part of a report when no driver speaks for the agent."""
    return {"runtime": {"openclaw_status": status, "openclaw_pid": None, "openclaw_version": None,
                        "runtime_status": status},
            "health": {"agent": "ok"}, "agent_status": None, "settings": None, "controls": []}


def _status(section: dict[str, Any]) -> str:
    value = section["runtime"].get("openclaw_status") or "unknown"
    return value if value in OPENCLAW_STATUSES else "unknown"


def heartbeat_body(agent_id: str, settings: Settings, revision_id: Any, section: dict[str, Any],
                   sample: Sample | None, skill_count: int | None) -> dict[str, Any]:
    """`sample`: the last report's (None before the first); `revision_id` as state.json has it."""
    rt = section["runtime"]
    disk_limit = settings.disk_limit_bytes
    if disk_limit is None and sample is not None:
        disk_limit = sample.disk_limit_bytes
    return {
        "agent_id": agent_id,
        "timestamp": rfc3339(),
        "openclaw_status": _status(section),
        "current_config_revision_id": revision_id,
        "summary": {
            "runtime_type": settings.runtime_type,
            "runtime_status": rt.get("runtime_status") or _status(section),
            "runtime_pid": rt.get("openclaw_pid"),
            "runtime_version": rt.get("openclaw_version"),
            "openclaw_pid": rt.get("openclaw_pid"),
            "skill_count": skill_count,
            "disk_used_bytes": sample.disk_used_bytes if sample is not None else None,
            "disk_limit_bytes": disk_limit,
        },
    }


def state_report_body(agent_id: str, settings: Settings, revision_id: Any, section: dict[str, Any],
                      sample: Sample) -> dict[str, Any]:
    """The state report, not yet redacted (the caller passes it through its Redactor)."""
    rt = section["runtime"]
    health: dict[str, Any] = {
        "runtime_process": "ok",
        "agent": "ok",
        "metrics_collector": sample.metrics_collector,
        "metrics_sample_interval_seconds": settings.report_interval,
    }
    if sample.reasons:
        health["metrics_collector_reasons"] = list(sample.reasons)
    health.update(section.get("health") or {})
    body = {
        "agent_id": agent_id,
        "reported_at": rfc3339(),
        "runtime": {
            "openclaw_status": _status(section),
            "openclaw_pid": rt.get("openclaw_pid"),
            "runtime_pid": rt.get("openclaw_pid"),
            "openclaw_version": rt.get("openclaw_version"),
            "current_config_revision_id": revision_id,
            "runtime_type": settings.runtime_type,
            "runtime_status": rt.get("runtime_status") or _status(section),
        },
        "system_info": sample.system_info,
        "health": health,
        "agent_status": section.get("agent_status"),
        "settings": section.get("settings"),
        "controls": section.get("controls") or [],
    }
    return body
