"""`caldera plane serve|enqueue|agents|commands|reports|revision|turn|runs|run` (SPEC section 12).

`serve` runs the plane; the operator verbs open the same sqlite database
(`--db`, default `default_db_path()`) and print a table, or one JSON object
with `--json`. Times in JSON output are RFC 3339 (UTC).
"""
from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caldera import config
from caldera.errors import EXIT_FAILED, EXIT_OK, UsageError
from caldera.host import jsonlimits
from caldera.host.fsutil import atomic_write_bytes
from caldera.host.stopsignals import stop_on_signals
from caldera.host.timefmt import human_age
from caldera.plane.api import rfc3339
from caldera.plane.figures import figures
from caldera.plane.follow import End, Gap, Stored, replay
from caldera.plane.runview import end_sentence, run_duration, terminal_safe, text_lines
from caldera.plane.server import PlaneServer
from caldera.plane.store import Store
from caldera.protocol import schemas

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence


DEFAULT_PORT = 8930
TIME_KEYS = ("issued_at", "dispatched_at", "started_at", "finished_at", "registered_at", "last_heartbeat_at",
             "last_reported_at", "last_seen", "session_expires_at", "received_at", "updated_at")


def default_db_path() -> Path:
    return config.plane_db_path()


def configure(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    serve = verbs.add_parser("serve", help="run the control plane")
    _db_flag(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    serve.add_argument("--bootstrap-token", action="append", default=[], metavar="T",
                       help="an instance's bootstrap token (repeat, paired with --instance-id)")
    serve.add_argument("--instance-id", action="append", default=[], type=int, metavar="N")
    serve.add_argument("--heartbeat-interval", type=int, default=15, metavar="S",
                       help="heartbeat_interval_seconds handed out at register (default 15)")
    serve.add_argument("--poll-interval", type=int, default=5, metavar="S",
                       help="command_poll_interval_seconds handed out at register (default 5)")
    serve.add_argument("--session-ttl", type=float, default=86400, metavar="S",
                       help="session lifetime, renewed by each heartbeat (default 86400)")
    serve.add_argument("--no-collect-skill-packages", action="store_true",
                       help="do not queue collect_skill_package for unknown skill hashes")
    serve.add_argument("--history-days", type=float, default=7, metavar="D",
                       help="days of per-minute history the status page charts keep (default 7)")
    serve.add_argument("--url-file", metavar="PATH", help="write the plane's URL here once it listens")

    enqueue = verbs.add_parser("enqueue", help="queue a command for an instance (prints its id)")
    _db_flag(enqueue)
    enqueue.add_argument("--instance", type=int, required=True, metavar="N")
    enqueue.add_argument("type", metavar="TYPE", help="command type, e.g. collect_system_info")
    enqueue.add_argument("--payload", default="{}", metavar="JSON", help="the payload object (default {})")
    enqueue.add_argument("--timeout", type=int, metavar="S", help="timeout_seconds (default 300)")
    enqueue.add_argument("--idempotency-key", metavar="KEY")
    enqueue.add_argument("--no-check", action="store_true",
                         help="skip the check against schemas/commands/TYPE.schema.json")
    enqueue.add_argument("--json", action="store_true")

    agents = verbs.add_parser("agents", help="instances, their agents and presence")
    _db_flag(agents)
    agents.add_argument("--json", action="store_true")

    commands = verbs.add_parser("commands", help="an instance's commands with status and result")
    _db_flag(commands)
    commands.add_argument("--instance", type=int, required=True, metavar="N")
    commands.add_argument("--json", action="store_true")

    reports = verbs.add_parser("reports", help="an instance's state reports")
    _db_flag(reports)
    reports.add_argument("--instance", type=int, required=True, metavar="N")
    reports.add_argument("--last", action="store_true", help="only the newest")
    reports.add_argument("--json", action="store_true")

    revision = verbs.add_parser(
        "revision", help="publish a config revision (manifest and/or settings) and hint it to the instance")
    _db_flag(revision)
    revision.add_argument("--instance", type=int, required=True, metavar="N")
    revision.add_argument("--manifest", metavar="FILE",
                          help="caldera.agent.yaml text to apply as a blueprint update (30-minute window)")
    revision.add_argument("--settings", metavar="JSON", help="settings values to set through the adapter, {key: value}")
    revision.add_argument("--no-hint", action="store_true",
                          help="store only; do not name it as desired_config_revision_id in heartbeats")
    revision.add_argument("--json", action="store_true")
    _configure_runs(verbs)


def _configure_runs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    turn = verbs.add_parser("turn", help="queue a code-agent turn (agent_run) for an instance; --follow prints it")
    _db_flag(turn)
    turn.add_argument("--instance", type=int, required=True, metavar="N")
    turn.add_argument("--backend", metavar="B", help="backend_profile (the agent's default: codex)")
    turn.add_argument("--workspace", metavar="W", help="the workspace, a directory under the agent's workspace roots")
    turn.add_argument("--timeout", type=int, metavar="S", help=f"the turn's timeout_seconds (default {TURN_TIMEOUT})")
    turn.add_argument("--model", metavar="M", help="the model (the backend's default)")
    turn.add_argument("--follow", action="store_true", help="print the turn's events as they arrive, until it ends")
    turn.add_argument("--json", action="store_true", help="one event per line, as the agent sent it")
    turn.add_argument("prompt", metavar="PROMPT")

    runs = verbs.add_parser("runs", help="an instance's code-agent runs")
    _db_flag(runs)
    runs.add_argument("--instance", type=int, required=True, metavar="N")
    runs.add_argument("--json", action="store_true")

    run = verbs.add_parser("run", help="replay a code-agent run from its first event; --follow while it runs")
    _db_flag(run)
    run.add_argument("run_id", metavar="RUN_ID")
    run.add_argument("--instance", type=int, metavar="N", help="the instance (when two share the run id)")
    run.add_argument("--follow", action="store_true", help="follow the run until it ends")
    run.add_argument("--json", action="store_true", help="one event per line, as the agent sent it")


def _db_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="PATH", help=f"the plane's database (default {default_db_path()})")


def main(args: argparse.Namespace) -> int:
    return VERBS[args.verb](args)


# ---- serve ------------------------------------------------------------------------------

def _tokens(args: argparse.Namespace) -> dict[str, int] | None:
    """{token: instance} from the flags; None keeps the database's; a fresh database gets instance 1."""
    if len(args.bootstrap_token) != len(args.instance_id):
        raise UsageError("give --bootstrap-token and --instance-id in pairs")
    if args.bootstrap_token:
        if any(not t.strip() for t in args.bootstrap_token):
            raise UsageError("--bootstrap-token must not be empty")
        if any(n < 1 for n in args.instance_id):
            raise UsageError("--instance-id must be an integer >= 1")
        return dict(zip(args.bootstrap_token, args.instance_id, strict=True))
    return None


def serve(args: argparse.Namespace) -> int:
    db_path = Path(args.db) if args.db else default_db_path()
    if args.heartbeat_interval < 1 or args.poll_interval < 1:
        raise UsageError("--heartbeat-interval and --poll-interval must be at least 1 second")
    if not 0 < args.history_days <= 366:
        raise UsageError("--history-days must be more than 0 and at most 366")
    tokens = _tokens(args)
    try:
        plane = PlaneServer(db_path, host=args.host, port=args.port, tokens=tokens or {},
                            heartbeat_interval=args.heartbeat_interval, poll_interval=args.poll_interval,
                            session_ttl=args.session_ttl, collect_skill_packages=not args.no_collect_skill_packages,
                            history_days=args.history_days)
    except OSError as exc:
        print(f"caldera plane: {listen_problem(args.host, args.port, exc)}", file=sys.stderr)
        return EXIT_FAILED
    if not plane.store.instances():
        token_file = _first_instance(plane.store, db_path)
        print(f"instance 1 created; its bootstrap token is in {token_file} (0600)")
    stop = threading.Event()
    stop_on_signals(stop)
    plane.start()
    if args.url_file:
        atomic_write_bytes(args.url_file, (plane.url + "\n").encode(), mode=0o644)
    print(f"caldera plane listening on {plane.url} (status page {plane.url}/, database {db_path}); "
          f"instances {', '.join(map(str, plane.store.instances()))}", flush=True)
    stop.wait()
    plane.stop()
    print("caldera plane stopped", flush=True)
    return EXIT_OK


def listen_problem(host: str, port: int, exc: OSError) -> str:
    """Why the plane could not listen, and what to do about it (serve and demo say the same)."""
    import errno  # here: only a failed start pays for it

    said = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    if exc.errno == errno.EADDRINUSE:
        return (f"{said}: another process holds that port (a plane already running?); pick another with --port N, "
                "or --port 0 for a free one")
    if exc.errno == errno.EACCES and 0 < port < 1024:
        return f"{said}: ports below 1024 need root; pick --port 1024 or above"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{said}: no interface of this host has that address; pick --host 127.0.0.1, or one of its addresses"
    return said


def _first_instance(store: Store, db_path: Path) -> Path:
    token = "agt_boot_" + secrets.token_hex(24)
    path = db_path.parent / "bootstrap-1.token"
    atomic_write_bytes(path, (token + "\n").encode(), mode=0o600)
    store.add_instance(1, token)
    return path


# ---- operator verbs ------------------------------------------------------------------------

def _open(args: argparse.Namespace) -> Store:
    path = Path(args.db) if args.db else default_db_path()
    if not path.exists():
        raise UsageError(f"no plane database at {path} (start `caldera plane serve` or pass --db)")
    return Store(path)


def _times(value: Any) -> Any:
    """A copy with Unix times under TIME_KEYS as RFC 3339 strings."""

    if isinstance(value, list):
        return [_times(v) for v in value]
    if isinstance(value, dict):
        return {k: (rfc3339(v) if k in TIME_KEYS and isinstance(v, (int, float)) else _times(v))
                for k, v in value.items()}
    return value


def _print_json(doc: dict[str, Any]) -> None:
    print(json.dumps(_times(doc), indent=2, sort_keys=True, default=str))


def enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise UsageError(f"--payload is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise UsageError("--payload must be a JSON object")
    if not args.no_check:
        _check_payload(args.type, payload)
    store = _open(args)
    try:
        command_id = store.enqueue(args.instance, args.type, payload, args.timeout, args.idempotency_key)
    except ValueError as exc:
        print(f"caldera plane enqueue: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()
    if args.json:
        _print_json({"id": command_id, "instance_id": args.instance, "command_type": args.type})
    else:
        print(command_id)
    return EXIT_OK


def _check_payload(command_type: str, payload: dict[str, Any], hint: str = "--no-check sends it anyway") -> None:
    name = f"commands/{command_type}.schema.json"
    try:
        if schemas.schema_exists(name):
            schemas.validate(name, payload)
    except schemas.SchemaError as exc:
        raise UsageError(f"{command_type} payload: {exc} ({hint})") from None


def agents(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        rows = store.agents()
        now = store.clock()
    finally:
        store.close()
    if args.json:
        _print_json({"agents": rows})
        return EXIT_OK

    table = [("INSTANCE", "AGENT", "PRESENCE", "LAST SEEN", "VERSION", "STATUS", "LLM")]
    for a in rows:
        seen = human_age(now - a["last_seen"]) if a["last_seen"] else "never"
        table.append((str(a["instance_id"]), a["agent_id"] or "-", a["presence"], seen,
                      a["agent_version"] or "-", a["openclaw_status"] or "-", a["llm"]["status"]))
    _print_table(table)
    return EXIT_OK


def commands(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        rows = store.commands(args.instance)
    finally:
        store.close()
    if args.json:
        _print_json({"instance_id": args.instance, "commands": rows})
        return EXIT_OK
    table = [("ID", "TYPE", "STATUS", "FINISHES", "RESULT / ERROR")]
    for c in rows:
        outcome = c["error_message"] or ("" if c["result"] is None else json.dumps(c["result"], sort_keys=True))
        table.append((str(c["id"]), c["command_type"], c["status"], str(c["finish_count"]),
                      outcome if len(outcome) <= 80 else outcome[:79] + "…"))
    _print_table(table)
    return EXIT_OK


def reports(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        found = store.reports(args.instance, last=args.last)
    finally:
        store.close()
    if args.json:
        _print_json({"instance_id": args.instance, ("report" if args.last else "reports"): found})
        return EXIT_OK
    items = ([found] if found else []) if args.last else found
    if not items:
        print(f"instance {args.instance} has sent no state report")
        return EXIT_OK
    for item in items:
        figs = figures(item["body"].get("system_info"))
        shown = ", ".join(f"{k} {v[0] * 100:.0f}%" for k, v in figs.items() if isinstance(v, tuple))
        status = (item["body"].get("runtime") or {}).get("openclaw_status") or "-"
        print(f"{rfc3339(item['received_at'])}  status {status}  {shown}")
    return EXIT_OK


MANIFEST_MAX_BYTES = 256 * 1024  # a caldera.agent.yaml is a few KiB; the revision must fit the runtime's read


def revision(args: argparse.Namespace) -> int:
    """Store a revision carrying `manifest` text and/or `settings` values; print its id."""
    content: dict[str, Any] = {}
    if args.manifest:
        content["manifest"] = _manifest_text(Path(args.manifest))
    if args.settings is not None:
        try:
            # the one bounded parser: NaN/Infinity refused, depth checked before decoding (the
            # interpreter's own recursion limit differs by version: 3.13 decodes 5,000 levels)
            values = jsonlimits.loads(args.settings, max_bytes=MANIFEST_MAX_BYTES, what="--settings")
        except jsonlimits.JSONLimitError as exc:
            raise UsageError(str(exc)) from None
        except ValueError as exc:
            raise UsageError(f"--settings is not JSON: {exc}") from None
        if not isinstance(values, dict) or not values:
            raise UsageError("--settings must be a JSON object of values, e.g. '{\"interval\": 30}'")
        content["settings"] = values
    if not content:
        raise UsageError("give --manifest FILE and/or --settings JSON")
    store = _open(args)
    try:
        revision_id = store.publish_revision(args.instance, content, desired=not args.no_hint)
    except ValueError as exc:
        print(f"caldera plane revision: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()
    if args.json:
        _print_json({"id": revision_id, "instance_id": args.instance, "carries": sorted(content),
                     "desired": not args.no_hint})
    else:
        print(revision_id)
    return EXIT_OK


def _manifest_text(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MANIFEST_MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--manifest {path}: {exc.strerror or exc}") from None
    if len(raw) > MANIFEST_MAX_BYTES:
        raise UsageError(f"--manifest {path}: over {MANIFEST_MAX_BYTES // 1024} KiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--manifest {path}: not UTF-8 text") from None


def _print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


# ---- code-agent runs -----------------------------------------------------------------------------

TURN_TIMEOUT = 600  # the runtime's own default turn timeout (backends/service.py)
COMMAND_MARGIN = 60  # the command's timeout beyond the turn's: the runtime ends the turn first


def turn(args: argparse.Namespace) -> int:
    """Queue an agent_run with a fresh run id (printed first); with --follow, print it to its end."""
    run_id = f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
    payload: dict[str, Any] = {"run_id": run_id, "prompt": args.prompt}
    if args.backend:
        payload["backend_profile"] = args.backend
    if args.workspace:
        payload["workspace"] = args.workspace
    if args.model:
        payload["model"] = args.model
    if args.timeout is not None:
        payload["execution_policy"] = {"timeout_seconds": args.timeout}
    _check_payload("agent_run", payload, "see `caldera plane turn --help`")
    store = _open(args)
    try:
        store.enqueue(args.instance, "agent_run", payload, (args.timeout or TURN_TIMEOUT) + COMMAND_MARGIN,
                      f"agent_run-{args.instance}-{run_id}")
    except ValueError as exc:
        store.close()
        print(f"caldera plane turn: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps({"run_id": run_id, "instance_id": args.instance}), flush=True)
    else:
        print(run_id, flush=True)
    if not args.follow:
        store.close()
        return EXIT_OK
    return _follow(store, args.instance, run_id, args.json, follow=True)


def runs_list(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        rows = store.runs(args.instance, 1000)
        now = store.clock()
    finally:
        store.close()
    if args.json:
        _print_json({"instance_id": args.instance, "runs": rows})
        return EXIT_OK
    if not rows:
        print(f"instance {args.instance} has no code-agent runs (`caldera plane turn` sends one)")
        return EXIT_OK
    table: list[tuple[str, ...]] = [("RUN", "BACKEND", "STATUS", "FAILURE KIND", "EVENTS", "STARTED", "DURATION")]
    for r in rows:
        events = str(r["events"]) + (f"/{r['events_total']}" if r["events_total"] not in (None, r["events"]) else "")
        row = (r["run_id"], r["backend"] or "-", r["status"], r["failure_kind"] or "-", events,
               rfc3339(r["started_at"]) if r["started_at"] else "-", run_duration(r, now) or "-")
        table.append(tuple(terminal_safe(str(cell)) for cell in row))  # the agent posted them
    _print_table(table)
    return EXIT_OK


def run_replay(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        found = store.run(args.run_id, args.instance)
    except ValueError as exc:
        store.close()
        print(f"caldera plane run: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    if found is None:
        store.close()
        where = f"instance {args.instance}" if args.instance is not None else "the plane"
        print(f"caldera plane run: {where} has no run {args.run_id} (`caldera plane runs --instance N` lists them)",
              file=sys.stderr)
        return EXIT_FAILED
    return _follow(store, found["instance_id"], args.run_id, args.json, follow=args.follow)


def _follow(store: Store, instance: int, run_id: str, as_json: bool, follow: bool) -> int:
    """Print the run's events (closing `store`); the exit code says how it ended. Lines go out
    a batch at a time (what the plane held at one read), flushed, never one write per event."""
    stop = threading.Event()
    restore = stop_on_signals(stop) if follow and threading.current_thread() is threading.main_thread() else None
    out: list[str] = []
    waiting = follow  # said once, before the first event: a queued run waits for its agent
    try:
        for item in replay(store, instance, run_id, stop, follow=follow):
            if item is None and waiting:
                waiting = False
                _said_queued(store, instance, run_id)
            if isinstance(item, Stored):
                waiting = False
                out.append(item.text if as_json else "\n".join(text_lines(item.event)))
                if len(out) >= 1000:
                    _flush(out)
                continue
            _flush(out)
            if isinstance(item, End):
                return _said_end(item.run, run_id, stop.is_set())
            if isinstance(item, Gap):
                print(f"caldera plane: events {item.first} to {item.last} of run {run_id} never reached the plane "
                      "(the run log on the host has them: caldera log --agent NAME --run RUN_ID)", file=sys.stderr)
    except LookupError as exc:
        _flush(out)
        print(f"caldera plane: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # `| head` has what it wanted: quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        if restore is not None:
            restore()
        store.close()
    return EXIT_FAILED


def _said_queued(store: Store, instance: int, run_id: str) -> None:
    run = store.run(run_id, instance)
    if run is not None and run["status"] == "queued":
        print(f"caldera plane: run {run_id} is queued: waiting for instance {instance}'s agent to take it "
              "(`caldera plane agents` shows whether it is online)", file=sys.stderr, flush=True)


def _flush(lines: list[str]) -> None:
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        lines.clear()


def _said_end(run: dict[str, Any], run_id: str, stopped: bool) -> int:
    if run["status"] in ("queued", "running"):
        why = "stopped following" if stopped else "still running (--follow follows it)"
        print(f"caldera plane: run {run_id} is {run['status']}; {why}", file=sys.stderr)
        return 130 if stopped else EXIT_OK
    if run["status"] == "completed":
        return EXIT_OK
    sentence = end_sentence(run["status"], run["failure_kind"], run["message"] or run.get("error_message"))
    print(terminal_safe(f"caldera plane: run {run_id}: {sentence}"), file=sys.stderr)
    return EXIT_FAILED


VERBS = {"serve": serve, "enqueue": enqueue, "agents": agents, "commands": commands, "reports": reports,
         "revision": revision, "turn": turn, "runs": runs_list, "run": run_replay}
