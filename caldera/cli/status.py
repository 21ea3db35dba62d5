"""`caldera status [--json]`: the agent's state, gauges, held locks, the
connection ("last successful was X ago") and the outbox depth. Local only: it
reads the state directory and asks the adapter; it never calls the control
plane and imports neither requests nor jsonschema."""
from __future__ import annotations

import datetime as dt
import json
import os
import sys

from caldera.cli import add_agent_flags

BAR_WIDTH = 20


def configure(parser) -> None:
    add_agent_flags(parser)


def _ago(iso: str | None) -> str:
    from caldera.host.timefmt import human_age

    if not iso:
        return "never"
    try:
        when = dt.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return iso
    return human_age((dt.datetime.now(dt.timezone.utc) - when).total_seconds())


def bar(used) -> str:
    try:
        fraction = min(1.0, max(0.0, float(used)))
    except (TypeError, ValueError):
        return "[" + "?" * BAR_WIDTH + "]"
    filled = round(fraction * BAR_WIDTH)
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + f"] {fraction * 100:3.0f}%"


def connection_info(paths) -> dict:
    from caldera.host.fsutil import read_json

    try:
        state = read_json(paths.state_dir / "state.json", {}) or {}
    except ValueError:
        state = {}
    conn = dict(state.get("connection") or {})
    conn["last_successful"] = _ago(conn.get("last_heartbeat_ok_at"))
    return conn


def _agent_status(paths) -> dict | None:
    if not paths.manifest_path.is_file():
        return None
    from caldera.agents.adapter.driver import adapter_status
    from caldera.agents.manifest import load_manifest

    manifest = load_manifest(paths.manifest_path, cache_dir=paths.state_dir / "cache")
    if getattr(manifest, "runtime_type", None) != "adapter":
        return None
    return adapter_status(paths, manifest)


def _redactor(paths):
    """Masks secrets.env's values where this user may read them, and every credential shape."""
    from caldera.config import read_env_file
    from caldera.errors import ConfigError
    from caldera.redact import Redactor

    try:
        values = read_env_file(paths.secrets_env, secret=True).values()
    except (OSError, ConfigError):
        values = ()  # an operator without rights to secrets.env: the shapes are still masked
    return Redactor(values)


def main(args) -> int:
    from caldera.config import agent_from_args
    from caldera.host.fsutil import StateLock
    from caldera.protocol.outbox import outbox_depth

    paths = agent_from_args(args)
    if paths.state_dir.is_dir() and not os.access(paths.state_dir, os.R_OK):
        return _from_snapshot(paths, args)
    redact = _redactor(paths)
    agent = redact(_agent_status(paths))
    conn = redact(connection_info(paths))
    holder = StateLock(paths.state_dir, "status").holder() if paths.state_dir.is_dir() else None
    conn["daemon"] = holder
    outbox = {"items": outbox_depth(paths.state_dir)}
    if args.json:
        print(json.dumps({"agent_status": agent, "connection": conn, "outbox": outbox}))
    else:
        _print_human(paths.name, agent, conn, outbox)
    return 0


def _from_snapshot(paths, args) -> int:
    """A user who may not read the state dir (0711): the daemon's redacted status.json."""
    from caldera.host.fsutil import read_json

    path = paths.state_dir / "status.json"
    try:
        snap = read_json(path, None)
    except ValueError:
        snap = None
    if not isinstance(snap, dict):
        print(f"caldera status: {paths.state_dir} is not readable for this user and {path} "
              "is not there yet (the daemon writes it after each state report); "
              f"`sudo caldera status --agent {paths.name}` asks the adapter", file=sys.stderr)
        return 1
    conn = dict(snap.get("connection") or {})
    conn["last_successful"] = _ago(conn.get("last_heartbeat_ok_at"))
    pid = snap.get("daemon_pid")
    conn["daemon"] = f"pid {pid}" if isinstance(pid, int) and _alive(pid) else None
    outbox = snap.get("outbox") if isinstance(snap.get("outbox"), dict) else {"items": "?"}
    agent = snap.get("agent_status") if isinstance(snap.get("agent_status"), dict) else None
    if args.json:
        print(json.dumps({"agent_status": agent, "connection": conn, "outbox": outbox,
                          "snapshot_at": snap.get("written_at")}))
        return 0
    _print_human(paths.name, agent, conn, outbox)
    print(f"(the daemon's snapshot of {_ago(snap.get('written_at'))}; "
          f"`sudo caldera status --agent {paths.name}` asks the adapter now)")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # it runs, as another user
    except OSError:
        return False
    return True


def _print_human(name, agent, conn, outbox) -> None:
    agent = agent or {}
    state = agent.get("state") or {}
    print(f"agent {name}: {state.get('label') or 'unknown'} ({state.get('level') or '?'})")
    if agent.get("detail"):
        print(f"  {agent['detail']}")
    for gauge in agent.get("gauges") or []:
        label = f" {gauge['label']}" if gauge.get("label") else ""
        print(f"  {gauge.get('name', '?'):<16} {bar(gauge.get('used'))}{label}")
    for item in agent.get("held") or []:
        print(f"  held: {item}")
    for entry in agent.get("health") or []:
        print(f"  health {entry.get('name')}: {entry.get('level')}"
              + (f" ({entry['reason']})" if entry.get("reason") else ""))
    if agent.get("next_run"):
        print(f"  next run: {agent['next_run'].get('at')} {agent['next_run'].get('reason') or ''}".rstrip())
    print(f"connection: last heartbeat ok {conn['last_successful']}"
          + (f"; last error: {conn['last_error']} ({_ago(conn.get('last_error_at'))})" if conn.get("last_error") else ""))
    if conn.get("auth_blocked"):
        print(f"  registration refused: {conn['auth_blocked']} (fix the configuration, then: systemctl reload)")
    print(f"daemon: {conn['daemon'] or 'not running'}")
    print(f"outbox: {outbox['items']} waiting")
