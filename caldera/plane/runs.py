"""Code-agent runs as the plane keeps them: one `runs` row per (instance, run_id) and its
events in `run_events`, one row per (instance, run_id, seq) (docs/plane.md, "Runs").

A run's row is made when an `agent_run` is queued (or by its first event, for a run queued
by another plane), follows its events (`running`, then the terminal_status's status and
failure kind) and is completed by the command's finish (`events_total`, or the failure of a
run that never sent a terminal event). An event sent twice (a batch the runtime posts again
after a lost answer) is stored once. Bounded: a run keeps at most EVENTS_PER_RUN events;
runs that ended are pruned oldest first past RUNS_KEPT per instance or PRUNE_AGE_SECONDS,
with their events; a queued or running run never. These functions run inside the store's
transaction.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

RUNS_KEPT = 1000  # ended runs kept per instance (the newest)
EVENTS_PER_RUN = 200_000  # events stored per run; more are counted in `refused`, not stored
PROMPT_KEPT = 64 * 1024  # characters of the prompt the run's row keeps
LIVE = ("queued", "running")
ENDED = ("completed", "failed", "cancelled", "blocked")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  instance_id INTEGER NOT NULL, run_id TEXT NOT NULL, command_id INTEGER, backend TEXT, prompt TEXT,
  workspace TEXT, created_at REAL NOT NULL, started_at REAL, ended_at REAL, status TEXT NOT NULL,
  failure_kind TEXT, message TEXT, events INTEGER NOT NULL DEFAULT 0, last_seq INTEGER NOT NULL DEFAULT 0,
  events_total INTEGER, refused INTEGER NOT NULL DEFAULT 0, seen_at REAL, PRIMARY KEY (instance_id, run_id));
CREATE INDEX IF NOT EXISTS runs_recent ON runs (instance_id, created_at);
CREATE INDEX IF NOT EXISTS runs_by_id ON runs (run_id, created_at);
"""
COLUMNS = ("instance_id", "run_id", "command_id", "backend", "prompt", "workspace", "created_at", "started_at",
           "ended_at", "status", "failure_kind", "message", "events", "last_seq", "events_total", "refused", "seen_at")


def migrate(db: sqlite3.Connection) -> None:
    """The runs table, and one event per (instance, run, seq): a database of an older plane may
    hold the same event twice (its runtime posted a batch again), the first is kept."""
    db.executescript(SCHEMA)
    if db.execute("SELECT 1 FROM sqlite_master WHERE type='index' AND name='run_events_seq'").fetchone():
        return
    db.execute("DELETE FROM run_events WHERE id NOT IN (SELECT MIN(id) FROM run_events GROUP BY instance_id, "
               "run_id, seq)")
    db.execute("CREATE UNIQUE INDEX run_events_seq ON run_events (instance_id, run_id, seq)")


def queued(db: sqlite3.Connection, instance_id: int, command_id: int, payload: dict[str, Any], now: float) -> None:
    """The row of a run an `agent_run` command was queued for (a run id already known is left)."""
    run_id = payload.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return
    prompt = payload.get("prompt")
    db.execute("INSERT OR IGNORE INTO runs (instance_id, run_id, command_id, backend, prompt, workspace, created_at,"
               " status) VALUES (?,?,?,?,?,?,?,'queued')",
               (instance_id, run_id, command_id, _text(payload.get("backend_profile")) or "codex",
                prompt[:PROMPT_KEPT] if isinstance(prompt, str) else None, _text(payload.get("workspace")), now))


def exists(db: sqlite3.Connection, instance_id: int, run_id: str) -> bool:
    row = db.execute("SELECT 1 FROM runs WHERE instance_id=? AND run_id=?", (instance_id, run_id)).fetchone()
    return row is not None


