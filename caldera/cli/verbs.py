"""The local verbs: `caldera pause | resume | run-now | settings | log`.

`log --run RUN_ID [--follow]` prints a code-agent run's log (`logs/run-RUN_ID.log` in the
state dir) without the adapter, redacted again with the agent's secrets, to whoever may
read the agent's state (as root: the agent's account, like every verb here); `log --list`
names the run logs after the adapter's logs.

They call the adapter directly, with no control plane and no daemon. A person
types them, so they must feel instant: this module and what it imports never
import requests, jsonschema or (with the manifest cache warm) yaml.
Exit codes: 0 done (run-now: also when held), 1 refused or failed, 2 usage or
configuration error. `--json` prints exactly one object {ok, message, held, …}.
"""
from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import threading

from caldera import TYPE_CHECKING
from caldera.cli import add_agent_flags
from caldera.errors import EXIT_FAILED, EXIT_OK, ConfigError, UsageError
from caldera.host.jsonlimits import escape_surrogates, scrub, terminal_safe

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, BinaryIO

    from caldera.agents.adapter.answer import Answer
    from caldera.agents.manifest import Manifest
    from caldera.config import AgentPaths
    from caldera.redact import Redactor

VERB_OF = {"pause": "pause", "resume": "resume", "run-now": "run-now"}


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_agent_flags(parser)
    if name == "settings":
        sub = parser.add_subparsers(dest="action", metavar="get|set")
        sub.required = True
        get = sub.add_parser("get", help="values and the offered (narrowed) bounds")
        _late_agent_flags(get)
        get.add_argument("--json", dest="late_json", action="store_true", default=argparse.SUPPRESS,
                         help="print one JSON object")
        put = sub.add_parser("set", help="KEY=VALUE… or --json '{…}' (all or nothing)")
        _late_agent_flags(put)
        put.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="KEY= unsets a setting")
        put.add_argument("--json", dest="set_json", nargs="?", const=True, default=None, metavar="'{…}'",
                         help="the values as one JSON object (alone: print one JSON object)")
    elif name == "log":
        parser.add_argument("name", nargs="?", metavar="NAME", help="the log to print (its tail); none: list")
        parser.add_argument("--list", action="store_true", help="list the logs (the default), run logs too")
        parser.add_argument("--run", metavar="RUN_ID", help="print a code-agent run's log (its tail)")
        parser.add_argument("--follow", action="store_true", help="with --run: print what the run adds, until it ends")


