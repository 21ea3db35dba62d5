"""The read-only status page at `/` and the operator's JSON reads under `/plane/api/`.

One server-rendered HTML page (template `page.html`, inline CSS, no script, no
external asset) that refreshes itself: agents with presence, the latest
CPU/memory/disk/network figures and the adapter's gauges drawn as bars, and
the recent commands. Figures are computed as ClawManager's frontend does
(CPU% = load 1m / cores, memory and disk as used / total, `lo` left out).
"""
from __future__ import annotations

import html
import json
import string
from pathlib import Path

from caldera.plane import api
from caldera.host.timefmt import human_age

REFRESH_SECONDS = 5
RECENT_COMMANDS = 20


def handle(plane: api.Plane, req: api.Request) -> api.Response:
    if req.method != "GET":
        return api.Response(404, b"", "text/plain; charset=utf-8")
    if req.path == "/":
        return api.Response(200, render(plane.store).encode(), "text/html; charset=utf-8")
    reads = {"/plane/api/agents": _agents_json, "/plane/api/commands": _commands_json,
             "/plane/api/reports": _reports_json}
    read = reads.get(req.path)
    if read is None:
        return api.Response(404, b"", "text/plain; charset=utf-8")
    try:
        return api.ok(read(plane.store, req.query))
    except ValueError as exc:
        return api.error(400, str(exc))


def _instance(query: dict) -> int:
    raw = query.get("instance", "")
    if not raw.isdigit():
        raise ValueError("?instance=N is required (an integer)")
    return int(raw)


def _agents_json(store, _query):
    return {"agents": store.agents()}


def _commands_json(store, query):
    if "instance" in query:
        return {"commands": store.commands(_instance(query))}
    return {"commands": store.recent_commands(RECENT_COMMANDS)}


def _reports_json(store, query):
    return {"report": store.reports(_instance(query), last=True)}


# ---- figures ---------------------------------------------------------------------------

def figures(system_info) -> dict:
    """CPU/memory/disk as fractions in [0, 1] and network totals, from a report's system_info."""
    info = system_info if isinstance(system_info, dict) else {}
    out = {}
    cpu = info.get("cpu") or {}
    load = (cpu.get("load") or {}).get("1m")
    cores = cpu.get("cores") or 1
    if _num(load) and _num(cores) and cores > 0:
        out["cpu"] = (min(1.0, load / cores), f"load {load:.2f} / {cores:g} cores")
    mem = info.get("memory") or {}
    out.update(_used("memory", mem.get("mem_total_bytes"), mem.get("mem_available_bytes")))
    disk = info.get("disk") or {}
    out.update(_used("disk", disk.get("root_total_bytes"), disk.get("root_free_bytes")))
    out["network"] = network_totals(info.get("network"))
    return out


def _num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _used(name: str, total, free) -> dict:
    if not (_num(total) and _num(free)) or total <= 0:
        return {}
    used = max(0.0, min(1.0, (total - free) / total))
    return {name: (used, f"{human_bytes(total - free)} of {human_bytes(total)}")}


def network_totals(network) -> dict | None:
    if not isinstance(network, dict):
        return None
    interfaces = [i for i in network.get("interfaces") or [] if isinstance(i, dict)]
    named = [i for i in interfaces if i.get("name") != "lo"] or interfaces
    rx = sum(i.get("rx_bytes") or 0 for i in named if _num(i.get("rx_bytes") or 0))
    tx = sum(i.get("tx_bytes") or 0 for i in named if _num(i.get("tx_bytes") or 0))
    return {"interfaces": [i.get("name") for i in named], "rx_bytes": rx, "tx_bytes": tx}


def human_bytes(value) -> str:
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


# ---- rendering ---------------------------------------------------------------------------

def render(store) -> str:
    template = string.Template((Path(__file__).with_name("page.html")).read_text(encoding="utf-8"))
    now = store.clock()
    agents = [_agent_card(store, a, now) for a in store.agents()]
    return template.substitute(
        refresh=REFRESH_SECONDS, server_time=html.escape(api.rfc3339(now)),
        agents="\n".join(agents) or '<p class="empty">No instances.</p>',
        commands=_commands_table(store.recent_commands(RECENT_COMMANDS), now))


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _bar(name: str, fraction: float, label: str, cls: str = "") -> str:
    pct = max(0.0, min(1.0, fraction)) * 100
    level = cls or ("bad" if pct >= 90 else "warn" if pct >= 75 else "")
    return (f'<div class="bar-row" data-bar="{_e(name)}"><span>{_e(name)}</span>'
            f'<div class="bar" title="{pct:.0f}%"><div class="fill {level}" style="width:{pct:.1f}%"></div></div>'
            f'<span class="num">{pct:.0f}%{" &middot; " + _e(label) if label else ""}</span></div>')