def add_events(db: sqlite3.Connection, instance_id: int, run_id: str, events: list[dict[str, Any]],
               now: float) -> int:
    """Store the events not stored yet; returns how many were new. The run's row follows them."""
    db.execute("INSERT OR IGNORE INTO runs (instance_id, run_id, created_at, status) VALUES (?,?,?,'running')",
               (instance_id, run_id, now))
    row = db.execute("SELECT events, status FROM runs WHERE instance_id=? AND run_id=?",
                     (instance_id, run_id)).fetchone()
    room = max(0, EVENTS_PER_RUN - row["events"])
    new, refused, last, terminal = 0, 0, 0, None
    for event in events:
        seq = event.get("seq")
        if new >= room:
            refused += 1
            continue
        cur = db.execute("INSERT OR IGNORE INTO run_events (run_id, instance_id, seq, received_at, event)"
                         " VALUES (?,?,?,?,?)",
                         (run_id, instance_id, seq, now, json.dumps(event, separators=(",", ":"), sort_keys=True)))
        if cur.rowcount:
            new += 1
            last = max(last, seq if isinstance(seq, int) else 0)
            if event.get("type") == "terminal_status" and isinstance(event.get("data"), dict):
                terminal = event["data"]
    db.execute("UPDATE runs SET events=events+?, refused=refused+?, last_seq=MAX(last_seq, ?), seen_at=?,"
               " started_at=COALESCE(started_at, ?), status=CASE WHEN status='queued' THEN 'running' ELSE status END"
               " WHERE instance_id=? AND run_id=?", (new, refused, last, now, now, instance_id, run_id))
    if terminal is not None:
        status = terminal.get("status") if terminal.get("status") in ENDED else "failed"
        db.execute("UPDATE runs SET status=?, failure_kind=?, message=?, ended_at=COALESCE(ended_at, ?)"
                   " WHERE instance_id=? AND run_id=?",
                   (status, _text(terminal.get("failure_kind")), _text(terminal.get("message")), now,
                    instance_id, run_id))
    return new


def started(db: sqlite3.Connection, instance_id: int, payload: Any, now: float) -> None:
    run_id = payload.get("run_id") if isinstance(payload, dict) else None
    db.execute("UPDATE runs SET status='running', started_at=COALESCE(started_at, ?)"
               " WHERE instance_id=? AND run_id=? AND status='queued'", (now, instance_id, run_id))


def finished(db: sqlite3.Connection, instance_id: int, payload: Any, result: Any, error_message: str | None,
             now: float) -> None:
    """The command's finish: `events_total`, and the end of a run whose terminal event never came
    (refused by the runtime, interrupted by a restart): its result's status, else failed."""
    run_id = payload.get("run_id") if isinstance(payload, dict) else None
    result = result if isinstance(result, dict) else {}
    total = result.get("events_total")
    total = total if isinstance(total, int) and not isinstance(total, bool) else None
    db.execute("UPDATE runs SET events_total=COALESCE(?, events_total), ended_at=COALESCE(ended_at, ?)"
               " WHERE instance_id=? AND run_id=?", (total, now, instance_id, run_id))
    status = result.get("status") if result.get("status") in ENDED else "failed"
    db.execute("UPDATE runs SET status=?, failure_kind=COALESCE(failure_kind, ?), message=COALESCE(message, ?)"
               " WHERE instance_id=? AND run_id=? AND status IN ('queued', 'running')",
               (status, _text(result.get("failure_kind")), _text(result.get("message")) or error_message,
                instance_id, run_id))


