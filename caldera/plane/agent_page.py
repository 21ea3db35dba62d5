"""`/agents/ID`: one instance at length (ID = the instance number or the agent id).

Larger charts on the shared time axis, the adapter's status, the last state
report's health entries, its newest code-agent runs (linked to their pages, run_page.py), and
the instance's newest commands with status, duration, result and error. Every value an agent
sent is HTML-escaped.
"""
from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from caldera.host.timefmt import human_age
from caldera.plane import run_page, runview
from caldera.plane.page_parts import (
    LARGE,
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

COMMANDS_SHOWN = 100
RESULT_CAP = 4000  # characters of a result shown unfolded


def find_agent(store: Store, ident: str) -> dict[str, Any] | None:
    ident = urllib.parse.unquote(ident).strip("/")
    for agent in store.agents():
        if (ident.isdigit() and agent["instance_id"] == int(ident)) or (ident and agent["agent_id"] == ident):
            return agent
    return None


def render(store: Store, ident: str, query: dict[str, str]) -> tuple[int, str]:
    now = store.clock()
    agent = find_agent(store, ident)
    if agent is None:
        content = (f'<h1>No such agent</h1><p>The plane has no instance or agent <code>{e(ident)}</code>.</p>'
                   f'<p><a href="/">&larr; all agents</a></p>')
        return 404, layout("caldera plane: not found", content, now)
    instance = agent["instance_id"]
    chosen, window = window_seconds(store, query)
    last = store.reports(instance, last=True)
    body = last["body"] if last and isinstance(last["body"], dict) else {}
    host = agent["host_info"] if isinstance(agent["host_info"], dict) else {}
    content = (f'<p><a href="/">&larr; all agents</a></p>'
               f'<div class="agent" data-instance="{instance}" data-presence="{agent["presence"]}">'
               f'{agent_head(agent, now, link=False)}'
               f'<div class="meta">host {e(host.get("hostname") or "?")}'
               f' &middot; agent {e(host.get("agent_name") or "?")}'
               f' &middot; runtime {e(host.get("runtime_type") or "?")} &middot; from {e(agent["last_seen_ip"] or "?")}'
               f' &middot; {window_links(f"/agents/{instance}", chosen)}</div>'
               f'{timeline(store, agent, body, now, window, LARGE)}</div>'
               f'<div class="cols"><div class="col panel"><h3>Agent</h3>{adapter_html(body.get("agent_status"))}</div>'
               f'<div class="col panel"><h3>Health (last report{_age(last, now)})</h3>{_health(body)}</div></div>'
               f'<h2>Code-agent runs</h2><div id="runs">{run_page.runs_table(store, instance, now)}</div>'
               f'<h2>Config revisions</h2><div id="revisions">{_revisions(store, instance, body, now)}</div>'
               f'<h2>Commands</h2><div id="commands">'
               f'{_commands(store.recent_commands(COMMANDS_SHOWN, instance_id=instance), now)}</div>')
    return 200, layout(f"caldera plane: instance {instance}", content, now)


def _age(last: dict[str, Any] | None, now: float) -> str:
    return f", {human_age(now - last['received_at'])}" if last else ""


def _revisions(store: Store, instance: int, body: dict[str, Any], now: float) -> str:
    """The instance's revisions, newest first, each with what the agent last said of it
    (health.config_revisions of the last report: applied, refused, failed, rolled back)."""
    revisions = store.config_revisions(instance, limit=20)
    if not revisions:
        return '<p class="empty">No config revisions published (<code>caldera plane revision</code>).</p>'
    health = _obj(body.get("health"))
    recent = _obj(health.get("config_revisions")).get("recent")
    said = {i.get("revision_id"): i for i in (recent if isinstance(recent, list) else []) if isinstance(i, dict)}
    current = _obj(body.get("runtime")).get("current_config_revision_id")
    # Reports carry the last 5 outcomes and the page lists 20 revisions: one older than what the
    # agent last spoke of (or than the one it runs) is "no outcome reported", not "not applied yet".
    known = [i for i in [*said, current] if isinstance(i, int) and not isinstance(i, bool)]
    newest_known = max(known, default=0)
    rows = []
    for rev in revisions:
        entry = said.get(rev["id"]) or {}
        outcome = str(entry.get("outcome") or ("current" if rev["id"] == current else
                                               "not applied yet" if rev["id"] > newest_known else
                                               "no outcome reported"))
        if rev["id"] == current and outcome == "applied":
            outcome = "applied (current)"
        marks = ["desired"] if rev["desired"] else []
        rows.append(f'<tr data-revision="{rev["id"]}" data-outcome="{e(outcome.split(" ")[0])}">'
                    f'<td>{rev["id"]}</td><td>{rev["revision_no"]}</td>'
                    f'<td>{human_age(now - rev["published_at"]) if rev["published_at"] else ""}</td>'
                    f'<td>{e(", ".join(rev["carries"]))}</td><td>{e(" ".join(marks))}</td>'
                    f'<td class="status-{e(outcome.split(" ")[0])}">{e(outcome)}</td>'
                    f'<td class="wrap">{e(str(entry.get("reason") or ""))}'
                    f'{" (" + e(str(entry.get("via"))) + ")" if entry.get("via") else ""}</td></tr>')
    return ('<table><thead><tr><th>id</th><th>no.</th><th>published</th><th>carries</th><th></th><th>outcome</th>'
            '<th>why</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _health(body: dict[str, Any]) -> str:
    """The report's `health` object, one row per entry (nested values as compact JSON)."""
    health = body.get("health")
    if not isinstance(health, dict) or not health:
        return '<p class="empty">No health entries reported.</p>'
    rows = []
    for key, value in health.items():
        shown = value if isinstance(value, str) else short_json(value, 300)
        cls = f' class="level-{value}"' if value in ("ok", "warn", "bad", "off") else ""
        rows.append(f'<tr data-health="{e(key)}"><td>{e(key)}</td><td{cls}>{e(shown)}</td></tr>')
    return "<table><tbody>" + "".join(rows) + "</tbody></table>"


def duration(command: dict[str, Any], now: float) -> str:
    """Finished: start (or dispatch) to finish; still running: so far; never started: nothing."""
    return runview.span(command["started_at"] or command["dispatched_at"], command["finished_at"], now)


def _result(value: Any) -> str:
    if value is None:
        return ""
    full = json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False)
    message = value.get("message") if isinstance(value, dict) else None
    summary = message if isinstance(message, str) else short_json(value, 100)
    if len(full) > RESULT_CAP:
        full = full[:RESULT_CAP] + "\n… (cut; the whole result is in /plane/api/commands)"
    return f"<details><summary>{e(summary)}</summary><pre>{e(full)}</pre></details>"


def _commands(commands: list[dict[str, Any]], now: float) -> str:
    if not commands:
        return '<p class="empty">No commands yet.</p>'
    rows = []
    for c in commands:
        rows.append(f'<tr data-command="{c["id"]}"><td>{c["id"]}</td><td><code>{e(c["command_type"])}</code></td>'
                    f'<td class="status-{e(c["status"])}">{e(c["status"])}</td>'
                    f'<td>{human_age(now - c["issued_at"])}</td><td data-duration>{duration(c, now)}</td>'
                    f'<td class="wrap" data-result>{_result(c["result"])}</td>'
                    f'<td class="wrap error" data-error>{e(c["error_message"] or "")}</td></tr>')
    return ('<table><thead><tr><th>id</th><th>type</th><th>status</th><th>issued</th><th>duration</th>'
            '<th>result</th><th>error</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")
