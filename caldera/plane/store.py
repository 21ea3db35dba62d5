"""The plane's state in sqlite3 (WAL): instances, agent sessions, reports, commands, skills.

One connection, one lock: the HTTP threads and the operator calls of one
process share it, and a write is a short `BEGIN IMMEDIATE` transaction. The
operator CLI opens the same file from another process; WAL lets it read while
the server writes, and `busy_timeout` makes writers wait for each other.

ClawManager keeps its rows in MySQL; the column limits that make its server
answer 500 (strict mode) are checked here and raised as `ColumnTooLong`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, overload

from caldera.plane import history, runs
from caldera.plane.governance import LLM_FIELDS, llm_config_status, merge_llm

ONLINE_SECONDS, STALE_SECONDS = 45, 120
REPORTS_KEPT, HEARTBEATS_KEPT = 100, 200
# Growth that does not follow the fleet's history (issue 16; docs/plane.md, "What the plane keeps"):
# the latest inventory per instance and 19 before it; finished commands, reports, heartbeats and
# run events older than a week, and finished commands past the newest 500 per instance.
INVENTORIES_KEPT = 20
PRUNE_AGE_SECONDS = 7 * 86400
COMMANDS_KEPT = 500
REVISION_MAX_BYTES = 512 * 1024  # the runtime reads a revision answer of at most 1 MiB
PRUNE_EVERY_SECONDS = 300
DEFAULT_TIMEOUT, COLLECT_PACKAGE_TIMEOUT = 300, 600
TERMINAL = ("succeeded", "failed")
SKIP_START = ("running",) + TERMINAL

# MySQL VARCHAR sizes of ClawManager's tables (clawmanager-notes section 1.7).
COLUMN_LIMITS = {
    "agent_id": 255, "agent_version": 50, "openclaw_status": 30, "openclaw_version": 100,
    "command_type": 50, "name": 255, "skill_key": 120, "source_type": 40, "install_path": 1024,
    "content_md5": 128,
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
  id INTEGER PRIMARY KEY, bootstrap_token TEXT NOT NULL UNIQUE,
  desired_power_state TEXT NOT NULL DEFAULT 'running', desired_config_revision_id INTEGER);
CREATE TABLE IF NOT EXISTS agents (
  instance_id INTEGER PRIMARY KEY, agent_id TEXT NOT NULL, agent_version TEXT,
  protocol_version TEXT, capabilities TEXT, host_info TEXT, session_token TEXT UNIQUE,
  session_expires_at REAL, registered_at REAL, last_heartbeat_at REAL, last_reported_at REAL,
  last_seen_ip TEXT, registrations INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS runtime_status (
  instance_id INTEGER PRIMARY KEY, openclaw_status TEXT, openclaw_pid INTEGER,
  openclaw_version TEXT, current_config_revision_id INTEGER, summary TEXT, system_info TEXT,
  health TEXT, last_reported_at REAL);
CREATE TABLE IF NOT EXISTS heartbeats (
  id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id INTEGER NOT NULL, received_at REAL, body TEXT);
CREATE INDEX IF NOT EXISTS heartbeats_instance ON heartbeats (instance_id, id);
CREATE TABLE IF NOT EXISTS reports (
  id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id INTEGER NOT NULL, received_at REAL, body TEXT);
CREATE INDEX IF NOT EXISTS reports_instance ON reports (instance_id, id);
CREATE TABLE IF NOT EXISTS commands (
  id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id INTEGER NOT NULL, command_type TEXT NOT NULL,
  payload TEXT NOT NULL, status TEXT NOT NULL, idempotency_key TEXT NOT NULL,
  timeout_seconds INTEGER NOT NULL, issued_at REAL NOT NULL, agent_id TEXT, dispatched_at REAL,
  started_at REAL, finished_at REAL, result TEXT, error_message TEXT,
  start_count INTEGER NOT NULL DEFAULT 0, finish_count INTEGER NOT NULL DEFAULT 0,
  UNIQUE (instance_id, idempotency_key));
CREATE INDEX IF NOT EXISTS commands_pending ON commands (instance_id, status, issued_at, id);
CREATE TABLE IF NOT EXISTS inventories (
  id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id INTEGER NOT NULL, received_at REAL, body TEXT);
CREATE INDEX IF NOT EXISTS inventories_instance ON inventories (instance_id, id);
CREATE INDEX IF NOT EXISTS commands_finished ON commands (instance_id, finished_at);
CREATE TABLE IF NOT EXISTS instance_skills (
  id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id INTEGER NOT NULL, skill_key TEXT NOT NULL,
  name TEXT, content_md5 TEXT, install_path TEXT, source_type TEXT, skill_version TEXT,
  status TEXT NOT NULL, updated_at REAL, UNIQUE (instance_id, skill_key));
CREATE TABLE IF NOT EXISTS blobs (content_md5 TEXT PRIMARY KEY, version_id INTEGER);
CREATE TABLE IF NOT EXISTS skill_versions (
  id INTEGER PRIMARY KEY, filename TEXT NOT NULL, data BLOB NOT NULL, created_at REAL);
CREATE TABLE IF NOT EXISTS uploads (
  id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id INTEGER NOT NULL, received_at REAL,
  filename TEXT, fields TEXT, top_dir TEXT, content_md5 TEXT, size INTEGER, version_id INTEGER);
CREATE TABLE IF NOT EXISTS config_revisions (
  id INTEGER PRIMARY KEY AUTOINCREMENT, instance_id INTEGER NOT NULL, revision_no INTEGER NOT NULL,
  content TEXT NOT NULL, checksum TEXT NOT NULL, published_at REAL);
CREATE TABLE IF NOT EXISTS run_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, instance_id INTEGER NOT NULL,
  seq INTEGER, received_at REAL, event TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS run_events_run ON run_events (run_id, id);
"""