def _late_agent_flags(parser: argparse.ArgumentParser) -> None:
    # After `get`/`set` too; SUPPRESS keeps a flag given before the action.
    for flag, meta in (("--agent", "NAME"), ("--manifest", "PATH"), ("--state-dir", "DIR")):
        parser.add_argument(flag, metavar=meta, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if args.command == "settings" and args.action == "set":
        _settings_set_args(args)
    if getattr(args, "late_json", False):
        args.json = True
    if args.command == "log" and (args.run is not None or args.follow):
        return run_log(args)
    paths, manifest = load_local(args)
    redactor = local_redactor(paths)
    if manifest.runtime_type == "process":
        from caldera.agents.process.cli import dispatch as process_dispatch  # deferred: adapter verbs never pay

        answer = process_dispatch(args, paths, manifest)
    else:
        answer = _dispatch(args, manifest)
    from caldera.agents.adapter.verbs import redact_answer  # here: `caldera pause --help` does without it

    answer = redact_answer(answer, redactor)
    if answer.verb == "log --list" and answer.ok:
        answer.data = {**(answer.data or {}), "runs": run_logs(paths.state_dir / "logs")}
    return emit(args, answer, redactor)


def _settings_set_args(args: argparse.Namespace) -> None:
    """`--json '{…}'` is the values; `--json` alone (or before KEY=VALUE) is the output format."""
    value = args.set_json
    if isinstance(value, str):
        if value.lstrip().startswith("{"):
            if args.pairs:
                raise UsageError("set takes KEY=VALUE words or --json '{…}', not both")
            args.pairs = [value]
        else:
            args.pairs = [value, *args.pairs]
            args.json = True
    elif value is True:
        args.json = True
    if not args.pairs:
        raise UsageError(f"set takes KEY=VALUE… or --json '{{…}}' (`{again(args, 'settings get')}` lists the keys)")


def load_local(args: argparse.Namespace) -> tuple[AgentPaths, Manifest]:
    """(paths, manifest) for a local verb (adapter: the adapter directly; process: the daemon's socket)."""
    from caldera import config  # here, as the adapter's verbs below
    from caldera.agents.updates import load_effective

    paths = config.agent_from_args(args)
    manifest = load_effective(paths, cache_dir=paths.state_dir / "cache")
    if manifest.runtime_type not in ("adapter", "process"):
        raise ConfigError(f"{paths.manifest_path}: runtime.type: {manifest.runtime_type}: not known here")
    return paths, manifest


def local_redactor(paths: AgentPaths) -> Redactor:
    from caldera import config  # here, as the adapter's verbs below
    from caldera.redact import Redactor

    try:
        return Redactor(config.load_settings(paths).secret_values)
    except PermissionError:
        # A person without rights to secrets.env: the adapter never saw those values
        # either (its environment is built from nothing), and credential shapes are
        # still masked by the Redactor's patterns.
        return Redactor()


def _dispatch(args: argparse.Namespace, manifest: Manifest) -> Answer:
    from caldera.agents.adapter import verbs  # here: `caldera pause --help` does without the adapter's verbs
    if args.command in VERB_OF:
        return verbs.control(manifest, VERB_OF[args.command])
    if args.command == "settings":
        if args.action == "get":
            return verbs.settings_get(manifest)
        from caldera.agents.settings import parse_pairs  # here: only `settings set` needs it

        try:
            values = parse_pairs(args.pairs, manifest.settings_schema)
        except ValueError as exc:
            raise UsageError(f"{exc} (`{again(args, 'settings get')}` shows each setting's type and bounds)") from None
        return verbs.settings_set(manifest, values)
    if args.name is not None and not args.list:
        return verbs.log_get(manifest, args.name)
    return verbs.log_list(manifest)


def again(args: argparse.Namespace, verb: str) -> str:
    """`caldera VERB` for the agent this command named, as the person named it."""
    named = [f"{flag} {value}" for flag, value in (("--agent", getattr(args, "agent", None)),
                                                  ("--manifest", getattr(args, "manifest", None)),
                                                  ("--state-dir", getattr(args, "state_dir", None))) if value]
    return " ".join(["caldera", verb, *named])


def _failure_lines(args: argparse.Namespace, answer: Answer, redactor: Redactor | None) -> list[str]:
    """What a person needs after a failed verb's sentence: the adapter's own last words
    (stderr, redacted, then cut), and after a timeout, that the outcome is not known."""
    from caldera.agents.adapter.answer import FAILED, stderr_excerpt

    lines = []
    if answer.kind == FAILED and answer.returncode is None and "timed out after" in (answer.reason or ""):
        lines.append(f"  the adapter was stopped (TERM, then KILL): whether {answer.verb} took effect is not known; "
                     f"`{again(args, 'status')}` shows the agent's state (runtime.timeout_seconds in the manifest "
                     "sets the limit)")
    shown = stderr_excerpt(answer.stderr, redactor or (lambda text: text)) if answer.stderr else []
    lines.extend(f"  {'adapter stderr:' if n == 0 else '':<16}{line}" for n, line in enumerate(shown))
    return lines


def _told(args: argparse.Namespace, answer: Answer) -> Answer:
    """A refused `log NAME`: the contract's sentence first (seed 000), then the log asked for and
    where the names are."""
    from caldera.agents.adapter.logs import NO_SUCH_LOG

    if answer.verb == "log" and not answer.ok and answer.message == NO_SUCH_LOG:
        answer.message = f"{NO_SUCH_LOG} Asked for {args.name}; `{again(args, 'log')}` lists the agent's logs."
    return answer


def emit(args: argparse.Namespace, answer: Answer, redactor: Redactor | None = None) -> int:
    code = EXIT_OK if answer.ok else EXIT_FAILED
    answer = _told(args, answer)
    if args.json:
        print(_json_line(args, answer, redactor))
        return code
    if not answer.ok:
        print(scrub(answer.message or ""), file=sys.stderr)
        for line in _failure_lines(args, answer, redactor):
            print(line, file=sys.stderr)
        return code
    data = answer.data or {}
    if answer.verb == "settings get":
        print(scrub(format_settings(data)))
    elif answer.verb == "log --list":
        # file names: anyone who could write in the logs directory chose them
        print(terminal_safe(scrub("\n".join(data["logs"]) if data.get("logs") else answer.message or "")))
        if data.get("runs"):
            print(f"run logs, newest first (`{again(args, 'log')} --run RUN_ID`):")
            print(terminal_safe(scrub("\n".join(f"  {run}" for run in data["runs"]))))
    elif answer.verb == "log":
        sys.stdout.write(answer.text or "")
        if answer.text and not answer.text.endswith("\n"):
            sys.stdout.write("\n")
    else:
        print(scrub(answer.message or ""))
    return code


def _json_line(args: argparse.Namespace, answer: Answer, redactor: Redactor | None = None) -> str:
    """`--json`'s one object; data passes JSON-escaped (a lone surrogate as \\udXXX), so printing never fails.
    A failed verb adds `adapter_stderr`: the end of what the adapter wrote there (redacted, then cut)."""
    payload = answer.payload()
    if not answer.ok and answer.stderr:
        from caldera.agents.adapter.answer import stderr_excerpt

        payload["adapter_stderr"] = stderr_excerpt(answer.stderr, redactor or (lambda text: text))
    if answer.ok and answer.data is not None and answer.verb in ("settings get", "log --list"):
        payload.update(answer.data)
    if answer.ok and answer.verb == "log":
        payload.update({"name": args.name, "text": answer.text, "truncated": answer.truncated})
    return escape_surrogates(json.dumps(payload, ensure_ascii=False))


def format_settings(data: dict[str, Any]) -> str:
    if not data.get("schema"):
        return "This agent declares no settings."
    rows = []
    for item in data["schema"]:
        value = data["values"].get(item["key"])
        rows.append((item["key"], _show(item, value), _bounds(item), item.get("label", "")))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{k:<{widths[0]}}  {v:<{widths[1]}}  {b:<{widths[2]}}  {label}".rstrip()
                     for k, v, b, label in rows)


