"""The page's history: per-instance time buckets (default one minute), kept for days.

A state report adds its CPU/memory/disk fractions, its network rate (bytes/s
since the instance's previous report) and its state level to the bucket of
the time the plane received it; every contact (register, heartbeat, report)
widens the bucket's first/last contact times, from which the page derives
presence over time with the same thresholds as `store.presence`. Figures are
sums and counts, so a bucket's value is the mean of its reports and the page
can merge buckets further when it draws a long window.

Bounded: one row per instance and bucket, rows older than the kept window are
deleted (`prune`). These functions run inside the store's transaction; they
touch the `history` table only (the reports/heartbeats tables keep their own
count-based bounds).
"""
from __future__ import annotations

import sqlite3
from typing import Any

from caldera.plane.figures import figures, state_level

BUCKET_SECONDS = 60
DAYS_KEPT = 7
RATE_GAP_SECONDS = 600  # a longer silence gives no rate: it would average over the outage
LEVEL_RANK = {"ok": 0, "off": 1, "warn": 2, "bad": 3}
FIGURES = ("cpu", "memory", "disk")

SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
  instance_id INTEGER NOT NULL, bucket INTEGER NOT NULL,
  first_at REAL NOT NULL, last_at REAL NOT NULL, contacts INTEGER NOT NULL DEFAULT 0,
  reports INTEGER NOT NULL DEFAULT 0, report_at_sum REAL NOT NULL DEFAULT 0,
  cpu_sum REAL NOT NULL DEFAULT 0, cpu_n INTEGER NOT NULL DEFAULT 0,
  memory_sum REAL NOT NULL DEFAULT 0, memory_n INTEGER NOT NULL DEFAULT 0,
  disk_sum REAL NOT NULL DEFAULT 0, disk_n INTEGER NOT NULL DEFAULT 0,
  rx_rate_sum REAL NOT NULL DEFAULT 0, tx_rate_sum REAL NOT NULL DEFAULT 0,
  rate_n INTEGER NOT NULL DEFAULT 0,
  rx_total REAL, tx_total REAL, net_at REAL, level TEXT,
  PRIMARY KEY (instance_id, bucket));
CREATE INDEX IF NOT EXISTS history_bucket ON history (bucket);
"""


def bucket_of(now: float, bucket_seconds: int) -> int:
    return int(now // bucket_seconds) * bucket_seconds


def record_contact(db: sqlite3.Connection, instance_id: int, now: float, bucket_seconds: int) -> int:
    """The instance was heard from at `now`; returns the bucket."""
    bucket = bucket_of(now, bucket_seconds)
    db.execute("INSERT INTO history (instance_id, bucket, first_at, last_at, contacts) VALUES (?,?,?,?,1)"
               " ON CONFLICT (instance_id, bucket) DO UPDATE SET first_at=MIN(first_at, excluded.first_at),"
               " last_at=MAX(last_at, excluded.last_at), contacts=contacts+1",
               (instance_id, bucket, now, now))
    return bucket


def record_report(db: sqlite3.Connection, instance_id: int, now: float, body: dict[str, Any],
                  bucket_seconds: int) -> None:
    """Add one state report's figures, network rate and state level to its bucket."""
    figs = figures(body.get("system_info"))
    rate = _rate(db, instance_id, now, figs.get("network"))
    bucket = record_contact(db, instance_id, now, bucket_seconds)
    sets = ["reports=reports+1", "report_at_sum=report_at_sum+?"]
    args: list[object] = [now]
    for name in FIGURES:
        if name in figs:
            sets.append(f"{name}_sum={name}_sum+?, {name}_n={name}_n+1")
            args.append(figs[name][0])
    net = figs.get("network")
    if net:
        sets.append("rx_total=?, tx_total=?, net_at=?")
        args.extend([net["rx_bytes"], net["tx_bytes"], now])
    if rate is not None:
        sets.append("rx_rate_sum=rx_rate_sum+?, tx_rate_sum=tx_rate_sum+?, rate_n=rate_n+1")
        args.extend(rate)
    level = state_level(body)
    if level is not None:
        old = db.execute("SELECT level FROM history WHERE instance_id=? AND bucket=?",
                         (instance_id, bucket)).fetchone()["level"]
        sets.append("level=?")
        args.append(level if LEVEL_RANK.get(level, 0) >= LEVEL_RANK.get(old, -1) else old)
    db.execute(f"UPDATE history SET {', '.join(sets)} WHERE instance_id=? AND bucket=?",
               (*args, instance_id, bucket))