class StoreError(Exception):
    """Base of the errors the API maps to ClawManager's answers."""


class ColumnTooLong(StoreError):
    """A value longer than ClawManager's column: its server answers 500."""

    def __init__(self, column: str) -> None:
        super().__init__(f"Error 1406 (22001): Data too long for column '{column}' at row 1")
        self.column = column


class NotFound(StoreError):
    pass


def _check_len(column: str, value: object) -> None:
    if isinstance(value, str) and len(value) > COLUMN_LIMITS[column]:
        raise ColumnTooLong(column)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def presence(last_seen: float | None, now: float) -> str:
    """ClawManager's deriveAgentStatus: online <= 45 s, stale <= 120 s, offline beyond."""
    if last_seen is None:
        return "offline"
    age = now - last_seen
    if age <= ONLINE_SECONDS:
        return "online"
    return "stale" if age <= STALE_SECONDS else "offline"


def skill_key(identifier: str, content_md5: str) -> str:
    """ClawManager's sanitised key: lowercase [a-z0-9], -_ . and space as '-', collapsed."""
    key = re.sub(r"[-_ .]", "-", (identifier or "").lower())
    key = re.sub(r"[^a-z0-9-]", "", key)
    key = re.sub(r"-+", "-", key).strip("-")
    return key or content_md5[:16]


def version_number(version_id: object) -> int:
    """`ver_<n>` or `<n>`, as the download route scans it; anything else is ValueError."""
    text = str(version_id).strip()
    text = text[4:] if text.startswith("ver_") else text
    if not text.isdigit():
        raise ValueError(f"invalid skill version {version_id!r}: expected ver_<n> or <n>")
    return int(text)


