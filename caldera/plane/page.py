"""The read-only status pages (`/`, `/agents/ID`) and the operator's JSON reads under `/plane/api/`.

Server-rendered HTML (template `page.html`, inline CSS, inline SVG charts, no
script, no external asset) that refreshes itself. `/`: per instance, presence,
a timeline of CPU/memory/disk/network with presence and state-level strips on
one time axis (`page_parts.timeline`, history from `history.py`), the adapter's
state and gauges; then the recent commands. `/agents/ID` (`agent_page.py`): the
same larger, the last report's health and the instance's command history.
`?window=1h|6h|1d|7d` narrows the charts; the default is all the history keeps.
"""
from __future__ import annotations

import re
import urllib.parse
from typing import TYPE_CHECKING, Any

from caldera import __version__
from caldera.host.timefmt import human_age
from caldera.plane import agent_page, api, run_page
from caldera.plane.page_parts import (
    SMALL,
    adapter_html,
    agent_head,
    e,
    layout,
    short_json,
    timeline,
    window_links,
    window_seconds,
)

if TYPE_CHECKING:
    from caldera.plane.store import Store

RECENT_COMMANDS = 20
HTML = "text/html; charset=utf-8"


def handle(plane: api.Plane, req: api.Request) -> api.Response:
    if req.method != "GET":
        return api.Response(404, b"", "text/plain; charset=utf-8")
    if req.path == "/":
        return api.Response(200, render(plane.store, req.query).encode(), HTML)
    if req.path.startswith("/agents/"):
        ident, _, run_id = req.path[len("/agents/"):].partition("/runs/")
        if run_id:
            status, text = _run_page(plane.store, ident, run_id, req.query)
        else:
            status, text = agent_page.render(plane.store, ident, req.query)
        return api.Response(status, text.encode(), HTML)
    reads = {"/plane/api/agents": _agents_json, "/plane/api/commands": _commands_json,
             "/plane/api/reports": _reports_json, "/plane/api/runs": _runs_json,
             "/plane/api/run-events": _run_events_json}
    read = reads.get(req.path)
    if read is None:
        return api.Response(404, b"", "text/plain; charset=utf-8")
    try:
        return api.ok(read(plane.store, req.query))
    except ValueError as exc:
        return api.error(400, str(exc))


def _instance(query: dict[str, str]) -> int:
    raw = query.get("instance", "")
    if not re.fullmatch(r"[0-9]{1,18}", raw):
        raise ValueError("?instance=N is required (an integer)")
    return int(raw)


def _agents_json(store: Store, _query: dict[str, str]) -> dict[str, Any]:
    return {"agents": store.agents()}


def _commands_json(store: Store, query: dict[str, str]) -> dict[str, Any]:
    if "instance" in query:
        return {"commands": store.commands(_instance(query))}
    return {"commands": store.recent_commands(RECENT_COMMANDS)}


def _reports_json(store: Store, query: dict[str, str]) -> dict[str, Any]:
    return {"report": store.reports(_instance(query), last=True)}


def _runs_json(store: Store, query: dict[str, str]) -> dict[str, Any]:
    """`?instance=N`: its newest runs (at most 1,000)."""
    return {"runs": store.runs(_instance(query), 1000)}


def _run_events_json(store: Store, query: dict[str, str]) -> dict[str, Any]:
    """`?instance=N&run=RUN_ID[&after=SEQ]`: the run and up to 1,000 of its events after SEQ."""
    instance = _instance(query)
    after = query.get("after", "0")
    if not re.fullmatch(r"[0-9]{1,18}", after):  # int() of 2**63 or of '²' would be a 500
        raise ValueError("?after=SEQ must be a whole number of at most 18 digits")
    run = store.run(query.get("run", ""), instance)
    if run is None:
        raise ValueError(f"instance {instance} has no run {query.get('run', '')!r}")
    return {"run": run, "events": store.run_events(instance, run["run_id"], after=int(after), limit=1000)}


def _run_page(store: Store, ident: str, run_id: str, query: dict[str, str]) -> tuple[int, str]:
    agent = agent_page.find_agent(store, ident)
    if agent is None:
        return agent_page.render(store, ident, query)  # its "no such agent" page
    return run_page.render(store, agent["instance_id"], urllib.parse.unquote(run_id).strip("/"), query)


# ---- `/` ---------------------------------------------------------------------------------------

def render(store: Store, query: dict[str, str] | None = None) -> str:
    now = store.clock()
    chosen, window = window_seconds(store, query or {})
    cards = [_agent_card(store, a, now, window) for a in store.agents()]
    content = (f'<h1>caldera plane</h1><div class="sub">Protocol v1 reference control plane &middot; '
               f'caldera {e(__version__)} &middot; '
               f'{window_links("/", chosen)}</div>'
               f'<h2>Agents</h2><div id="agents">{"".join(cards) or "<p class=empty>No instances.</p>"}</div>'
               f'<h2>Recent commands</h2><div id="commands">'
               f'{_commands_table(store.recent_commands(RECENT_COMMANDS), now)}</div>')
    return layout("caldera plane", content, now)


def _agent_card(store: Store, agent: dict[str, Any], now: float, window: float) -> str:
    instance = agent["instance_id"]
    last = store.reports(instance, last=True)
    body = last["body"] if last and isinstance(last["body"], dict) else {}
    return (f'<div class="agent" data-instance="{instance}" data-presence="{agent["presence"]}">'
            f'{agent_head(agent, now, link=True)}'
            f'<div class="cols"><div class="col wide"><h3>History</h3>'
            f'{timeline(store, agent, body, now, window, SMALL)}</div>'
            f'<div class="col"><h3>Agent</h3>{adapter_html(body.get("agent_status"))}'
            f'<p><a href="/agents/{instance}">details, health and command history &rarr;</a></p></div></div></div>')


def _commands_table(commands: list[dict[str, Any]], now: float) -> str:
    if not commands:
        return '<p class="empty">No commands yet.</p>'
    rows = []
    for c in commands:
        result = c["result"]
        message = result.get("message") if isinstance(result, dict) else None
        outcome = c["error_message"] or (message if isinstance(message, str) else
                                         short_json(result) if result is not None else "")
        rows.append(f'<tr data-command="{c["id"]}"><td>{c["id"]}</td>'
                    f'<td><a href="/agents/{c["instance_id"]}">{c["instance_id"]}</a></td>'
                    f'<td><code>{e(c["command_type"])}</code></td><td class="status-{c["status"]}">{c["status"]}</td>'
                    f'<td>{human_age(now - c["issued_at"])}</td><td>{e(outcome)}</td></tr>')
    return ('<table><thead><tr><th>id</th><th>instance</th><th>type</th><th>status</th><th>issued</th>'
            '<th>result</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")
