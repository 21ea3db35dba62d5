"""What the plane saw of one instance, as text (for `caldera demo` and people at a terminal)."""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from caldera.host.timefmt import human_age
from caldera.plane.figures import figures, human_bytes, obj

if TYPE_CHECKING:
    from caldera.plane.store import Store

BAR_WIDTH = 24
LABEL_WIDTH = 9  # the first column: "CPU", "memory", … and the agent's gauge names
LABEL_MAX = 24  # a longer gauge name is cut there (with "…"), never to the column


def bar(fraction: float) -> str:
    fraction = max(0.0, min(1.0, fraction))
    filled = round(fraction * BAR_WIDTH)
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + f"] {fraction * 100:3.0f}%"


def render(store: Store, instance_id: int, command_ids: Iterable[int] | None = None) -> str:
    now = store.clock()
    agent = next((a for a in store.agents() if a["instance_id"] == instance_id), None)
    if agent is None:
        return f"the plane has no instance {instance_id}"
    seen = human_age(now - agent["last_seen"]) if agent["last_seen"] else "never"
    last = store.reports(instance_id, last=True)
    body = obj(last["body"]) if last else {}
    width = _label_width(body.get("agent_status"))
    lines = [f"What the plane saw of instance {instance_id}:",
             f"  {'agent':<{width}} {agent['agent_id'] or '(not registered)'}  {agent['presence']} (last seen {seen}), "
             f"{agent['agent_version'] or '-'}, status {agent['openclaw_status'] or 'unknown'}"]
    runtime = obj(body.get("runtime"))
    if runtime.get("openclaw_pid") is not None:  # process mode: the agent the runtime supervises
        proc = (body.get("health") or {}).get("agent_process") or {}
        lines.append(f"  {'process':<{width}} pid {runtime['openclaw_pid']}, {runtime.get('openclaw_status') or '?'}, "
                     f"{proc.get('restarts', 0)} restart(s), version {runtime.get('openclaw_version') or '-'}")
    figs = figures(body.get("system_info"))
    for key, title in (("cpu", "CPU"), ("memory", "memory"), ("disk", "disk")):
        if key in figs:
            lines.append(f"  {title:<{width}} {bar(figs[key][0])}  {figs[key][1]}")
    net = figs.get("network")
    if net:
        lines.append(f"  {'network':<{width}} rx {human_bytes(net['rx_bytes'])}, tx {human_bytes(net['tx_bytes'])} "
                     f"({', '.join(map(str, net['interfaces'])) or 'no interfaces'})")
    lines.extend(_agent_status(body.get("agent_status"), width))
    lines.extend(_commands(store, instance_id, command_ids))
    return "\n".join(lines)


def _gauge_name(gauge: dict[str, Any]) -> str:
    name = str(gauge.get("name") or "gauge")
    return name if len(name) <= LABEL_MAX else name[:LABEL_MAX - 1] + "…"


def _gauges(status: object) -> list[dict[str, Any]]:
    gauges = status.get("gauges") if isinstance(status, dict) else None
    return [g for g in gauges or [] if isinstance(g, dict) and isinstance(g.get("used"), (int, float))]


def _label_width(status: object) -> int:
    """The first column fits the longest gauge name (up to LABEL_MAX): "files waiting" whole."""
    return max([LABEL_WIDTH, *(len(_gauge_name(g)) for g in _gauges(status))])


def _agent_status(status: object, width: int = LABEL_WIDTH) -> list[str]:
    # "state": the agent's own state, as its adapter or (process mode) its status file says it
    if not isinstance(status, dict):
        return [f"  {'state':<{width}} (no status reported)"]
    state = obj(status.get("state"))
    out = [f"  {'state':<{width}} {state.get('level', '?')}: {state.get('label') or ''}".rstrip()]
    for gauge in _gauges(status):
        out.append(f"  {_gauge_name(gauge):<{width}} {bar(float(gauge['used']))}  "
                   f"{gauge.get('label') or ''}".rstrip())
    held = status.get("held") or []
    if held:
        out.append(f"  {'held':<{width}} {'; '.join(map(str, held))}")
    return out


def _commands(store: Store, instance_id: int, command_ids: Iterable[int] | None) -> list[str]:
    commands = store.commands(instance_id)
    if command_ids is not None:
        wanted = set(command_ids)
        commands = [c for c in commands if c["id"] in wanted]
    if not commands:
        return ["  commands  none"]
    out = ["  commands:"]
    for c in commands:
        outcome = c["error_message"] or _short(c["result"])
        out.append(f"    #{c['id']:<4} {c['command_type']:<20} {c['status']:<10} {outcome}")
    return out


def _short(result: Any, limit: int = 100) -> str:
    if result is None:
        return ""
    if isinstance(result, dict) and isinstance(result.get("message"), str):
        return result["message"][:limit]
    text = json.dumps(result, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= limit else text[:limit - 1] + "…"
