"""The soak's accounting after the calm tail (docs/reliability.md, "The accounting").

Each check returns misses: one sentence each. The rules for a command's status:

* an out-of-bounds `settings_set` must fail, and its error names the setting;
* any other command must succeed, unless a cause of failure was present between its dispatch
  at the plane and its finish (a second either side): the adapter in a failing mood (hang,
  garbage, exit1; for commands that call the adapter), a SIGKILL of the runtime, or the full
  disk. Then it may also fail, with an error that names one of the causes present:
  the adapter ("adapter", "timed out"; a `log_get` refused by exit 1 says "no such log"),
  the kill ("interrupted"), the disk ("space", "disk", "full").
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAILING_MOODS = ("hang", "garbage", "exit1")
ADAPTER_TYPES = ("pause", "resume", "run_now", "settings_get", "settings_set", "log_get")
CONTROL_TYPES = ("pause", "resume", "run_now", "settings_get", "settings_set", "log_list")
CAUSE_WORDS = {
    "adapter": re.compile(r"adapter|timed out", re.I),
    "kill": re.compile(r"interrupted", re.I),
    "disk": re.compile(r"space|disk|full", re.I),
}
SLACK = 1.0


@dataclass
class Timeline:
    """When each thing held: moods [(start, end, mood)], kills [t], disk [(start, end)]."""

    moods: list[tuple[float, float, str]] = field(default_factory=list)
    kills: list[float] = field(default_factory=list)
    disk: list[tuple[float, float]] = field(default_factory=list)

    def causes(self, start: float, end: float, command_type: str) -> set[str]:
        lo, hi = start - SLACK, end + SLACK
        found = set()
        if command_type in ADAPTER_TYPES and any(m in FAILING_MOODS and s < hi and e > lo for s, e, m in self.moods):
            found.add("adapter")
        if any(lo <= t <= hi for t in self.kills):
            found.add("kill")
        if any(s < hi and e > lo for s, e in self.disk):
            found.add("disk")
        return found


def command_misses(commands: list[dict[str, Any]], finishes: dict[int, list[Any]], out_of_bounds: set[int],
                   timeline: Timeline, now: float) -> list[str]:
    misses = []
    for cmd in commands:
        cid, kind, status = cmd["id"], cmd["command_type"], cmd["status"]
        name = f"command {cid} ({kind})"
        if status not in ("succeeded", "failed"):
            misses.append(f"{name} is still '{status}' at the plane after the calm tail.")
            continue
        seen = finishes.get(cid, [])
        changed = [f for f in seen if f.changed]
        if len(changed) != 1:
            misses.append(f"{name}: {len(changed)} finish requests changed its state at the plane, not exactly one.")
        for f in seen:
            if f.http == 200 and f.status != status:
                misses.append(f"{name}: a duplicate finish carried '{f.status}', but the accepted one '{status}'.")
        misses.extend(_status_misses(cmd, name, cid in out_of_bounds, timeline, now))
    return misses


def _status_misses(cmd: dict[str, Any], name: str, out_of_bounds: bool, timeline: Timeline, now: float) -> list[str]:
    status, error = cmd["status"], cmd.get("error_message") or ""
    start = cmd.get("dispatched_at") or cmd["issued_at"]
    causes = timeline.causes(start, cmd.get("finished_at") or now, cmd["command_type"])
    if out_of_bounds:
        # It must fail: saying why is the bound it broke, or a cause that kept it from running
        # at all (a full disk refuses it unrun; a kill finishes it "interrupted").
        key = next(iter(cmd["payload"]["values"]))
        if status != "failed":
            return [f"{name} set {key} outside the manifest's bounds, yet it {status}."]
        if key not in error and not any(CAUSE_WORDS[c].search(error) for c in causes if c != "adapter"):
            return [f"{name} failed as it must, but its error names neither {key} nor a cause present: {error!r}."]
        return []
    if status == "succeeded":
        return []
    if not causes:
        return [f"{name} failed with {error!r} while nothing was failing (adapter normal, no kill, disk free)."]
    allowed = [CAUSE_WORDS[c] for c in causes]
    if cmd["command_type"] == "log_get" and "adapter" in causes:
        allowed.append(re.compile(r"no such log", re.I))
    if not any(p.search(error) for p in allowed):
        return [f"{name} failed with {error!r}, which names none of the causes present ({', '.join(sorted(causes))})."]
    return []


def order_misses(commands: list[dict[str, Any]]) -> list[str]:
    """Within a lane, commands start in the order the plane issued them."""
    misses = []
    for lane, members in (("controls", CONTROL_TYPES), ("main", None)):
        started = [(c["id"], c["started_at"], c["command_type"]) for c in commands
                   if c.get("started_at") and ((c["command_type"] in members) if members
                                               else c["command_type"] not in CONTROL_TYPES)]
        started.sort()
        for (a, ta, ka), (b, tb, kb) in zip(started, started[1:], strict=False):
            if tb < ta - 0.001:
                misses.append(f"the {lane} lane started command {b} ({kb}) {ta - tb:.1f} s before command {a} ({ka}),"
                              f" which the plane issued first.")
    return misses


def token_misses(tokens: Iterable[str], log_path: Path, state_dir: Path, plane_texts: Iterable[tuple[str, str]]
                 ) -> list[str]:
    """No token in a log line, a state file but session.json, or anything the plane stored."""
    tokens = [t for t in tokens if t]
    misses = []
    if log_path.exists():
        for number, line in enumerate(log_path.read_text(errors="replace").splitlines(), 1):
            if any(t in line for t in tokens):
                misses.append(f"a token appears in the runtime's log, line {number}.")
    for path in sorted(p for p in state_dir.rglob("*") if p.is_file()):
        if path.name == "session.json" and path.parent == state_dir:
            continue
        text = path.read_bytes().decode(errors="replace") if path.stat().st_size < 16 << 20 else ""
        if any(t in text for t in tokens):
            misses.append(f"a token appears in the state file {path.relative_to(state_dir)}.")
    for where, text in plane_texts:
        if any(t in text for t in tokens):
            misses.append(f"a token appears in {where} at the plane.")
    return misses


def outbox_misses(state_dir: Path) -> list[str]:
    outbox = state_dir / "outbox"
    waiting = sorted(p.name for p in outbox.glob("*.json") if not p.name.startswith("."))
    rejected = sorted(p.name for p in (outbox / "rejected").glob("*")) if (outbox / "rejected").is_dir() else []
    misses = []
    if waiting:
        misses.append(f"the outbox still holds {len(waiting)} item(s) after the calm tail: {', '.join(waiting[:5])}.")
    if rejected:
        misses.append(f"the outbox rejected {len(rejected)} item(s): {', '.join(rejected[:5])}.")
    return misses


def plane_texts(store: Any) -> list[tuple[str, str]]:
    """Everything the plane kept that came from the runtime, as (where, text)."""
    out = []
    for row in store._read("SELECT id, result, error_message FROM commands"):
        out.append((f"command {row['id']}'s result", f"{row['result']} {row['error_message']}"))
    for table in ("reports", "heartbeats", "inventories"):
        for row in store._read(f"SELECT id, body FROM {table}"):
            out.append((f"{table} row {row['id']}", row["body"] or ""))
    for row in store._read("SELECT instance_id, summary, system_info, health FROM runtime_status"):
        out.append(("runtime_status", json.dumps(dict(row))))
    return out
