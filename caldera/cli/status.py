"""`caldera status [--json] [--watch [SECONDS]]`: the agent's state, gauges, held
locks, the connection ("last successful was X ago"), the outbox depth and the
last commands. Local only: it reads the state directory and asks the adapter;
it never calls the control plane and imports neither the HTTP client nor jsonschema.

`--watch` draws it again every SECONDS (default 2): in place on a terminal
(cursor home, each line erased to its end, the rest of the screen cleared),
as successive blocks under a time line when stdout is not a terminal (a log, a
pipe), one JSON object a line with --json. Ctrl-C or SIGTERM ends it, exit 0."""
from __future__ import annotations

import datetime as dt
import json
import os
import sys
import threading

from caldera import TYPE_CHECKING
from caldera.cli import add_agent_flags
from caldera.errors import ConfigError, Refused, UsageError
from caldera.host.jsonlimits import escape_surrogates
from caldera.host.stopsignals import stop_on_signals

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any, TextIO

    from caldera.agents.manifest import Manifest
    from caldera.config import AgentPaths
    from caldera.redact import Redactor

BAR_WIDTH = 20
WATCH_SECONDS = 2.0
COMMANDS_SHOWN = 5
HOME, ERASE_LINE, ERASE_BELOW, CLEAR = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[2J"
SYSTEMD_BOOTED = "/run/systemd/system"  # sd_booted()'s test: `systemctl reload` reaches the daemon here


def configure(parser: argparse.ArgumentParser) -> None:
    add_agent_flags(parser)
    parser.add_argument("--watch", nargs="?", type=float, const=WATCH_SECONDS, metavar="SECONDS",
                        help=f"redraw every SECONDS (default {WATCH_SECONDS:g}) until Ctrl-C; "
                             "in place on a terminal, successive blocks otherwise")


def _ago(iso: str | None) -> str:
    from caldera.host.timefmt import human_age  # here: `status --help` does without it

    if not iso:
        return "never"
    try:
        when = dt.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return iso
    return human_age((dt.datetime.now(dt.UTC) - when).total_seconds())


def bar(used: Any) -> str:
    """A gauge's `used` (a fraction, as the adapter sent it) as a bar and a percentage."""
    try:
        fraction = min(1.0, max(0.0, float(used)))
    except (TypeError, ValueError):
        return "[" + "?" * BAR_WIDTH + "]"
    filled = round(fraction * BAR_WIDTH)
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + f"] {fraction * 100:3.0f}%"


def _state(paths: AgentPaths) -> dict[str, Any]:
    from caldera.host.fsutil import read_json  # here: `status --help` does without it

    try:
        return read_json(paths.state_dir / "state.json", {}) or {}
    except ValueError:
        return {}


def connection_info(paths: AgentPaths, state: dict[str, Any] | None = None) -> dict[str, Any]:
    state = _state(paths) if state is None else state
    conn = dict(state.get("connection") or {})
    conn["last_successful"] = _ago(conn.get("last_heartbeat_ok_at"))
    return conn


def _load(paths: AgentPaths) -> Manifest | None:
    """The effective manifest (installed + stored update), or None when none is installed.
    A state dir that is not there is not made here (by the manifest cache): status says so."""
    if not paths.manifest_path.is_file():
        return None
    from caldera.agents.updates import load_effective  # here: `status --help` does without it

    return load_effective(paths, cache_dir=_cache_dir(paths))


def _cache_dir(paths: AgentPaths) -> Path | None:
    """The manifest cache's dir, in a state dir that is there (status never makes one)."""
    return paths.state_dir / "cache" if paths.state_dir.is_dir() else None


def _agent_status(paths: AgentPaths, manifest: Manifest | None, redact: Redactor) -> dict[str, Any] | None:
    """{"body": the agent's status body, "process": process mode's figures, "adapter_stderr":
    the end of a failed status call's stderr (redacted whole, then cut)}; None without a manifest."""
    from caldera.agents.adapter.answer import stderr_excerpt  # here: `status --help` does without them
    from caldera.agents.adapter.driver import ask_status

    if manifest is None:
        return None
    if manifest.runtime_type == "process":
        return _process_status(paths, manifest)
    if manifest.runtime_type != "adapter":
        return None
    body, stderr = ask_status(manifest)
    return {"body": body, "adapter_stderr": stderr_excerpt(stderr, redact) if stderr else []}


def _process_status(paths: AgentPaths, manifest: Manifest) -> dict[str, Any]:
    """Process mode: the daemon's view over its control socket; without a daemon, what
    state.json and /proc say (the agent is not running then, or was left by a killed runtime)."""
    from caldera.agents.process.cli import ask

    reply = ask(paths, "status")
    if reply is not None and reply.get("ok"):
        return {"body": reply.get("agent_status"), "process": reply.get("process")}
    from caldera.agents.process.driver import open_process_driver
    from caldera.host.statefile import StateFile
    from caldera.redact import Redactor

    driver = open_process_driver(paths, manifest, state=StateFile(paths.state_dir / "state.json"),
                                 redactor=Redactor(), supervise=False)
    body, info = driver.status_body()
    return {"body": body, "process": info}


def manifest_info(paths: AgentPaths, manifest: Manifest | None, state: dict[str, Any]) -> dict[str, Any] | None:
    """Which manifest is in effect: the installed one (from /etc) and the stored update over it."""
    if manifest is None:
        return None
    from caldera.agents.manifest import load_manifest  # here, as above

    installed = load_manifest(paths.manifest_path, cache_dir=_cache_dir(paths))
    update = manifest.update or {}
    return {"installed": {"path": str(paths.manifest_path), "version": installed.version},
            "effective": {"source": "update" if manifest.update else "installed",
                          "revision_id": update.get("revision_id"), "version": manifest.version},
            "current_config_revision_id": state.get("current_config_revision_id")}


def _redactor(paths: AgentPaths) -> Redactor:
    """Masks secrets.env's values where this user may read them, and every credential shape."""
    from caldera.config import read_env_file  # here: `status --help` does without it
    from caldera.redact import Redactor

    try:
        return Redactor(read_env_file(paths.secrets_env, secret=True).values())
    except (OSError, ConfigError):
        return Redactor()  # an operator without rights to secrets.env: the shapes are still masked


def storage_info(paths: AgentPaths, daemon_saw: Any = None,
                 statvfs: Callable[[Any], os.statvfs_result] = os.statvfs) -> dict[str, Any] | None:
    """Whether the state dir takes writes: its file system as seen now (full, read-only), else
    what the daemon last recorded (status.json; state.json cannot say: it is not written
    then). None when nothing is wrong."""
    from caldera.host.storage import free_space_problem  # here: `status --help` does without it

    if not paths.state_dir.is_dir():
        return None
    # The daemon writes as the state dir's owner: root (a container's) may use the reserved blocks.
    problem = free_space_problem(paths.state_dir, statvfs, as_root=paths.state_dir.stat().st_uid == 0)
    if problem is not None:
        return {"state_dir": str(paths.state_dir), "problem": problem}
    if isinstance(daemon_saw, dict) and daemon_saw.get("error"):
        return {"state_dir": str(paths.state_dir), "problem": f"{daemon_saw.get('error')} "
                f"(writing {daemon_saw.get('path')}, since {daemon_saw.get('since')})"}
    return None


def skills_info(paths: AgentPaths, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The skill dirs in use (docs/skills.md): the managed one, the discovered ones as the scan
    takes them (config.skill_dirs_scanned over the environment, agent.env and secrets.env merged
    by the daemon's own loader, config.merged_env), each with whether it exists now, the entries
    left out (not absolute) and where they come from. A file this user may not read is named in
    `unread`, and the dirs are then those of the rest."""
    from caldera.config import merged_env, read_env_file, skill_dirs_scanned  # `status --help` does without it

    unread = None
    try:
        env, _ = merged_env(paths, environ)
    except (OSError, UnicodeDecodeError, ConfigError):
        unread = "secrets.env"  # an operator who may not read it: the process environment and agent.env
        env = dict(environ)
        try:
            env.update(read_env_file(paths.agent_env))
        except (OSError, UnicodeDecodeError, ConfigError):
            unread = "agent.env and secrets.env"
    dirs, left_out, origin = skill_dirs_scanned(env)
    managed = str(paths.state_dir / "skills")
    info: dict[str, Any] = {"managed": managed, "discovered": [{"path": d, "exists": os.path.isdir(d)} for d in dirs],
                            "left_out": left_out, "from": origin}
    if unread:
        info["unread"] = unread
    return info


def snapshot(paths: AgentPaths, redact: Redactor,
             statvfs: Callable[[Any], os.statvfs_result] = os.statvfs) -> dict[str, Any]:
    """Everything `caldera status` shows, read once (the adapter is asked once). A user who
    may not read the state dir (0711: an admin without sudo) gets the daemon's status.json.
    `statvfs` looks at the state dir's file system (a test's stands in for a full one)."""
    if paths.state_dir.is_dir() and not os.access(paths.state_dir, os.R_OK):
        doc = _daemon_snapshot(paths)
        doc["storage"] = storage_info(paths, doc.pop("daemon_storage", None), statvfs)
        doc["skills"] = skills_info(paths)
        return doc
    from caldera.config import state_left_here  # here: `status --help` does without them
    from caldera.host.fsutil import StateLock
    from caldera.protocol.outbox import held_items, outbox_depth, rejected_count

    missing = not paths.state_dir.is_dir()
    manifest = _load(paths)
    asked = redact(_agent_status(paths, manifest, redact)) or {}
    agent, process, stderr = asked.get("body"), asked.get("process"), asked.get("adapter_stderr")
    state = _state(paths)
    conn = redact(connection_info(paths, state))
    conn["daemon"] = StateLock(paths.state_dir, "status").holder() if paths.state_dir.is_dir() else None
    daemon_doc = _status_json(paths)
    if conn["daemon"] and daemon_doc.get("local") is True:
        conn["local"] = True  # the running daemon has no control plane
    if not conn["daemon"] and not conn.get("last_heartbeat_ok_at") and _enabled(paths) is False:
        conn["not_enabled_in"] = str(paths.agent_env)  # no control plane yet: not "no heartbeat has succeeded"
    # drop counters since the daemon started (outbox: superseded reports/inventories; events: run
    # events the plane never got; lanes: commands offered while stopping, kept for the next start)
    outbox = {"items": outbox_depth(paths.state_dir), "dropped": state.get("drops") or {},
              "held_back": redact(held_items(paths.state_dir / "outbox")),  # failed deliveries, with why
              "rejected": rejected_count(paths.state_dir)}
    storage = storage_info(paths, daemon_doc.get("storage"), statvfs)
    doc = {"agent_status": agent, "connection": conn, "outbox": outbox, "commands": redact(recent_commands(state)),
           "manifest": manifest_info(paths, manifest, state), "storage": storage, "skills": skills_info(paths)}
    if missing:
        doc["state_dir_missing"] = str(paths.state_dir)
        doc["installed"] = _installed(paths)
    if process is not None:
        doc["process"] = process
    if stderr:
        doc["adapter_stderr"] = stderr
    if not conn["daemon"]:
        doc["daemon_elsewhere"] = _elsewhere(paths)
    older = state_left_here(paths)
    if older is not None:
        doc["older_state"] = str(older)
    return doc


def _elsewhere(paths: AgentPaths) -> dict[str, Any] | None:
    """A runtime of this agent that holds another state dir (a forgotten CALDERA_STATE_DIR,
    another --state-dir), as /proc shows it; None when none is seen."""
    from caldera.host.procscan import naming, runtime_elsewhere  # here, as above

    other = runtime_elsewhere(paths)
    if other is None:
        return None
    return {"pid": other.pid, "role": other.role, "state_dir": other.state_dir, "name_it": naming(paths, other)}


def _enabled(paths: AgentPaths) -> bool | None:
    """Whether the agent's files and environment enable the control plane (None: they don't read)."""
    from caldera.config import lookup, merged_env, read_env_file  # here, as above

    try:
        try:
            env, _ = merged_env(paths)
        except PermissionError:  # secrets.env is the daemon's: agent.env says it
            env = {**os.environ, **read_env_file(paths.agent_env)}
    except (OSError, ValueError, ConfigError):
        return None
    return (lookup(env, "CALDERA_AGENT_ENABLED") or "").strip().lower() in ("true", "1", "yes", "on")


def _installed(paths: AgentPaths) -> bool:
    """An agent caldera init installed (--agent), not one named by its manifest (--manifest)."""
    from caldera.config import config_root  # here, as above

    return paths.manifest_path.parent.parent == config_root() / "agents"


def _status_json(paths: AgentPaths) -> dict[str, Any]:
    """status.json as the daemon last wrote it: its storage record (a failure it could still
    write) and whether it runs without a control plane; {} when there is none."""
    from caldera.host.fsutil import read_json  # here, as above

    try:
        snap = read_json(paths.state_dir / "status.json", None)
    except (OSError, ValueError):
        return {}
    return snap if isinstance(snap, dict) else {}


def dumps(doc: dict[str, Any]) -> str:
    """One JSON line; a lone surrogate an adapter sent (data) stays JSON-escaped, so printing never fails."""
    return escape_surrogates(json.dumps(doc, ensure_ascii=False))


def _daemon_snapshot(paths: AgentPaths) -> dict[str, Any]:
    """status.json, which the daemon writes (redacted, 0644) before READY=1 and after each report."""
    from caldera.host.fsutil import read_json  # here, as above

    path = paths.state_dir / "status.json"
    try:
        snap = read_json(path, None)
    except ValueError:
        snap = None
    if not isinstance(snap, dict):
        raise Refused(f"{paths.state_dir} is not readable for this user and {path} is not there yet "
                      f"(the daemon writes it); `sudo caldera status --agent {paths.name}` asks the adapter")
    conn = dict(snap.get("connection") or {})
    conn["last_successful"] = _ago(conn.get("last_heartbeat_ok_at"))
    pid = snap.get("daemon_pid")
    conn["daemon"] = f"pid {pid}" if isinstance(pid, int) and _alive(pid) else None
    if conn["daemon"] and snap.get("local") is True:
        conn["local"] = True
    outbox = snap.get("outbox") if isinstance(snap.get("outbox"), dict) else {"items": "?"}
    agent = snap.get("agent_status") if isinstance(snap.get("agent_status"), dict) else None
    commands = recent_commands({"recent_commands": snap.get("recent_commands")})
    doc = {"agent_status": agent, "connection": conn, "outbox": outbox, "commands": commands,
           "snapshot_at": snap.get("written_at"), "daemon_storage": snap.get("storage")}
    if isinstance(snap.get("process"), dict):  # process mode, as of the daemon's last report
        doc["process"] = snap["process"]
    return doc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # it runs, as another user
    except OSError:
        return False
    return True


def recent_commands(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Commands in progress (the daemon's journal), then the last finished ones, newest first."""
    journal = state.get("commands")
    if not isinstance(journal, dict):
        journal = {}
    running = [{"id": (e.get("command") or {}).get("id", cid), "status": "running" if e.get("phase") == "executing"
                else "fetched", "command_type": (e.get("command") or {}).get("command_type")}
               for cid, e in journal.items() if isinstance(e, dict)]
    done = [c for c in state.get("recent_commands") or [] if isinstance(c, dict)]
    return (running + done)[:COMMANDS_SHOWN]


def main(args: argparse.Namespace) -> int:
    from caldera.config import agent_from_args  # here: `status --help` does without it

    paths = agent_from_args(args)
    redact = _redactor(paths)
    if args.watch is not None:
        if not args.watch > 0:
            raise UsageError("--watch takes a number of seconds above 0")
        return watch(paths, redact, args.json, args.watch)
    doc = snapshot(paths, redact)
    print(dumps(doc) if args.json else render(paths.name, doc))
    return 0


def watch(paths: AgentPaths, redact: Redactor, as_json: bool, seconds: float, out: TextIO | None = None) -> int:
    """Redraw until SIGINT/SIGTERM; exit 0."""
    out = out or sys.stdout
    stop = threading.Event()
    stop_on_signals(stop)
    in_place = out.isatty() and not as_json
    if in_place:
        out.write(CLEAR)
    from caldera.host import timefmt  # here, as above

    while not stop.is_set():
        doc = snapshot(paths, redact)
        if as_json:
            out.write(dumps(doc) + "\n")
        elif in_place:
            lines = render(paths.name, doc).split("\n") + [f"(every {seconds:g} s; Ctrl-C ends)"]
            out.write(HOME + "".join(line + ERASE_LINE + "\n" for line in lines) + ERASE_BELOW)
        else:
            out.write(f"--- {timefmt.rfc3339()}\n{render(paths.name, doc)}\n\n")
        out.flush()
        stop.wait(seconds)
    return 0


def render(name: str, doc: dict[str, Any]) -> str:
    agent = doc["agent_status"] or {}
    conn, outbox = doc["connection"], doc["outbox"]
    state = agent.get("state") or {}
    lines = [f"agent {name}: {state.get('label') or 'unknown'} ({state.get('level') or '?'})"]
    if agent.get("detail"):
        lines.append(f"  {agent['detail']}")
    for gauge in agent.get("gauges") or []:
        label = f" {gauge['label']}" if gauge.get("label") else ""
        lines.append(f"  {gauge.get('name', '?'):<16} {bar(gauge.get('used'))}{label}")
    for number, line in enumerate(doc.get("adapter_stderr") or ()):  # why a status call failed, in its words
        lines.append(f"  {'adapter stderr:' if number == 0 else '':<16}{line}")
    for item in agent.get("held") or []:
        lines.append(f"  held: {item}")
    for entry in agent.get("health") or []:
        lines.append(f"  health {entry.get('name')}: {entry.get('level')}"
                     + (f" ({entry['reason']})" if entry.get("reason") else ""))
    if agent.get("next_run"):
        lines.append(f"  next run: {agent['next_run'].get('at')} {agent['next_run'].get('reason') or ''}".rstrip())
    lines.append(_connection_line(conn))
    if conn.get("auth_blocked"):
        lines.append(f"  registration refused: {conn['auth_blocked']} (fix the configuration, then: "
                     f"{_reload(name, conn.get('daemon'))})")
    lines.extend(_manifest_lines(doc.get("manifest")))
    lines.append(_daemon_line(name, doc))
    if doc.get("state_dir_missing") and doc.get("installed"):
        lines.append(f"state dir {doc['state_dir_missing']}: not there (caldera init makes it; an agent installed "
                     "with CALDERA_STATE_DIR set is read with the same CALDERA_STATE_DIR)")
    elif doc.get("state_dir_missing"):
        lines.append(f"state dir {doc['state_dir_missing']}: not there yet (caldera run or a verb makes it)")
    if doc.get("older_state"):
        lines.append(f"state dir {doc['older_state']}: this agent's state from an older caldera (under the directory "
                     f"the command was typed in); move it beside the manifest, or name it with --state-dir "
                     f"{doc['older_state']}")
    storage = doc.get("storage")
    if storage:
        until = "there is space" if "full" in storage["problem"] else "it takes writes again"
        lines.append(f"state dir {storage['state_dir']}: {storage['problem']}: commands are not fetched until {until}")
    dropped = ", ".join(f"{name} {count}" for name, count in sorted((outbox.get("dropped") or {}).items()))
    lines.append(f"outbox: {outbox['items']} waiting"
                 + (f"; dropped since the daemon started: {dropped}" if dropped else "")
                 + (f"; {outbox['rejected']} rejected for good (outbox/rejected/)" if outbox.get("rejected") else ""))
    for held in outbox.get("held_back") or []:
        what = f"{held['kind']} of command {held['command_id']}" if held.get("command_id") is not None else held["kind"]
        lines.append(f"  held back: {what}, {held['attempts']} tries since {held['since']}, "
                     f"next {held['next_try_at']}: {held['reason']}")
    if doc.get("process") is not None:
        lines.extend(_process_lines(doc["process"]))
    lines.extend(_skills_lines(doc.get("skills")))
    lines.extend(_command_lines(doc.get("commands") or []))
    if doc.get("snapshot_at"):
        lines.append(f"(the daemon's snapshot of {_ago(doc['snapshot_at'])}; "
                     f"`sudo caldera status --agent {name}` asks the adapter now)")
    return "\n".join(lines)


def _reload(name: str, holder: str | None) -> str:
    """How the daemon re-reads its configuration, from here: systemd's reload, or its pid's SIGHUP."""
    if os.path.isdir(SYSTEMD_BOOTED):
        return f"systemctl reload caldera@{name}"
    pid = (holder or "").partition(" ")[0]
    return f"kill -HUP {pid}" if pid.isdigit() else "kill -HUP the pid of its caldera run"


def _daemon_line(name: str, doc: dict[str, Any]) -> str:
    """Who holds this state dir; when none does, never "not running" while this agent's
    runtime runs with another state dir, nor where there is no state dir to tell."""
    holder = doc["connection"].get("daemon")
    other = doc.get("daemon_elsewhere")
    if holder or not (other or doc.get("state_dir_missing")):
        return f"daemon: {_holder_words(holder)}"
    if not other:
        return (f"daemon: none with this state dir (it is not there), and no caldera run of agent {name} "
                "is seen on this host")
    who = f"pid {other['pid']} ({'caldera run' if other['role'] == 'run' else 'caldera report --once'})"
    if other.get("state_dir") is None:
        return (f"daemon: not with this state dir; {who} runs agent {name} with another, which this user cannot "
                "see (its environment is another user's)")
    return (f"daemon: not with this state dir; {who} runs agent {name} with state dir {other['state_dir']}: "
            f"name that one ({other['name_it']})")


def _holder_words(holder: str | None) -> str:
    """The state dir lock's holder ("PID ROLE", StateLock.holder) as a person reads it."""
    if not holder:
        return "not running"
    pid, _, role = holder.partition(" ")
    if not pid.isdigit():
        return holder
    return {"daemon": f"running, pid {pid}", "report": f"pid {pid} (caldera report --once)"}.get(role, holder)


def _connection_line(conn: dict[str, Any]) -> str:
    """The control-plane connection: the last good heartbeat, else why there is none."""
    error = (f"; last error: {conn['last_error']} ({_ago(conn.get('last_error_at'))})"
             if conn.get("last_error") else "")
    if conn.get("last_heartbeat_ok_at"):
        return f"connection: last heartbeat ok {conn['last_successful']}{error}"
    if conn.get("local"):
        return ("connection: none: the daemon runs without a control plane (CALDERA_AGENT_ENABLED is not true; "
                "its log's first line says how to connect); the agent verbs work")
    if conn.get("not_enabled_in"):
        return (f"connection: none: the control plane is not enabled (CALDERA_AGENT_ENABLED is not true in "
                f"{conn['not_enabled_in']}); caldera run stays local until it is{error}")
    return f"connection: no heartbeat has succeeded yet{error}"


def _process_lines(info: dict[str, Any]) -> list[str]:
    """Process mode: pid, uptime, restarts, last exit, the hold."""
    from caldera.host.timefmt import human_age  # here, as above

    if info.get("pid"):
        up = human_age(info["uptime_seconds"]).replace(" ago", "") if info.get("uptime_seconds") is not None else "?"
        line = f"process: pid {info['pid']}, {info.get('status')}, up {up}"
    else:
        reason = f": {info['reason']}" if info.get("reason") else ""
        line = f"process: not running ({info.get('status')}{reason})"
    out = [line + f", {info.get('restarts') or 0} restart{'' if info.get('restarts') == 1 else 's'}"]
    last = info.get("last_exit")
    if last:
        out.append(f"  last exit: {last.get('reason')} ({_ago(last.get('at'))})")
    if info.get("hold"):
        out.append(f"  held: {info['hold']} (caldera resume starts it)")
    return out


def _skills_lines(info: dict[str, Any] | None) -> list[str]:
    if not info:
        return []
    found = [d["path"] + ("" if d["exists"] else " (not there)") for d in info["discovered"]]
    where = f" ({info['from']})" if info.get("from") else ""
    line = f"skills: {info['managed']} (managed)" + (f"; {', '.join(found)}{where}" if found else "; no other dirs")
    if info.get("left_out"):
        line += f"; left out (not absolute): {', '.join(info['left_out'])}"
    if info.get("unread"):
        line += f" ({info['unread']} not readable here: a skill-dirs setting there is not shown)"
    return [line]


def _manifest_lines(info: dict[str, Any] | None) -> list[str]:
    if not info:
        return []
    eff = info["effective"]
    installed = f"installed {info['installed']['version'] or '(no version)'}"
    if eff["source"] == "update":
        return [f"manifest: {installed}; in effect: update {eff['version'] or '(no version)'} "
                f"from config revision {eff['revision_id']}"]
    return [f"manifest: {installed}, in effect (no update stored)"]


def _command_lines(commands: list[dict[str, Any]]) -> list[str]:
    if not commands:
        return ["commands: none yet"]
    out = ["commands:"]
    for c in commands:
        when = f" {_ago(c['finished_at'])}" if c.get("finished_at") else ""
        error = f": {c['error']}" if c.get("error") else ""
        out.append(f"  #{c.get('id')} {c.get('command_type') or '?'} {c.get('status')}{when}{error}")
    return out
