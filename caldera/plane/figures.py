"""Figures out of a state report, computed as ClawManager's frontend does.

CPU% = load 1m / cores (capped at 100 %), memory and disk as used / total,
network totals over the interfaces other than `lo`. Pure functions: the page,
the text view and the history store all read reports through these.
"""
from __future__ import annotations

from typing import Any, TypeGuard

LEVELS = ("ok", "warn", "bad", "off")
# A runtime without an adapter state still has a process status: map it to a level.
STATUS_LEVELS = {"running": "ok", "starting": "warn", "error": "bad", "stopped": "off", "unknown": "off"}


def num(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def obj(value: object) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (a report's parts may be anything)."""
    return value if isinstance(value, dict) else {}


def figures(system_info: object) -> dict[str, Any]:
    """From a report's system_info: "cpu", "memory" and "disk" as (fraction in [0, 1], label)
    when known, and "network" as network_totals() gives it."""
    info = obj(system_info)
    out: dict[str, Any] = {}
    cpu = obj(info.get("cpu"))
    load = obj(cpu.get("load")).get("1m")
    cores = cpu.get("cores") or 1
    if num(load) and num(cores) and cores > 0:
        out["cpu"] = (max(0.0, min(1.0, load / cores)), f"load {load:.2f} / {cores:g} cores")
    mem = obj(info.get("memory"))
    out.update(_used("memory", mem.get("mem_total_bytes"), mem.get("mem_available_bytes")))
    disk = obj(info.get("disk"))
    out.update(_used("disk", disk.get("root_total_bytes"), disk.get("root_free_bytes")))
    out["network"] = network_totals(info.get("network"))
    return out


def _used(name: str, total: object, free: object) -> dict[str, tuple[float, str]]:
    if not num(total) or not num(free) or total <= 0:
        return {}
    used = max(0.0, min(1.0, (total - free) / total))
    return {name: (used, f"{human_bytes(total - free)} of {human_bytes(total)}")}


def network_totals(network: object) -> dict[str, Any] | None:
    if not isinstance(network, dict):
        return None
    interfaces = [i for i in network.get("interfaces") or [] if isinstance(i, dict)]
    named = [i for i in interfaces if i.get("name") != "lo"] or interfaces
    rx = sum(i.get("rx_bytes") or 0 for i in named if num(i.get("rx_bytes") or 0))
    tx = sum(i.get("tx_bytes") or 0 for i in named if num(i.get("tx_bytes") or 0))
    return {"interfaces": [i.get("name") for i in named], "rx_bytes": rx, "tx_bytes": tx}


def state_level(body: object) -> str | None:
    """The adapter's `agent_status.state.level`, else the process status mapped to a level."""
    report = obj(body)
    level = obj(obj(report.get("agent_status")).get("state")).get("level")
    if level in LEVELS:
        return str(level)
    status = obj(report.get("runtime")).get("openclaw_status")
    return STATUS_LEVELS.get(status) if isinstance(status, str) else None


def human_bytes(value: float) -> str:
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