class Store:
    """The plane's database. `clock` (Unix seconds) is replaceable for presence/expiry tests."""

    def __init__(self, path: str | os.PathLike[str], clock: Callable[[], float] = time.time,
                 session_ttl: float = 86400, history_bucket_seconds: int = history.BUCKET_SECONDS,
                 history_days: float = history.DAYS_KEPT) -> None:
        if history_bucket_seconds < 1 or history_days <= 0:
            raise ValueError("history buckets must be >= 1 s and the kept days > 0")
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.session_ttl = session_ttl
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=10)
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.executescript(_SCHEMA)
            self._db.executescript(history.SCHEMA)
            with self._lock:
                runs.migrate(self._db)
        except BaseException:
            self._db.close()  # not a database (or a locked one): nothing left open behind the error
            raise
        self.history_bucket_seconds = int(history_bucket_seconds)
        self.history_seconds = float(history_days) * 86400
        self._history_pruned_at: float | None = None
        self._pruned_at = 0.0
        self.commands_kept = COMMANDS_KEPT  # finished commands kept per instance (the newest)
        self.runs_kept = runs.RUNS_KEPT  # ended code-agent runs kept per instance (the newest)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, args: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- instances and sessions -------------------------------------------------

    def add_instance(self, instance_id: int, bootstrap_token: str) -> None:
        """An instance and its bootstrap token (reusable for the instance's life, as ClawManager)."""
        if not isinstance(instance_id, int) or instance_id < 1:
            raise ValueError(f"instance id must be an integer >= 1, not {instance_id!r}")
        if not bootstrap_token or not bootstrap_token.strip():
            raise ValueError("a bootstrap token must not be empty")
        with self._tx() as db:
            row = db.execute("SELECT id FROM instances WHERE bootstrap_token=?", (bootstrap_token,)).fetchone()
            if row and row["id"] != instance_id:
                raise ValueError(f"bootstrap token already belongs to instance {row['id']}")
            db.execute("INSERT INTO instances (id, bootstrap_token) VALUES (?, ?) "
                       "ON CONFLICT (id) DO UPDATE SET bootstrap_token=excluded.bootstrap_token",
                       (instance_id, bootstrap_token))

    def instances(self) -> list[int]:
        return [r["id"] for r in self._read("SELECT id FROM instances ORDER BY id")]

    def instance_for_token(self, bootstrap_token: str) -> int | None:
        rows = self._read("SELECT id FROM instances WHERE bootstrap_token=?", (bootstrap_token,))
        return rows[0]["id"] if rows else None

    def register(self, instance_id: int, body: dict[str, Any], ip: str | None) -> dict[str, Any]:
        """One agent row per instance: a new session token replaces (and invalidates) the old."""
        agent_id = body["agent_id"].strip()
        _check_len("agent_id", agent_id)
        _check_len("agent_version", body["agent_version"])
        now = self.clock()
        token = "agt_sess_" + secrets.token_hex(24)
        with self._tx() as db:
            db.execute(
                "INSERT INTO agents (instance_id, agent_id, agent_version, protocol_version, capabilities,"
                " host_info, session_token, session_expires_at, registered_at, last_heartbeat_at,"
                " last_seen_ip, registrations) VALUES (?,?,?,?,?,?,?,?,?,?,?,1)"
                " ON CONFLICT (instance_id) DO UPDATE SET agent_id=excluded.agent_id,"
                " agent_version=excluded.agent_version, protocol_version=excluded.protocol_version,"
                " capabilities=excluded.capabilities, host_info=excluded.host_info,"
                " session_token=excluded.session_token, session_expires_at=excluded.session_expires_at,"
                " registered_at=excluded.registered_at, last_heartbeat_at=excluded.last_heartbeat_at,"
                " last_seen_ip=excluded.last_seen_ip, registrations=registrations+1",
                (instance_id, agent_id, body["agent_version"], body["protocol_version"].strip(),
                 _dumps(body.get("capabilities")), _dumps(body.get("host_info")), token,
                 now + self.session_ttl, now, now, ip))
            db.execute("INSERT OR IGNORE INTO runtime_status (instance_id) VALUES (?)", (instance_id,))
            history.record_contact(db, instance_id, now, self.history_bucket_seconds)
        return {"session_token": token, "session_expires_at": now + self.session_ttl, "server_time": now}

    def session(self, token: str) -> dict[str, Any] | None:
        """The live session of `token` ({instance_id, agent_id}), or None (unknown or expired)."""
        rows = self._read("SELECT instance_id, agent_id, session_expires_at FROM agents WHERE session_token=?",
                          (token,))
        if not rows or rows[0]["session_expires_at"] < self.clock():
            return None
        return {"instance_id": rows[0]["instance_id"], "agent_id": rows[0]["agent_id"]}

    # ---- heartbeat and state report ----------------------------------------------

    def heartbeat(self, instance_id: int, body: dict[str, Any]) -> dict[str, Any]:
        status = (body.get("openclaw_status") or "").strip()
        _check_len("openclaw_status", body.get("openclaw_status") if status else None)
        summary = body.get("summary")
        now = self.clock()
        with self._tx() as db:
            db.execute("UPDATE agents SET last_heartbeat_at=?, last_reported_at=?, session_expires_at=?"
                       " WHERE instance_id=?", (now, now, now + self.session_ttl, instance_id))
            sets, args = ["current_config_revision_id=?", "last_reported_at=?"], \
                [body.get("current_config_revision_id"), now]
            if status:
                sets.append("openclaw_status=?")
                args.append(body["openclaw_status"])
            if summary is not None:
                sets.append("summary=?")
                args.append(_dumps(summary))
                pid = summary.get("openclaw_pid")
                if isinstance(pid, (int, float)) and not isinstance(pid, bool):
                    sets.append("openclaw_pid=?")
                    args.append(int(pid))
            db.execute(f"UPDATE runtime_status SET {', '.join(sets)} WHERE instance_id=?", (*args, instance_id))
            self._append(db, "heartbeats", instance_id, now, body, HEARTBEATS_KEPT)
            history.record_contact(db, instance_id, now, self.history_bucket_seconds)
            pending = db.execute("SELECT 1 FROM commands WHERE instance_id=? AND status='pending' LIMIT 1",
                                 (instance_id,)).fetchone() is not None
            inst = db.execute("SELECT desired_power_state, desired_config_revision_id FROM instances WHERE id=?",
                              (instance_id,)).fetchone()
        self._prune_now_and_then(now)
        answer = {"server_time": now, "has_pending_command": pending,
                  "desired_power_state": inst["desired_power_state"]}
        if inst["desired_config_revision_id"] is not None:
            answer["desired_config_revision_id"] = inst["desired_config_revision_id"]
        return answer

    @staticmethod
    def _append(db: sqlite3.Connection, table: str, instance_id: int, now: float, body: dict[str, Any],
                keep: int) -> None:
        db.execute(f"INSERT INTO {table} (instance_id, received_at, body) VALUES (?,?,?)",
                   (instance_id, now, _dumps(body)))
        db.execute(f"DELETE FROM {table} WHERE instance_id=? AND id <= "
                   f"(SELECT id FROM {table} WHERE instance_id=? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                   (instance_id, instance_id, keep))

    def state_report(self, instance_id: int, body: dict[str, Any], reported_at: float | None) -> None:
        runtime = body.get("runtime") or {}
        status = (runtime.get("openclaw_status") or "").strip()
        version = (runtime.get("openclaw_version") or "").strip()
        _check_len("openclaw_status", runtime.get("openclaw_status") if status else None)
        _check_len("openclaw_version", runtime.get("openclaw_version") if version else None)
        now = self.clock()
        seen = reported_at if reported_at is not None else now
        with self._tx() as db:
            # ClawManager takes the agent's reported_at as its last heartbeat (skew shows as stale).
            db.execute("UPDATE agents SET last_heartbeat_at=?, last_reported_at=? WHERE instance_id=?",
                       (seen, seen, instance_id))
            sets = ["openclaw_pid=?", "current_config_revision_id=?", "system_info=?", "health=?",
                    "last_reported_at=?"]
            args = [runtime.get("openclaw_pid"), runtime.get("current_config_revision_id"),
                    _dumps(merge_llm(body.get("system_info"), runtime)), _dumps(body.get("health")), seen]
            if status:
                sets.append("openclaw_status=?")
                args.append(runtime["openclaw_status"])
            if version:
                sets.append("openclaw_version=?")
                args.append(runtime["openclaw_version"])
            db.execute(f"UPDATE runtime_status SET {', '.join(sets)} WHERE instance_id=?", (*args, instance_id))
            self._append(db, "reports", instance_id, now, body, REPORTS_KEPT)
            history.record_report(db, instance_id, now, body, self.history_bucket_seconds)
            self._prune_history(db, now)

    # ---- pruning -----------------------------------------------------------------

    def _prune_now_and_then(self, now: float) -> None:
        """prune() at most every PRUNE_EVERY_SECONDS, from the heartbeat path (the plane has
        no housekeeping thread, and heartbeats come from every runtime every 10 s)."""
        if now - self._pruned_at >= PRUNE_EVERY_SECONDS:
            self._pruned_at = now
            self.prune(now)

    def prune(self, now: float | None = None) -> dict[str, Any]:
        """Drop what is old or past its count; how many rows of each table went.

        Pending and running commands are never dropped, nor an instance's newest report,
        heartbeat or inventory, however old."""
        cutoff = (self.clock() if now is None else now) - PRUNE_AGE_SECONDS
        terminal = ",".join("?" * len(TERMINAL))
        gone = {}
        with self._tx() as db:
            gone["commands"] = db.execute(
                f"DELETE FROM commands WHERE status IN ({terminal}) AND (finished_at < ? OR id IN ("
                f"SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY instance_id ORDER BY id DESC) AS n"
                f" FROM commands WHERE status IN ({terminal})) WHERE n > ?))",
                (*TERMINAL, cutoff, *TERMINAL, self.commands_kept)).rowcount
            for table in ("reports", "heartbeats", "inventories"):
                gone[table] = db.execute(
                    f"DELETE FROM {table} WHERE received_at < ? AND id NOT IN "
                    f"(SELECT MAX(id) FROM {table} GROUP BY instance_id)", (cutoff,)).rowcount
            gone.update(runs.prune(db, cutoff, self.runs_kept))
        return gone

    # ---- commands ----------------------------------------------------------------

    def enqueue(self, instance_id: int, command_type: str, payload: dict[str, Any] | None = None,
                timeout_seconds: float | None = None, idempotency_key: str | None = None) -> int:
        """Queue a command (status pending); the same idempotency key returns the existing id."""
        if not isinstance(command_type, str) or not command_type.strip():
            raise ValueError("command type must be a non-empty string")
        if len(command_type) > COLUMN_LIMITS["command_type"]:
            raise ValueError(f"command type is longer than {COLUMN_LIMITS['command_type']} characters")
        payload = {} if payload is None else payload
        if not isinstance(payload, dict):
            raise ValueError("payload must be a JSON object")
        if timeout_seconds is None or timeout_seconds <= 0:
            timeout_seconds = COLLECT_PACKAGE_TIMEOUT if command_type == "collect_skill_package" else DEFAULT_TIMEOUT
        key = idempotency_key or f"{command_type}-{instance_id}-{secrets.token_hex(8)}"
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM instances WHERE id=?", (instance_id,)).fetchone():
                raise ValueError(f"there is no instance {instance_id}")
            return self._enqueue(db, instance_id, command_type, payload, int(timeout_seconds), key)

    def _enqueue(self, db: sqlite3.Connection, instance_id: int, command_type: str, payload: dict[str, Any],
                 timeout_seconds: int, key: str) -> int:
        row = db.execute("SELECT id FROM commands WHERE instance_id=? AND idempotency_key=?",
                         (instance_id, key)).fetchone()
        if row:
            return row["id"]
        cur = db.execute("INSERT INTO commands (instance_id, command_type, payload, status, idempotency_key,"
                         " timeout_seconds, issued_at) VALUES (?,?,?,?,?,?,?)",
                         (instance_id, command_type, _dumps(payload), "pending", key, timeout_seconds,
                          self.clock()))
        if command_type == "agent_run":
            runs.queued(db, instance_id, _row_id(cur), payload, self.clock())
        revision = payload.get("revision_id")
        if command_type == "apply_config_revision" and isinstance(revision, int) and not isinstance(revision, bool):
            db.execute("UPDATE instances SET desired_config_revision_id=? WHERE id=?", (revision, instance_id))
        if command_type in ("start_openclaw", "restart_openclaw", "stop_openclaw"):
            state = "stopped" if command_type == "stop_openclaw" else "running"
            db.execute("UPDATE instances SET desired_power_state=? WHERE id=?", (state, instance_id))
        return _row_id(cur)

    def next_command(self, instance_id: int, agent_id: str) -> dict[str, Any] | None:
        """The oldest pending command, now dispatched: it is never handed out again."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM commands WHERE instance_id=? AND status='pending'"
                             " ORDER BY issued_at, id LIMIT 1", (instance_id,)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE commands SET status='dispatched', agent_id=?, dispatched_at=? WHERE id=?",
                       (agent_id, self.clock(), row["id"]))
        return {"id": row["id"], "command_type": row["command_type"], "payload": _loads(row["payload"]),
                "issued_at": row["issued_at"], "timeout_seconds": row["timeout_seconds"],
                "idempotency_key": row["idempotency_key"]}

    def command(self, instance_id: int, command_id: int) -> dict[str, Any]:
        rows = self._read("SELECT * FROM commands WHERE id=? AND instance_id=?", (command_id, instance_id))
        if not rows:
            raise NotFound("instance command not found")
        return _command_dict(rows[0])

    def start_command(self, instance_id: int, command_id: int, started_at: float | None) -> None:
        """pending/dispatched -> running; a running or finished command is left as it is."""
        with self._tx() as db:
            row = db.execute("SELECT status, command_type, payload FROM commands WHERE id=? AND instance_id=?",
                             (command_id, instance_id)).fetchone()
            if row is None:
                raise NotFound("instance command not found")
            db.execute("UPDATE commands SET start_count=start_count+1 WHERE id=?", (command_id,))
            if row["status"] not in SKIP_START:
                db.execute("UPDATE commands SET status='running', started_at=? WHERE id=?",
                           (started_at if started_at is not None else self.clock(), command_id))
                if row["command_type"] == "agent_run":
                    runs.started(db, instance_id, _loads(row["payload"]), self.clock())

    def finish_command(self, instance_id: int, command_id: int, status: str, result: Any,
                       error_message: str | None, finished_at: float | None) -> None:
        """Any non-terminal state -> succeeded|failed; a second finish changes nothing."""
        with self._tx() as db:
            row = db.execute("SELECT status, command_type, payload FROM commands WHERE id=? AND instance_id=?",
                             (command_id, instance_id)).fetchone()
            if row is None:
                raise NotFound("instance command not found")
            db.execute("UPDATE commands SET finish_count=finish_count+1 WHERE id=?", (command_id,))
            if row["status"] in TERMINAL:
                return
            message = error_message if error_message and error_message.strip() else None
            db.execute("UPDATE commands SET status=?, result=?, error_message=?, finished_at=? WHERE id=?",
                       (status, _dumps(result), message,
                        finished_at if finished_at is not None else self.clock(), command_id))
            if row["command_type"] == "agent_run":
                runs.finished(db, instance_id, _loads(row["payload"]), result, message, self.clock())

    def commands(self, instance_id: int) -> list[dict[str, Any]]:
        rows = self._read("SELECT * FROM commands WHERE instance_id=? ORDER BY id", (instance_id,))
        return [_command_dict(r) for r in rows]

    def recent_commands(self, limit: int = 20, instance_id: int | None = None) -> list[dict[str, Any]]:
        """The newest `limit` commands, newest first (of one instance when given)."""
        if instance_id is not None:
            rows = self._read("SELECT * FROM commands WHERE instance_id=? ORDER BY id DESC LIMIT ?",
                              (instance_id, limit))
            return [_command_dict(r) for r in rows]
        rows = self._read("SELECT * FROM commands ORDER BY id DESC LIMIT ?", (limit,))
        return [_command_dict(r) for r in rows]

    # ---- reads for the page and the operator CLI ------------------------------------

    @overload
    def reports(self, instance_id: int, last: Literal[False] = False) -> list[dict[str, Any]]: ...

    @overload
    def reports(self, instance_id: int, last: Literal[True]) -> dict[str, Any] | None: ...

    @overload
    def reports(self, instance_id: int, last: bool) -> list[dict[str, Any]] | dict[str, Any] | None: ...

    def reports(self, instance_id: int, last: bool = False) -> list[dict[str, Any]] | dict[str, Any] | None:
        """The kept state reports (oldest first) as {received_at, body}; with last=True the newest or None."""
        order = "DESC LIMIT 1" if last else "ASC"
        rows = self._read(f"SELECT received_at, body FROM reports WHERE instance_id=? ORDER BY id {order}",
                          (instance_id,))
        items = [{"received_at": r["received_at"], "body": _loads(r["body"])} for r in rows]
        if last:
            return items[0] if items else None
        return items

    def agents(self) -> list[dict[str, Any]]:
        """Every instance with its agent (if registered), presence and runtime figures."""
        now = self.clock()
        rows = self._read("SELECT i.id AS instance_id, i.desired_power_state, i.desired_config_revision_id,"
                          " a.agent_id, a.agent_version, a.protocol_version, a.capabilities, a.host_info,"
                          " a.registered_at, a.last_heartbeat_at, a.last_reported_at, a.last_seen_ip,"
                          " a.registrations, a.session_expires_at, r.openclaw_status, r.openclaw_pid,"
                          " r.openclaw_version, r.current_config_revision_id, r.summary, r.system_info"
                          " FROM instances i LEFT JOIN agents a ON a.instance_id=i.id"
                          " LEFT JOIN runtime_status r ON r.instance_id=i.id ORDER BY i.id")
        out = []
        for r in rows:
            item = dict(r)
            for key in ("capabilities", "host_info", "summary"):
                item[key] = _loads(item[key])
            system_info = _loads(item.pop("system_info"))  # the figures stay out of the list; the LLM view stays
            stored = system_info if isinstance(system_info, dict) else {}
            # `status` as ClawManager's governance view classifies the instance, and the fields it read
            item["llm"] = {"status": llm_config_status(system_info), **{key: stored.get(key) for key in LLM_FIELDS}}
            item["last_seen"] = item["last_heartbeat_at"]
            item["presence"] = presence(item["last_heartbeat_at"], now)
            item["versions"] = {"agent_version": item["agent_version"],
                                "protocol_version": item["protocol_version"],
                                "openclaw_version": item["openclaw_version"]}
            out.append(item)
        return out

    # ---- history (the page's charts; bounded by age, see history.py) -----------------------

    def history_buckets(self, instance_id: int, since: float, step: int | None = None) -> list[dict[str, Any]]:
        """The instance's history from `since` on, oldest first (plus the bucket just before),
        merged into points `step` seconds wide (default: one bucket each)."""
        with self._lock:
            return history.read(self._db, instance_id, since, max(step or 0, self.history_bucket_seconds))

    def history_step(self, instance_id: int, since: float, max_points: int) -> int:
        """The point width (a multiple of the bucket) that draws the kept span in at most `max_points`."""
        bucket = self.history_bucket_seconds
        with self._lock:
            first = history.first_bucket(self._db, instance_id, since)
        span = self.clock() - max(first if first is not None else since, since)
        return bucket * max(1, math.ceil(span / max(1, max_points) / bucket))

    def _prune_history(self, db: sqlite3.Connection, now: float) -> None:
        # once per bucket is enough: a row is at most one bucket past the kept window
        if self._history_pruned_at is not None and 0 <= now - self._history_pruned_at < self.history_bucket_seconds:
            return
        history.prune(db, now - self.history_seconds)
        self._history_pruned_at = now

    # ---- skills ------------------------------------------------------------------

    def skills_inventory(self, instance_id: int, body: dict[str, Any], collect_packages: bool = True) -> None:
        """Upsert the reported skills; a full report marks every unlisted skill removed.

        Like ClawManager, a content hash the plane has no package for queues one
        `collect_skill_package` per instance and hash (its idempotency key).
        """
        full = (body.get("mode") or "").strip().lower() != "incremental"
        records = [s for s in body["skills"] if (s.get("content_md5") or "").strip()]
        for rec in records:
            _check_len("name", rec.get("identifier"))
            _check_len("skill_key", skill_key(rec.get("identifier") or "", rec["content_md5"]))
            _check_len("source_type", rec.get("source"))
            _check_len("install_path", rec.get("install_path"))
            _check_len("content_md5", rec["content_md5"])
        now = self.clock()
        with self._tx() as db:
            seen = [self._upsert_skill(db, instance_id, rec, now, collect_packages) for rec in records]
            if full:
                marks = ",".join("?" * len(seen))
                cond = f" AND skill_key NOT IN ({marks})" if seen else ""
                db.execute(f"UPDATE instance_skills SET status='removed', updated_at=? WHERE instance_id=?{cond}",
                           (now, instance_id, *seen))
            self._append(db, "inventories", instance_id, now, body, INVENTORIES_KEPT)

    def _upsert_skill(self, db: sqlite3.Connection, instance_id: int, rec: dict[str, Any], now: float,
                      collect: bool) -> str:
        md5 = rec["content_md5"].strip()
        key = skill_key(rec.get("identifier") or "", md5)
        source = rec.get("source") or "discovered_in_instance"
        db.execute("INSERT INTO instance_skills (instance_id, skill_key, name, content_md5, install_path,"
                   " source_type, skill_version, status, updated_at) VALUES (?,?,?,?,?,?,?,'active',?)"
                   " ON CONFLICT (instance_id, skill_key) DO UPDATE SET name=excluded.name,"
                   " content_md5=excluded.content_md5, install_path=excluded.install_path,"
                   " source_type=excluded.source_type, skill_version=excluded.skill_version,"
                   " status='active', updated_at=excluded.updated_at",
                   (instance_id, key, rec.get("identifier") or key, md5, rec.get("install_path"), source,
                    rec.get("skill_version"), now))
        blob = db.execute("SELECT version_id FROM blobs WHERE content_md5=?", (md5,)).fetchone()
        if blob is None:
            db.execute("INSERT INTO blobs (content_md5, version_id) VALUES (?, NULL)", (md5,))
        if collect and (blob is None or blob["version_id"] is None):
            skill_id = db.execute("SELECT id FROM instance_skills WHERE instance_id=? AND skill_key=?",
                                  (instance_id, key)).fetchone()["id"]
            payload = {"skill_id": f"skill_{skill_id}", "skill_version": rec.get("skill_version") or "",
                       "identifier": rec.get("identifier") or key, "content_md5": md5, "source": source}
            self._enqueue(db, instance_id, "collect_skill_package", payload, COLLECT_PACKAGE_TIMEOUT,
                          f"collect-skill-package-{instance_id}-{md5}")
        return key

    def add_upload(self, instance_id: int, filename: str, fields: dict[str, Any], top_dir: str, content_md5: str,
                   data: bytes) -> dict[str, Any]:
        """Keep an uploaded package; it becomes a downloadable skill version."""
        now = self.clock()
        with self._tx() as db:
            version = _row_id(db.execute("INSERT INTO skill_versions (filename, data, created_at) VALUES (?,?,?)",
                                         (f"{top_dir}.zip", data, now)))
            db.execute("INSERT INTO blobs (content_md5, version_id) VALUES (?, ?) ON CONFLICT (content_md5)"
                       " DO UPDATE SET version_id=excluded.version_id", (content_md5, version))
            upload = db.execute("INSERT INTO uploads (instance_id, received_at, filename, fields, top_dir,"
                                " content_md5, size, version_id) VALUES (?,?,?,?,?,?,?,?)",
                                (instance_id, now, filename, _dumps(fields), top_dir, content_md5, len(data),
                                 version)).lastrowid
        return {"upload_id": upload, "version_id": version, "content_md5": content_md5, "top_dir": top_dir}

    def skill_version(self, number: int) -> tuple[str, bytes] | None:
        rows = self._read("SELECT filename, data FROM skill_versions WHERE id=?", (number,))
        return (rows[0]["filename"], bytes(rows[0]["data"])) if rows else None

    # ---- config revisions ----------------------------------------------------------

    def config_revision(self, revision_id: int) -> dict[str, Any] | None:
        rows = self._read("SELECT * FROM config_revisions WHERE id=?", (revision_id,))
        return dict(rows[0]) if rows else None

    def publish_revision(self, instance_id: int, content: dict[str, Any], desired: bool = True) -> int:
        """Store a config revision for an instance (its content as Go would marshal it, the
        checksum sha256 over exactly those bytes) and, with `desired`, hint it in that
        instance's heartbeats as `desired_config_revision_id`; returns its id."""
        if not isinstance(content, dict) or not content:
            raise ValueError("a revision's content must be a non-empty JSON object")
        try:
            text = go_json(content)
        except RecursionError:
            raise ValueError("the revision is nested too deeply to be stored as JSON") from None
        if len(text.encode()) > REVISION_MAX_BYTES:
            raise ValueError(f"the revision is over {REVISION_MAX_BYTES} bytes of JSON")
        checksum = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM instances WHERE id=?", (instance_id,)).fetchone():
                raise ValueError(f"there is no instance {instance_id}")
            number = db.execute("SELECT COALESCE(MAX(revision_no), 0) + 1 FROM config_revisions"
                                " WHERE instance_id=?", (instance_id,)).fetchone()[0]
            revision_id = _row_id(db.execute(
                "INSERT INTO config_revisions (instance_id, revision_no, content, checksum, published_at)"
                " VALUES (?,?,?,?,?)", (instance_id, number, text, checksum, self.clock())))
            if desired:
                db.execute("UPDATE instances SET desired_config_revision_id=? WHERE id=?", (revision_id, instance_id))
        return revision_id

    def config_revisions(self, instance_id: int, limit: int = 50) -> list[dict[str, Any]]:
        """The instance's revisions, newest first: id, revision_no, published_at, the top-level
        keys of the content, and whether it is the one hinted as desired."""
        rows = self._read("SELECT r.id, r.revision_no, r.published_at, r.content, i.desired_config_revision_id"
                          " AS desired FROM config_revisions r JOIN instances i ON i.id = r.instance_id"
                          " WHERE r.instance_id=? ORDER BY r.id DESC LIMIT ?", (instance_id, limit))
        out = []
        for row in rows:
            try:
                content = json.loads(row["content"])
            except ValueError:
                content = None
            out.append({"id": row["id"], "revision_no": row["revision_no"], "published_at": row["published_at"],
                        "carries": sorted(content) if isinstance(content, dict) else [],
                        "desired": row["desired"] == row["id"]})
        return out

    # ---- run events (caldera extension) ----------------------------------------------

    def add_run_events(self, instance_id: int, run_id: str, events: list[dict[str, Any]]) -> int:
        """Store a batch of a run's events; how many were new (one sent again is kept once)."""
        now = self.clock()
        with self._tx() as db:
            return runs.add_events(db, instance_id, run_id, events, now)

    def run_exists(self, instance_id: int, run_id: str) -> bool:
        with self._lock:
            return runs.exists(self._db, instance_id, run_id)

    def runs(self, instance_id: int, limit: int = 100) -> list[dict[str, Any]]:
        """The instance's newest `limit` code-agent runs, newest first."""
        with self._lock:
            return runs.listing(self._db, instance_id, limit)

    def run(self, run_id: str, instance_id: int | None = None) -> dict[str, Any] | None:
        """One run's row and its command's status, or None."""
        with self._lock:
            return runs.one(self._db, run_id, instance_id)

    def run_event_texts(self, instance_id: int, run_id: str, after: int = 0,
                        limit: int = 1000) -> list[tuple[int, str]]:
        """(seq, JSON text) of the run's events after seq `after`, in seq order (a replay parses what it shows)."""
        with self._lock:
            return runs.stored(self._db, instance_id, run_id, after, limit)

    def run_events(self, instance_id: int, run_id: str, after: int = 0, limit: int = 1000,
                   last: bool = False) -> list[dict[str, Any]]:
        """The run's events after seq `after` (or with `last`, its last `limit`), in seq order."""
        with self._lock:
            if last:
                return runs.last_events(self._db, instance_id, run_id, limit)
            return runs.events(self._db, instance_id, run_id, after, limit)


def go_json(content: Any) -> str:
    """Go json.Marshal's text for a decoded value: compact, keys sorted, <>& and the two
    line separators escaped (the plane serves a revision's content byte for byte so). NaN and
    infinities are refused (a ValueError), as Go's encoder refuses them."""
    text = json.dumps(content, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def _row_id(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made (sqlite3 types `lastrowid` as optional)."""
    if cur.lastrowid is None:
        raise StoreError("sqlite gave no row id for an INSERT")
    return cur.lastrowid


def _command_dict(row: sqlite3.Row) -> dict[str, Any]:
    item = dict(row)
    item["payload"] = _loads(item["payload"])
    item["result"] = _loads(item["result"])
    return item