def _show(item: dict[str, Any], value: object) -> str:
    if value is None:
        return "(unset)"
    if item["type"] == "percent" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value * 100:g} %"
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


def _bounds(item: dict[str, Any]) -> str:
    kind = item["type"]
    if kind == "enum":
        return "one of " + ", ".join(item.get("options", []))
    low, high = item.get("min"), item.get("max")
    if low is None and high is None:
        return kind
    fmt = (lambda v: f"{v * 100:g} %") if kind == "percent" else (lambda v: f"{v:g}")
    return f"{kind} {fmt(low) if low is not None else '…'} to {fmt(high) if high is not None else '…'}"


# ---- run logs (code-agent turns) ------------------------------------------------------------------

RUN_LOGS_LISTED = 50
RUN_TAIL_BYTES = 1024 * 1024  # what `log --run` prints of a longer log: its end (as `log NAME`)
RUN_LINE_MAX = 256 * 1024  # a longer line (a backend's stdout can be 32 MiB) is printed in pieces
FOLLOW_POLL = 0.25
FOLLOW_QUIET_AFTER_END = 1.0  # seconds without growth after the terminal event: the run log is done
FOLLOW_QUIET_MAX = 30 * 60.0  # seconds without growth and no terminal event: the runtime died; stop
EXIT_INTERRUPTED = 130  # as `caldera plane run`: stopped by a signal, not by the run's end