def prune(db: sqlite3.Connection, cutoff: float, kept: int = RUNS_KEPT) -> dict[str, int]:
    """Ended runs past the newest `kept` of their instance or ended before `cutoff`, with their events;
    a run no command of this plane stands for (its first event made it) that sent nothing since
    `cutoff` and never ended: it is not running; events of no run (an older plane's) received
    before `cutoff`."""
    ended = ",".join("?" * len(ENDED))
    gone = db.execute(
        f"SELECT instance_id, run_id FROM runs WHERE status IN ({ended}) AND (ended_at < ? OR rowid IN ("
        f"SELECT rowid FROM (SELECT rowid, ROW_NUMBER() OVER (PARTITION BY instance_id ORDER BY created_at DESC)"
        f" AS n FROM runs WHERE status IN ({ended})) WHERE n > ?))"
        f" UNION SELECT instance_id, run_id FROM runs WHERE command_id IS NULL AND status NOT IN ({ended})"
        f" AND COALESCE(seen_at, created_at) < ?", (*ENDED, cutoff, *ENDED, kept, *ENDED, cutoff)).fetchall()
    events = 0
    for row in gone:
        events += db.execute("DELETE FROM run_events WHERE instance_id=? AND run_id=?",
                             (row["instance_id"], row["run_id"])).rowcount
        db.execute("DELETE FROM runs WHERE instance_id=? AND run_id=?", (row["instance_id"], row["run_id"]))
    events += db.execute("DELETE FROM run_events WHERE received_at < ? AND NOT EXISTS (SELECT 1 FROM runs r"
                         " WHERE r.instance_id=run_events.instance_id AND r.run_id=run_events.run_id)",
                         (cutoff,)).rowcount
    return {"runs": len(gone), "run_events": events}


# ---- reads ------------------------------------------------------------------------------------

def listing(db: sqlite3.Connection, instance_id: int, limit: int) -> list[dict[str, Any]]:
    """The instance's newest `limit` runs, newest first (without their prompts)."""
    cols = ", ".join(c for c in COLUMNS if c != "prompt")
    rows = db.execute(f"SELECT {cols} FROM runs WHERE instance_id=? ORDER BY created_at DESC, rowid DESC LIMIT ?",
                      (instance_id, limit)).fetchall()
    return [dict(r) for r in rows]


def one(db: sqlite3.Connection, run_id: str, instance_id: int | None = None) -> dict[str, Any] | None:
    """A run's row, with the command's status. Without an instance: the row this plane queued
    (with a command), else the only instance's; a ValueError with a sentence when several
    instances have that run id (any agent may post events under any run id: none may win)."""
    where, args = ("r.run_id=? AND r.instance_id=?", (run_id, instance_id)) if instance_id is not None \
        else ("r.run_id=?", (run_id,))
    rows = db.execute(f"SELECT r.*, c.status AS command_status, c.error_message FROM runs r LEFT JOIN commands c"
                      f" ON c.id=r.command_id WHERE {where} ORDER BY r.created_at DESC LIMIT 20", args).fetchall()
    queued = [r for r in rows if r["command_id"] is not None]
    rows = queued or rows
    instances = sorted({r["instance_id"] for r in rows})
    if len(instances) > 1:
        raise ValueError(f"instances {', '.join(map(str, instances))} all have a run {run_id}: "
                         "say which with --instance N")
    return dict(rows[0]) if rows else None


def events(db: sqlite3.Connection, instance_id: int, run_id: str, after: int, limit: int) -> list[dict[str, Any]]:
    """Events with seq > `after`, in seq order, at most `limit`."""
    return [json.loads(text) for _, text in stored(db, instance_id, run_id, after, limit)]


def stored(db: sqlite3.Connection, instance_id: int, run_id: str, after: int, limit: int) -> list[tuple[int, str]]:
    """(seq, the event's JSON text as stored) with seq > `after`, in seq order, at most `limit`."""
    cur = db.execute("SELECT seq, event FROM run_events WHERE instance_id=? AND run_id=? AND seq>? ORDER BY seq"
                     " LIMIT ?", (instance_id, run_id, after, limit))
    cur.row_factory = None  # plain tuples: a replay of 100,000 events reads them all
    return cur.fetchall()


def last_events(db: sqlite3.Connection, instance_id: int, run_id: str, limit: int) -> list[dict[str, Any]]:
    """The run's last `limit` events, in seq order."""
    rows = db.execute("SELECT event FROM run_events WHERE instance_id=? AND run_id=? ORDER BY seq DESC LIMIT ?",
                      (instance_id, run_id, limit)).fetchall()
    return [json.loads(r["event"]) for r in reversed(rows)]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
