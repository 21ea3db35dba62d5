#!/usr/bin/env python3
"""inbox-watcher: a small process-mode agent for caldera (stdlib only).

Every `interval_seconds` (and at once on SIGUSR1, caldera's run-now) it takes the
files in <state>/inbox, writes each one's SHA-256 into <state>/processed/index.tsv
and moves it to <state>/processed/. It writes its status file (state, gauges, runs,
its version) after every change, re-reads settings.json on SIGHUP (caldera sends it
after `settings set`) and ends cleanly on SIGTERM. Everything it needs comes from the
environment caldera builds: CALDERA_AGENT_STATE_DIR and CALDERA_SETTINGS_FILE.
"""
import datetime as dt
import hashlib
import json
import os
import signal
import sys
import threading

VERSION = "1.0.0"
STATE = os.environ.get("CALDERA_AGENT_STATE_DIR", os.path.abspath("data"))
SETTINGS = os.environ.get("CALDERA_SETTINGS_FILE", os.path.join(STATE, "settings.json"))
INBOX = os.path.join(STATE, os.environ.get("WATCHER_INBOX_NAME", "inbox"))
DONE = os.path.join(STATE, "processed")
LOGS = os.path.join(STATE, "logs")  # the manifest's `logs: logs`, relative to its `state`
wake = threading.Event()
stopping = threading.Event()
runs = []  # the last runs, newest last (the status file keeps 10)
settings = {}
since = dt.datetime.now(dt.UTC)


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def say(text: str) -> None:
    print(f"{now()} {text}", flush=True)  # stdout: caldera keeps it in agent.log


def load_settings() -> None:
    global settings
    try:
        with open(SETTINGS) as fh:
            loaded = json.load(fh)
    except (OSError, ValueError):
        loaded = {}
    settings = {"interval_seconds": 30, "max_inbox_mb": 100, **{k: v for k, v in loaded.items() if v is not None}}


def inbox_files() -> list:
    try:
        return sorted(e for e in os.scandir(INBOX) if e.is_file(follow_symlinks=False))
    except FileNotFoundError:
        return []


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def process(reason: str) -> None:
    started, moved, failed = now(), 0, 0
    os.makedirs(DONE, exist_ok=True)
    for entry in inbox_files():
        try:
            line = f"{now()}\t{entry.name}\t{entry.stat().st_size}\t{sha256(entry.path)}\n"
            os.replace(entry.path, os.path.join(DONE, entry.name))
            with open(os.path.join(DONE, "index.tsv"), "a") as fh:
                fh.write(line)
            moved += 1
        except OSError as exc:
            failed += 1
            say(f"could not process {entry.name}: {exc}")
    outcome = "failed" if failed else "ok"
    runs.append({"id": len(runs) + 1, "title": f"{reason}: {moved} file(s) indexed", "started_at": started,
                 "finished_at": now(), "outcome": outcome, "log": "watcher.log"})
    del runs[:-10]
    with open(os.path.join(LOGS, "watcher.log"), "a") as fh:
        fh.write(f"{now()} run ({reason}): {moved} moved, {failed} failed\n")
    if moved or failed:
        say(f"run ({reason}): {moved} moved, {failed} failed")


def write_status() -> None:
    files = inbox_files()
    size = sum(e.stat().st_size for e in files)
    limit = settings["max_inbox_mb"] * 1024 * 1024
    level = "warn" if size >= limit else "ok"
    body = {
        "state": {"level": level, "label": "Inbox full" if level == "warn" else "Watching",
                  "since": since.strftime("%Y-%m-%dT%H:%M:%SZ")},
        "detail": settings.get("paused_note") or f"{len(files)} file(s) waiting in {INBOX}",
        "gauges": [{"name": "inbox", "used": min(1.0, size / limit), "label": f"{size // 1024} KiB"},
                   {"name": "files waiting", "used": min(1.0, len(files) / 100), "label": f"{len(files)} of 100"}],
        "runs": runs[-10:],
        "agent": {"version": VERSION},
        "next_run": {"at": f"in {int(settings['interval_seconds'])} s", "reason": "timer"},
    }
    tmp = os.path.join(STATE, ".status.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(body, fh)
    os.replace(tmp, os.path.join(STATE, "status.json"))  # atomic: caldera never reads half a file


def later(*steps) -> None:
    """Run `steps` in order, outside the signal handler that calls this."""
    threading.Thread(target=lambda: [step() for step in steps], daemon=True).start()


def main() -> int:
    os.makedirs(INBOX, exist_ok=True)
    os.makedirs(LOGS, exist_ok=True)
    load_settings()
    # A handler runs in the main thread between two bytecodes, maybe while it holds an
    # Event's lock inside wait(): setting the Event right there could wait forever. So the
    # handlers hand the work to a short-lived thread.
    signal.signal(signal.SIGUSR1, lambda *_: later(lambda: setattr(wake, "reason", "run now"), wake.set))
    signal.signal(signal.SIGHUP, lambda *_: later(load_settings, lambda: say("settings re-read"), wake.set))
    signal.signal(signal.SIGTERM, lambda *_: later(stopping.set, wake.set))
    say(f"inbox-watcher {VERSION} watching {INBOX}")
    write_status()
    while not stopping.is_set():
        wake.wait(settings["interval_seconds"])
        if stopping.is_set():
            break
        reason = getattr(wake, "reason", "timer") if wake.is_set() else "timer"
        wake.clear()
        wake.reason = "timer"
        process(reason)
        write_status()
    say("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
