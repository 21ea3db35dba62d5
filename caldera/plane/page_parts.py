"""Pieces both status pages draw: the layout, bars, the adapter's status and an instance's timeline.

Everything an agent sent goes through `e()` (HTML-escaped) before it reaches the page.
"""
from __future__ import annotations

import html
import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caldera.host.timefmt import human_age
from caldera.plane import api, charts
from caldera.plane.figures import LEVELS, figures, human_bytes, obj

if TYPE_CHECKING:
    from caldera.plane.store import Store

REFRESH_SECONDS = 5
WINDOWS = {"1h": 3600, "6h": 6 * 3600, "1d": 86400, "7d": 7 * 86400}


@dataclass(frozen=True)
class Size:
    """A timeline's size in SVG units: its charts' width and height, its strips' height."""

    width: int
    height: int
    strip: int


SMALL = Size(width=600, height=40, strip=10)
LARGE = Size(width=900, height=120, strip=16)


def e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def layout(title: str, content: str, now: float, refresh: bool | str = True) -> str:
    """The page around `content`; `refresh=False` for a page that no longer changes (an ended run),
    a URL to load that one instead (a live run's page: its newest event, `#end`)."""
    template = string.Template(Path(__file__).with_name("page.html").read_text(encoding="utf-8"))
    target = f"; url={e(refresh)}" if isinstance(refresh, str) else ""
    meta = f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}{target}">\n' if refresh else ""
    note = f"refreshes every {REFRESH_SECONDS} s" if refresh else "does not refresh (nothing more will come)"
    return template.substitute(refresh_meta=meta, refresh_note=note, title=e(title), content=content,
                               server_time=e(api.rfc3339(now)))


def window_seconds(store: Store, query: dict[str, str]) -> tuple[str, float]:
    """The chosen window (`?window=1h|6h|1d|7d`), else all the history keeps."""
    name = query.get("window", "")
    if name in WINDOWS:
        return name, min(WINDOWS[name], store.history_seconds)
    return "all", store.history_seconds


def window_links(path: str, chosen: str) -> str:
    links = []
    for name in (*WINDOWS, "all"):
        href = path if name == "all" else f"{path}?window={name}"
        cls = ' class="chosen"' if name == chosen else ""
        links.append(f'<a href="{e(href)}"{cls}>{name}</a>')
    return '<span class="windows">window: ' + " ".join(links) + "</span>"


def agent_head(agent: dict[str, Any], now: float, link: bool) -> str:
    instance = agent["instance_id"]
    name = f'<a href="/agents/{instance}">instance {instance}</a>' if link else f"instance {instance}"
    seen = human_age(now - agent["last_seen"] if agent["last_seen"] else None)
    version = f' &middot; {e(agent["agent_version"])}' if agent["agent_version"] else ""
    # process mode: the PID of the agent the runtime supervises (seed 004's openclaw_pid)
    pid = f' &middot; pid {int(agent["openclaw_pid"])}' if agent.get("openclaw_pid") is not None else ""
    return (f'<div class="agent-head"><strong>{name}</strong>'
            f'<span class="agent-id">{e(agent["agent_id"] or "not registered")}</span>'
            f'<span class="presence {agent["presence"]}">{agent["presence"]}</span>'
            f'<span class="meta">last seen {seen}{version} &middot; '
            f'status {e(agent["openclaw_status"] or "unknown")}{pid}</span></div>')


def bar(name: str, fraction: float, label: str, cls: str = "") -> str:
    pct = max(0.0, min(1.0, fraction)) * 100
    level = cls or ("bad" if pct >= 90 else "warn" if pct >= 75 else "")
    return (f'<div class="bar-row" data-bar="{e(name)}"><span>{e(name)}</span>'
            f'<div class="bar" title="{pct:.0f}%"><div class="fill {level}" style="width:{pct:.1f}%"></div></div>'
            f'<span class="num">{pct:.0f}%{" &middot; " + e(label) if label else ""}</span></div>')


def level_of(value: object) -> str:
    return value if isinstance(value, str) and value in LEVELS else "off"