def _rate(db: sqlite3.Connection, instance_id: int, now: float,
          net: dict[str, Any] | None) -> tuple[float, float] | None:
    """Bytes/s in and out since the instance's previous report; None after a gap or a counter reset."""
    if not net:
        return None
    prev = db.execute("SELECT rx_total, tx_total, net_at FROM history WHERE instance_id=? AND net_at IS NOT NULL"
                      " ORDER BY bucket DESC LIMIT 1", (instance_id,)).fetchone()
    if prev is None:
        return None
    elapsed = now - prev["net_at"]
    rx, tx = net["rx_bytes"] - prev["rx_total"], net["tx_bytes"] - prev["tx_total"]
    if not 0 < elapsed <= RATE_GAP_SECONDS or rx < 0 or tx < 0:
        return None
    return rx / elapsed, tx / elapsed


def prune(db: sqlite3.Connection, before: float) -> int:
    """Delete the buckets older than `before`; returns how many went."""
    return db.execute("DELETE FROM history WHERE bucket < ?", (int(before),)).rowcount


def first_bucket(db: sqlite3.Connection, instance_id: int, since: float) -> int | None:
    row = db.execute("SELECT MIN(bucket) AS b FROM history WHERE instance_id=? AND bucket >= ?",
                     (instance_id, int(since))).fetchone()
    return row["b"]


def read(db: sqlite3.Connection, instance_id: int, since: float, step: int) -> list[dict[str, Any]]:
    """Points from `since` on (oldest first), each `step` seconds wide, after the last bucket before it.

    A step wider than a bucket merges buckets in SQL: sums and counts add up (means stay exact),
    contacts widen, the level is the worst, and `gap` is the longest silence between buckets
    inside the merged point (the page marks such a point stale or offline).
    """
    before = db.execute("SELECT * FROM history WHERE instance_id=? AND bucket < ? ORDER BY bucket DESC LIMIT 1",
                        (instance_id, int(since))).fetchall()
    rows = db.execute(_MERGED, {"instance": instance_id, "since": int(since), "step": int(step)}).fetchall()
    return [_point(r) for r in [*before, *rows]]


_RANK_SQL = "CASE level WHEN 'bad' THEN 3 WHEN 'warn' THEN 2 WHEN 'off' THEN 1 WHEN 'ok' THEN 0 END"
_SUMMED = ("contacts", "reports", "report_at_sum", "cpu_sum", "cpu_n", "memory_sum", "memory_n", "disk_sum",
           "disk_n", "rx_rate_sum", "tx_rate_sum", "rate_n")
_MERGED = f"""
SELECT (bucket / :step) * :step AS bucket, MIN(first_at) AS first_at, MAX(last_at) AS last_at,
  {", ".join(f"SUM({c}) AS {c}" for c in _SUMMED)},
  CASE MAX(rank) WHEN 3 THEN 'bad' WHEN 2 THEN 'warn' WHEN 1 THEN 'off' WHEN 0 THEN 'ok' END AS level,
  MAX(gap) AS gap
FROM (SELECT *, {_RANK_SQL} AS rank,
        CASE WHEN LAG(bucket) OVER w / :step = bucket / :step THEN first_at - LAG(last_at) OVER w END AS gap
      FROM history WHERE instance_id = :instance AND bucket >= :since WINDOW w AS (ORDER BY bucket))
GROUP BY bucket / :step ORDER BY 1
"""


def _point(row: sqlite3.Row) -> dict[str, Any]:
    def mean(total: str, count: str) -> float | None:
        return row[total] / row[count] if row[count] else None

    point = {"bucket": row["bucket"], "first_at": row["first_at"], "last_at": row["last_at"],
             "contacts": row["contacts"], "reports": row["reports"], "level": row["level"],
             "gap": row["gap"] if "gap" in row.keys() else None,
             "at": mean("report_at_sum", "reports"),
             "rx_rate": mean("rx_rate_sum", "rate_n"), "tx_rate": mean("tx_rate_sum", "rate_n")}
    for name in FIGURES:
        point[name] = mean(f"{name}_sum", f"{name}_n")
    return point