def _agent_card(store, agent: dict, now: float) -> str:
    instance = agent["instance_id"]
    reports = store.latest_reports(instance, 2)
    body = reports[0]["body"] if reports else {}
    head = (f'<div class="agent-head"><strong>instance {instance}</strong>'
            f'<span class="agent-id">{_e(agent["agent_id"] or "not registered")}</span>'
            f'<span class="presence {agent["presence"]}">{agent["presence"]}</span>'
            f'<span class="meta">last seen {human_age(now - agent["last_seen"] if agent["last_seen"] else None)}'
            f' &middot; {_e(agent["agent_version"] or "")} &middot; status {_e(agent["openclaw_status"] or "unknown")}'
            f'</span></div>')
    return (f'<div class="agent" data-instance="{instance}" data-presence="{agent["presence"]}">{head}'
            f'<div class="cols"><div class="col"><h3>System</h3>{_figures_html(body, reports)}</div>'
            f'<div class="col"><h3>Agent</h3>{_adapter_html(body.get("agent_status"))}</div></div></div>')


def _figures_html(body: dict, reports: list) -> str:
    if not body:
        return '<p class="empty">No state report yet.</p>'
    figs = figures(body.get("system_info"))
    rows = [_bar(name.upper() if name == "cpu" else name.capitalize(), *figs[name])
            for name in ("cpu", "memory", "disk") if name in figs]
    net = figs.get("network")
    if net:
        rate = _net_rate(reports)
        rows.append(f'<div class="net" data-figure="network"><span>Network</span> '
                    f'<span class="num">rx {human_bytes(net["rx_bytes"])} &middot; tx {human_bytes(net["tx_bytes"])}'
                    f'{rate} ({_e(", ".join(str(n) for n in net["interfaces"]) or "no interfaces")})</span></div>')
    return "".join(rows) or '<p class="empty">The report has no system figures.</p>'


def _net_rate(reports: list) -> str:
    if len(reports) < 2:
        return ""
    new, old = (network_totals((r["body"].get("system_info") or {}).get("network")) for r in reports[:2])
    elapsed = reports[0]["received_at"] - reports[1]["received_at"]
    if not new or not old or elapsed <= 0:
        return ""
    rx = max(0, new["rx_bytes"] - old["rx_bytes"]) / elapsed
    tx = max(0, new["tx_bytes"] - old["tx_bytes"]) / elapsed
    return f" &middot; {human_bytes(rx)}/s in, {human_bytes(tx)}/s out"


def _adapter_html(status) -> str:
    if not isinstance(status, dict):
        return '<p class="empty">No adapter status.</p>'
    state = status.get("state") if isinstance(status.get("state"), dict) else {}
    level = state.get("level") if state.get("level") in ("ok", "warn", "bad", "off") else "off"
    parts = [f'<div class="state level-{level}" data-level="{level}">{_e(state.get("label") or level)}</div>']
    if status.get("detail"):
        parts.append(f'<div class="meta">{_e(status["detail"])}</div>')
    for gauge in status.get("gauges") or []:
        if isinstance(gauge, dict) and _num(gauge.get("used")):
            label = gauge.get("label") or ""
            if gauge.get("resets_at"):
                label = f"{label} (resets {gauge['resets_at']})".strip()
            parts.append(_bar(str(gauge.get("name") or "gauge"), float(gauge["used"]), label))
    for entry in status.get("health") or []:
        if isinstance(entry, dict):
            lvl = entry.get("level") if entry.get("level") in ("ok", "warn", "bad", "off") else "off"
            parts.append(f'<div class="level-{lvl}">{_e(entry.get("name"))}: {_e(entry.get("reason") or lvl)}</div>')
    return "".join(parts)


def _commands_table(commands: list, now: float) -> str:
    if not commands:
        return '<p class="empty">No commands yet.</p>'
    rows = []
    for c in commands:
        result = c["result"]
        message = result.get("message") if isinstance(result, dict) else None
        outcome = c["error_message"] or (message if isinstance(message, str) else
                                         _short(result) if result is not None else "")
        rows.append(f'<tr data-command="{c["id"]}"><td>{c["id"]}</td><td>{c["instance_id"]}</td>'
                    f'<td><code>{_e(c["command_type"])}</code></td><td class="status-{c["status"]}">{c["status"]}</td>'
                    f'<td>{human_age(now - c["issued_at"])}</td><td>{_e(outcome)}</td></tr>')
    return ('<table><thead><tr><th>id</th><th>instance</th><th>type</th><th>status</th><th>issued</th>'
            '<th>result</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


def _short(value, limit: int = 160) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= limit else text[:limit - 1] + "…"
