"""`/agents/ID/runs/RUN_ID`: one code-agent turn as a person reads it, and the runs table of
`/agents/ID`.

The prompt, then the events in seq order through `runview.blocks` (the assistant's words,
each command with its output, tool calls, diffs), then the end: the terminal status and
failure kind, or "running" while the run is live, when the page reloads itself every few
seconds at its newest event (`#end`; meta refresh, no script). A long run shows its last
PAGE_EVENTS events with links to earlier pages (`?from=SEQ`), so that the page stays small.
Every text comes from the agent or the model and is HTML-escaped (`e`).
"""
from __future__ import annotations

import re
import urllib.parse
from typing import TYPE_CHECKING, Any

from caldera.host.timefmt import human_age
from caldera.plane import runs, runview
from caldera.plane.page_parts import e, layout

if TYPE_CHECKING:
    from caldera.plane.store import Store

PAGE_EVENTS = 500
RUNS_SHOWN = 20


def run_href(instance: int, run_id: str) -> str:
    return f"/agents/{instance}/runs/{urllib.parse.quote(run_id, safe='')}"


def runs_table(store: Store, instance: int, now: float) -> str:
    """The agent's newest runs, each linked to its page."""
    rows = store.runs(instance, RUNS_SHOWN)
    if not rows:
        return '<p class="empty">No code-agent runs yet (<code>caldera plane turn</code>).</p>'
    out = []
    for r in rows:
        events = str(r["events"]) + (f" of {r['events_total']}" if r["events_total"] not in (None, r["events"]) else "")
        out.append(f'<tr data-run="{e(r["run_id"])}"><td><a href="{e(run_href(instance, r["run_id"]))}">'
                   f'{e(r["run_id"])}</a></td><td>{e(r["backend"] or "")}</td>'
                   f'<td class="status-{e(r["status"])}">{e(r["status"])}</td><td>{e(r["failure_kind"] or "")}</td>'
                   f'<td>{e(events)}</td><td>{human_age(now - r["created_at"])}</td>'
                   f'<td>{e(runview.run_duration(r, now))}</td></tr>')
    return ('<table><thead><tr><th>run</th><th>backend</th><th>status</th><th>failure kind</th><th>events</th>'
            '<th>queued</th><th>duration</th></tr></thead><tbody>' + "".join(out) + "</tbody></table>")


def render(store: Store, instance: int, run_id: str, query: dict[str, str]) -> tuple[int, str]:
    now = store.clock()
    run = store.run(run_id, instance)
    back = f'<p><a href="/agents/{instance}">&larr; instance {instance}</a></p>'
    if run is None:
        content = f'{back}<h1>No such run</h1><p>Instance {instance} has no run <code>{e(run_id)}</code>.</p>'
        return 404, layout("caldera plane: no such run", content, now, refresh=False)
    live = run["status"] in runs.LIVE
    start = query.get("from", "")
    if start and not re.fullmatch(r"[0-9]{1,18}", start):  # int() of 2**63 or of '²' would be a 500
        content = f'{back}<h1>Bad page</h1><p>?from=SEQ must be a whole number of at most 18 digits.</p>'
        return 400, layout("caldera plane: bad page", content, now, refresh=False)
    if start:
        events = store.run_events(instance, run_id, after=int(start) - 1, limit=PAGE_EVENTS)
    else:
        events = store.run_events(instance, run_id, limit=PAGE_EVENTS, last=True)
    content = (f'{back}<h1>Run <code>{e(run_id)}</code></h1>{_facts(run, now)}'
               f'<h2>Prompt</h2><div class="prompt" id="prompt">{e(run["prompt"] or "(not known to this plane)")}</div>'
               f'<h2>Turn</h2><div class="turn" id="turn">{_paging(instance, run, events)}'
               f'{"".join(_event(ev) for ev in events)}{_end(run, events, live)}</div>')
    href = run_href(instance, run_id)
    return 200, layout(f"caldera plane: run {run_id}", content, now, refresh=f"{href}#end" if live else False)


def _facts(run: dict[str, Any], now: float) -> str:
    total = run["events_total"]
    events = f"{run['events']} events" + (f" of {total}" if total is not None and total != run["events"] else "")
    parts = [f'<span class="status-{e(run["status"])}" data-status>{e(run["status"])}</span>',
             f"backend {e(run['backend'] or '?')}", e(events), f"queued {human_age(now - run['created_at'])}"]
    if run["started_at"] is not None:
        parts.append(f"duration {e(runview.run_duration(run, now))}")
    if run["workspace"]:
        parts.append(f"workspace <code>{e(run['workspace'])}</code>")
    return f'<div class="meta" id="run-facts">{" &middot; ".join(parts)}</div>'


def _paging(instance: int, run: dict[str, Any], events: list[dict[str, Any]]) -> str:
    if not events:
        return ""
    first, last = events[0].get("seq"), events[-1].get("seq")
    href = run_href(instance, run["run_id"])
    links = []
    if isinstance(first, int) and first > 1:
        links.append(f'<a href="{e(href)}?from={max(1, first - PAGE_EVENTS)}">&larr; earlier events</a>')
        links.append(f'<a href="{e(href)}?from=1">from the start</a>')
    if isinstance(last, int) and last < run["last_seq"]:
        links.append(f'<a href="{e(href)}?from={last + 1}">later events &rarr;</a>')
        links.append(f'<a href="{e(href)}">the newest</a>')
    if not links:
        return ""
    return (f'<p class="meta" id="paging">events {first} to {last} of {run["last_seq"]} &middot; '
            f'{" &middot; ".join(links)}</p>')


def _event(event: dict[str, Any]) -> str:
    kind = str(event.get("type"))
    parts = []
    for part, text in runview.blocks(event):
        text = runview.terminal_safe(text)  # a command's colours as \x1b…, not as boxes
        if part == "body" and kind == "assistant_message":
            parts.append(f'<div class="body">{e(text)}</div>')
        elif part == "body":
            parts.append(f"<pre>{e(text)}</pre>")
        elif part == "diff":
            parts.append(f'<pre class="diff">{e(text)}</pre>')
        elif part == "end":
            status = str((event.get("data") or {}).get("status") or "")
            parts.append(f'<div class="end {e(status)}" data-end>{e(text)}</div>')
        else:
            parts.append(f'<div class="head">{e(text)}</div>')
    return f'<div class="ev {e(kind)}" data-seq="{e(event.get("seq"))}">{"".join(parts)}</div>'


def _end(run: dict[str, Any], events: list[dict[str, Any]], live: bool) -> str:
    """What comes after the last event shown: still running, events missing, or an end the
    events never told (a run refused or interrupted before its terminal event)."""
    notes = []
    if live:
        notes.append('<div class="end running" data-end>running&hellip; (this page reloads itself every few seconds)'
                     '</div>')
    elif not any(ev.get("type") == "terminal_status" for ev in events) and run["last_seq"] == (events[-1].get("seq")
                                                                                             if events else 0):
        sentence = runview.end_sentence(run["status"], run["failure_kind"], run["message"] or run.get("error_message"))
        notes.append(f'<div class="end {e(run["status"])}" data-end>{e(sentence)}</div>')
    total = run["events_total"]
    if total is not None and total > run["events"]:
        notes.append(f'<p class="meta">{total - run["events"]} of the run\'s {total} events have not reached the '
                     f'plane (yet); the run log on the host has them all.</p>')
    return "".join(notes) + '<div id="end"></div>'