def adapter_html(status: object) -> str:
    """The adapter's state, detail, gauges (bars) and its own health entries."""
    if not isinstance(status, dict):
        return '<p class="empty">No adapter status.</p>'
    state = obj(status.get("state"))
    level = level_of(state.get("level"))
    parts = [f'<div class="state level-{level}" data-level="{level}">{e(state.get("label") or level)}</div>']
    if status.get("detail"):
        parts.append(f'<div class="meta">{e(status["detail"])}</div>')
    for gauge in status.get("gauges") or []:
        if isinstance(gauge, dict) and isinstance(gauge.get("used"), (int, float)) \
                and not isinstance(gauge.get("used"), bool):
            label = gauge.get("label") or ""
            if gauge.get("resets_at"):
                label = f"{label} (resets {gauge['resets_at']})".strip()
            parts.append(bar(str(gauge.get("name") or "gauge"), float(gauge["used"]), str(label)))
    for entry in status.get("health") or []:
        if isinstance(entry, dict):
            lvl = level_of(entry.get("level"))
            parts.append(f'<div class="level-{lvl}">{e(entry.get("name"))}: {e(entry.get("reason") or lvl)}</div>')
    held = status.get("held") or []
    if isinstance(held, list) and held:
        parts.append(f'<div class="meta">held: {e("; ".join(map(str, held)))}</div>')
    return "".join(parts)


def short_json(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 1] + "…"


# ---- the timeline: charts and strips on one time axis -----------------------------------------

def timeline(store: Store, agent: dict[str, Any], body: dict[str, Any], now: float, window: float,
             size: Size) -> str:
    """CPU, memory, disk and network lines, presence and state-level strips, then the time ticks."""
    instance = agent["instance_id"]
    # merged in the store once a window holds more buckets than the chart has room for
    step = store.history_step(instance, now - window, size.width // 3)
    points = store.history_buckets(instance, now - window, step)
    if not points:
        return '<p class="empty">No history yet.</p>'
    axis = charts.axis_for(points, now, window, step, size.width, size.height)
    figs = figures(body.get("system_info"))
    rows = []
    for key, title in (("cpu", "CPU"), ("memory", "Memory"), ("disk", "Disk")):
        value = f"{figs[key][0] * 100:.0f}% &middot; {e(figs[key][1])}" if key in figs else "&ndash;"
        chart = charts.line_chart(key, [(key, charts.series(points, key, axis))], axis, 1.0, f"{title} over time")
        rows.append(_row(title, chart, value, key))
    rows.append(_network_row(points, axis))
    strip_axis = axis.resized(size.width, size.strip)
    rows.append(_row("Presence", charts.strip("presence", charts.presence_segments(points, now), strip_axis,
                                              charts.PRESENCE_RANK),
                     f'<span class="presence {agent["presence"]}">{agent["presence"]}</span>', "presence"))
    levels = charts.level_segments(points, step, axis.gap, now)
    current = levels[-1][2] if levels else None
    rows.append(_row("State", charts.strip("level", levels, strip_axis, charts.LEVEL_RANK),
                     f'<span class="level-{level_of(current)}">{e(current or "none reported")}</span>', "level"))
    tick_html = "".join(f'<span style="left:{pct:.0f}%">{e(label)}</span>' for pct, label in charts.ticks(axis))
    rows.append(f'<div class="series-row axis"><span></span><div class="ticks">{tick_html}</div>'
                f'<span class="num">UTC</span></div>')
    return f'<div class="timeline" data-timeline="{instance}">' + "".join(rows) + "</div>"


def _row(title: str, svg: str, value: str, key: str) -> str:
    return (f'<div class="series-row" data-row="{e(key)}"><span>{e(title)}</span>{svg}'
            f'<span class="num" data-figure="{e(key)}">{value}</span></div>')


def _network_row(points: list[dict[str, Any]], axis: charts.Axis) -> str:
    rx, tx = charts.series(points, "rx_rate", axis), charts.series(points, "tx_rate", axis)
    peak = max([v for _, v in rx + tx] + [1.0])
    rated = [p for p in points if p.get("rx_rate") is not None]
    if rated:
        value = (f'<span class="rx">in {human_bytes(rated[-1]["rx_rate"])}/s</span> &middot; '
                 f'<span class="tx">out {human_bytes(rated[-1]["tx_rate"])}/s</span>'
                 f' &middot; peak {human_bytes(peak)}/s')
    else:
        value = "&ndash;"
    chart = charts.line_chart("network", [("rx", rx), ("tx", tx)], axis, peak, "Network bytes/s over time")
    return _row("Network", chart, value, "network")
