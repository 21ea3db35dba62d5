"""`caldera status [--json]`: the agent's state, gauges, held locks, the
connection ("last successful was X ago") and the outbox depth. Local only: it
reads the state directory and asks the adapter; it never calls the control
plane and imports neither requests nor jsonschema."""
from __future__ import annotations

import datetime as dt
import json

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


def _state(paths) -> dict:
    from caldera.host.fsutil import read_json

    try:
        return read_json(paths.state_dir / "state.json", {}) or {}
    except ValueError:
        return {}


def connection_info(paths, state: dict | None = None) -> dict:
    state = _state(paths) if state is None else state
    conn = dict(state.get("connection") or {})
    conn["last_successful"] = _ago(conn.get("last_heartbeat_ok_at"))
    return conn


def _agent_status(paths) -> dict | None:
    if not paths.manifest_path.is_file():
        return None
    from caldera.agents.adapter.driver import adapter_status
    from caldera.agents.manifest import load_manifest

    manifest = load_manifest(paths.manifest_path, cache_dir=paths.state_dir / "cache")
    if getattr(manifest, "runtime_type", None) == "process":
        return _process_status(paths, manifest)
    if getattr(manifest, "runtime_type", None) != "adapter":
        return None
    return adapter_status(paths, manifest)


def _process_status(paths, manifest) -> dict:
    """Process mode: the daemon's view over its control socket; without a daemon, what
    state.json and /proc say (the agent is not running then, or was left by a killed runtime)."""
    from caldera.agents.process.cli import ask

    reply = ask(paths, "status")
    if reply is not None and reply.get("ok"):
        return {"body": reply.get("agent_status"), "process": reply.get("process")}
    from caldera.agents.process.driver import open_driver
    from caldera.host.statefile import StateFile
    from caldera.redact import Redactor

    driver = open_driver(paths, manifest, store=StateFile(paths.state_dir / "state.json"), redactor=Redactor(),
                         supervise=False)
    body, info = driver.status_body()
    return {"body": body, "process": info}


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
    redact = _redactor(paths)
    agent = redact(_agent_status(paths))
    process = None
    if isinstance(agent, dict) and "process" in agent and "body" in agent:
        agent, process = agent["body"], agent["process"]
    state = _state(paths)
    conn = redact(connection_info(paths, state))
    holder = StateLock(paths.state_dir, "status").holder() if paths.state_dir.is_dir() else None
    conn["daemon"] = holder
    # drop counters since the daemon started (outbox: superseded reports/inventories; events: run
    # events the plane never got; lanes: commands offered while stopping, kept for the next start)
    outbox = {"items": outbox_depth(paths.state_dir), "dropped": state.get("drops") or {}}
    if args.json:
        doc = {"agent_status": agent, "connection": conn, "outbox": outbox}
        if process is not None:
            doc["process"] = process
        print(json.dumps(doc))
    else:
        _print_human(paths.name, agent, conn, outbox)
        if process is not None:
            _print_process(process)
    return 0


def _print_process(info: dict) -> None:
    from caldera.host.timefmt import human_age

    if info.get("pid"):
        up = human_age(info["uptime_seconds"]).replace(" ago", "") if info.get("uptime_seconds") is not None else "?"
        line = f"process: pid {info['pid']}, {info.get('status')}, up {up}"
    else:
        line = f"process: not running ({info.get('status')}" + (f": {info['reason']}" if info.get("reason") else "") + ")"
    print(line + f", {info.get('restarts') or 0} restart{'' if info.get('restarts') == 1 else 's'}")
    last = info.get("last_exit")
    if last:
        print(f"  last exit: {last.get('reason')} ({_ago(last.get('at'))})")
    if info.get("hold"):
        print(f"  held: {info['hold']} (caldera resume starts it)")


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
    dropped = ", ".join(f"{name} {count}" for name, count in sorted(outbox["dropped"].items()))
    print(f"outbox: {outbox['items']} waiting" + (f"; dropped since the daemon started: {dropped}" if dropped else ""))
