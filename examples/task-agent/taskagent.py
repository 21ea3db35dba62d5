"""The task agent's own state: files in its data directory, shared by the timer
(agent.py) and the adapter (adapter.py). Nothing here knows about caldera.

data/
  paused            the manual pause (set by `agent.py pause`, the chat channel, or the adapter)
  session           someone works in a session: the file holds their name; no run starts
  run-now           a requested run (kept until a run starts)
  settings.json     the agent's settings (written atomically)
  runs.json         the last runs: id, title, started_at, finished_at, outcome, log
  tick              when the timer last looked (its heartbeat)
  logs/run-YYYYMMDD-HHMMSS.log
"""
from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime, timedelta

VERSION = "1.0.0"
HERE = os.path.dirname(os.path.abspath(__file__))
WEEK = 7 * 24 * 3600
COST_PER_RUN = 0.05  # share of the weekly quota one run uses
LOG_RE = re.compile(r"^run-\d{8}-\d{6}\.log$")
# The agent's own hard bounds: whatever any manifest says, these stand.
BOUNDS = {"max_7d": {"min": 0.1, "max": 0.95}, "interval_minutes": {"min": 5, "max": 1440}}
DEFAULTS = {"max_7d": 0.75, "interval_minutes": 60, "note": None}
NOTE_MAX = 200


def data_dir() -> str:
    """<bundle>/data when writable, else a directory under $HOME (a root-owned bundle)."""
    own = os.path.join(HERE, "data")
    if os.access(HERE, os.W_OK) or os.path.isdir(own) and os.access(own, os.W_OK):
        path = own
    else:
        name = os.environ.get("CALDERA_AGENT") or "task-agent"
        path = os.path.join(os.path.expanduser("~"), ".local", "state", "task-agent", name)
    os.makedirs(os.path.join(path, "logs"), exist_ok=True)
    return path


def path(name: str) -> str:
    return os.path.join(data_dir(), name)


def now_iso(ts: float | None = None) -> str:
    moment = datetime.fromtimestamp(ts if ts is not None else time.time(), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def read_json(name: str, default):
    try:
        with open(path(name), encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default


def write_json(name: str, value) -> None:
    """Atomic: a reader sees the old file or the new one."""
    target = path(name)
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)


def touch(name: str, text: str = "") -> None:
    with open(path(name) + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(path(name) + ".tmp", path(name))


def remove(name: str) -> bool:
    try:
        os.remove(path(name))
        return True
    except FileNotFoundError:
        return False


def exists(name: str) -> bool:
    return os.path.exists(path(name))


def settings() -> dict:
    values = dict(DEFAULTS)
    values.update(read_json("settings.json", {}))
    return values


def tasks() -> list:
    with open(os.path.join(HERE, "tasks.json"), encoding="utf-8") as fh:
        return json.load(fh)["tasks"]


def runs() -> list:
    return read_json("runs.json", [])


def week_used(now: float | None = None) -> tuple[float, float | None]:
    """(share of the weekly quota used, when the oldest counted run leaves the window)."""
    now = now if now is not None else time.time()
    recent = [r["started_ts"] for r in runs() if now - r["started_ts"] < WEEK]
    resets = min(recent) + WEEK if recent else None
    return min(1.0, len(recent) * COST_PER_RUN), resets


def held(now: float | None = None) -> list:
    """Every lock that stops a run now, in the words a person reads."""
    reasons = []
    if exists("paused"):
        reasons.append("paused")
    if exists("session"):
        with open(path("session"), encoding="utf-8") as fh:
            who = fh.read().strip() or "Someone"
        reasons.append(f"{who} is working in a session")
    used, _ = week_used(now)
    if used >= settings()["max_7d"]:
        reasons.append("weekly limit reached")
    return reasons


def next_run_at(now: float | None = None) -> float:
    now = now if now is not None else time.time()
    done = runs()
    last = done[-1]["started_ts"] if done else None
    interval = settings()["interval_minutes"] * 60
    return now if last is None else max(now, last + interval)


def log_name(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("run-%Y%m%d-%H%M%S.log")


def run_once(reason: str) -> dict:
    """One run: each task in turn, a log of it, a record in runs.json."""
    started = time.time()
    name = log_name(started)
    lines = [f"{now_iso(started)} run started ({reason})"]
    for task in tasks():
        lines.append(f"{now_iso()} task {task!r}: done")
    lines.append(f"{now_iso()} run finished: {len(tasks())} tasks")
    with open(os.path.join(path("logs"), name), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    record = {"id": name[4:-4], "title": f"{len(tasks())} tasks ({reason})", "started_ts": started,
              "started_at": now_iso(started), "finished_at": now_iso(), "outcome": "ok", "log": name}
    write_json("runs.json", (runs() + [record])[-100:])
    return record


def logs() -> list:
    names = [n for n in os.listdir(path("logs")) if LOG_RE.match(n)]
    return sorted(names, reverse=True)


def since(name: str) -> str | None:
    try:
        return now_iso(os.path.getmtime(path(name)))
    except FileNotFoundError:
        return None


def add_seconds_iso(ts: float, seconds: float) -> str:
    return now_iso((datetime.fromtimestamp(ts, UTC) + timedelta(seconds=seconds)).timestamp())