def run_logs(logs_dir: Path) -> list[str]:
    """The run ids of the newest run logs in `logs_dir`, newest first (at most RUN_LOGS_LISTED)."""
    try:
        entries = [(entry.stat().st_mtime, entry.name[4:-4]) for entry in os.scandir(logs_dir)
                   if entry.name.startswith("run-") and entry.name.endswith(".log") and entry.is_file()]
    except FileNotFoundError:
        return []
    return [run_id for _, run_id in sorted(entries, reverse=True)[:RUN_LOGS_LISTED]]


def run_log(args: argparse.Namespace) -> int:
    """`log --run RUN_ID [--follow]`: the run log's tail, redacted; with --follow what it adds until the
    run's terminal event (and a quiet second after it), FOLLOW_QUIET_MAX without growth, or a
    signal (exit 130). Opened without following a symlink and only as a regular file: as root,
    a link planted in the agent's logs directory must not print /etc/shadow or read /dev/zero."""
    from caldera import config
    from caldera.backends.runlog import log_path

    if args.run is None:
        raise UsageError("--follow goes with --run RUN_ID")
    if args.name is not None or args.list:
        raise UsageError("--run RUN_ID prints a run's log: give no log NAME or --list with it")
    paths = config.agent_from_args(args)
    try:
        path = log_path(paths.state_dir / "logs", args.run)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    redactor = local_redactor(paths)
    try:
        fh = _open_run_log(path)
    except FileNotFoundError:
        print(f"There is no run log for {args.run}; `{again(args, 'log')} --list` names the run logs.",
              file=sys.stderr)
        return EXIT_FAILED
    except OSError:
        print(f"{terminal_safe(str(path))} is not a regular file (a symlink, a device or a directory): "
              "a run log is never read through one", file=sys.stderr)
        return EXIT_FAILED
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size > RUN_TAIL_BYTES:
            fh.seek(size - RUN_TAIL_BYTES)
            fh.readline()  # from a whole line on
            print(f"(the first {fh.tell()} bytes of {path} are not shown)")
        ended = _print_lines(fh, redactor)
        if args.follow and not _follow_run_log(fh, redactor, ended):
            return EXIT_INTERRUPTED
    return EXIT_OK


def _open_run_log(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file reached without a symlink; else OSError
    (FileNotFoundError when there is nothing)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def _print_lines(fh: BinaryIO, redactor: Redactor) -> bool:
    """Print the whole lines left in `fh` (a partial last line waits); whether the run's end was among them."""
    ended = False
    lines = []
    while True:
        start = fh.tell()
        line = fh.readline(RUN_LINE_MAX)
        if not line.endswith(b"\n") and len(line) < RUN_LINE_MAX:
            fh.seek(start)
            break
        text = terminal_safe(scrub(line.decode("utf-8", "replace").rstrip("\n")))
        lines.append(text)
        ended = ended or (" event " in text and '"type":"terminal_status"' in text)
    if lines:
        sys.stdout.write(redactor.text_lines(lines) + "\n")
        sys.stdout.flush()
    return ended


def _follow_run_log(fh: BinaryIO, redactor: Redactor, ended: bool) -> bool:
    """False when a signal stopped the following, True when the run log is done (or went quiet)."""
    from caldera.host.stopsignals import stop_on_signals

    stop = threading.Event()
    restore = stop_on_signals(stop) if threading.current_thread() is threading.main_thread() else None
    try:
        quiet = 0.0
        while not stop.wait(FOLLOW_POLL):
            before = fh.tell()
            ended = _print_lines(fh, redactor) or ended
            quiet = quiet + FOLLOW_POLL if fh.tell() == before else 0.0
            if ended and quiet >= FOLLOW_QUIET_AFTER_END:
                return True
            if quiet >= FOLLOW_QUIET_MAX:
                print(f"caldera log: the run log did not grow for {FOLLOW_QUIET_MAX / 60:.0f} minutes and has no "
                      "end of the run: stopped following", file=sys.stderr)
                return True
        return False
    finally:
        if restore is not None:
            restore()
