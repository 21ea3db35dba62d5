"""Figures out of a state report, computed as ClawManager's frontend does.

CPU% = load 1m / cores (capped at 100 %), memory and disk as used / total,
network totals over the interfaces other than `lo`. Pure functions: the page,
the text view and the history store all read reports through these.
"""
from __future__ import annotations

LEVELS = ("ok", "warn", "bad", "off")
# A runtime without an adapter state still has a process status: map it to a level.
STATUS_LEVELS = {"running": "ok", "starting": "warn", "error": "bad", "stopped": "off", "unknown": "off"}


def num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def figures(system_info) -> dict:
    """CPU/memory/disk as (fraction in [0, 1], label) and network totals, from a report's system_info."""
    info = system_info if isinstance(system_info, dict) else {}
    out = {}
    cpu = info.get("cpu") if isinstance(info.get("cpu"), dict) else {}
    load = (cpu.get("load") if isinstance(cpu.get("load"), dict) else {}).get("1m")
    cores = cpu.get("cores") or 1
    if num(load) and num(cores) and cores > 0:
        out["cpu"] = (max(0.0, min(1.0, load / cores)), f"load {load:.2f} / {cores:g} cores")
    mem = info.get("memory") if isinstance(info.get("memory"), dict) else {}
    out.update(_used("memory", mem.get("mem_total_bytes"), mem.get("mem_available_bytes")))
    disk = info.get("disk") if isinstance(info.get("disk"), dict) else {}
    out.update(_used("disk", disk.get("root_total_bytes"), disk.get("root_free_bytes")))
    out["network"] = network_totals(info.get("network"))
    return out


def _used(name: str, total, free) -> dict:
    if not (num(total) and num(free)) or total <= 0:
        return {}
    used = max(0.0, min(1.0, (total - free) / total))
    return {name: (used, f"{human_bytes(total - free)} of {human_bytes(total)}")}


def network_totals(network) -> dict | None:
    if not isinstance(network, dict):
        return None
    interfaces = [i for i in network.get("interfaces") or [] if isinstance(i, dict)]
    named = [i for i in interfaces if i.get("name") != "lo"] or interfaces
    rx = sum(i.get("rx_bytes") or 0 for i in named if num(i.get("rx_bytes") or 0))
    tx = sum(i.get("tx_bytes") or 0 for i in named if num(i.get("tx_bytes") or 0))
    return {"interfaces": [i.get("name") for i in named], "rx_bytes": rx, "tx_bytes": tx}


def state_level(body) -> str | None:
    """The adapter's `agent_status.state.level`, else the process status mapped to a level."""
    body = body if isinstance(body, dict) else {}
    status = body.get("agent_status") if isinstance(body.get("agent_status"), dict) else {}
    state = status.get("state") if isinstance(status.get("state"), dict) else {}
    if state.get("level") in LEVELS:
        return state["level"]
    runtime = body.get("runtime") if isinstance(body.get("runtime"), dict) else {}
    return STATUS_LEVELS.get(runtime.get("openclaw_status"))


def human_bytes(value) -> str:
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
