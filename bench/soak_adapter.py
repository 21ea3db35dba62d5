#!/usr/bin/env python3
"""The soak's adapter (bench/soak.py): one verb per call, as docs/adapter.md says, in the
mood the soak wrote into `mood` in its working directory.

    normal   answers at once
    slow     answers after 1.5 s (well inside the manifest's timeout)
    hang     sleeps far past the manifest's timeout (the runtime must kill it)
    garbage  prints bytes that are no JSON object, exit 0
    exit1    refuses: exit 1 with a sentence naming the mood

Each call appends one line to `calls.log` (time, pid, verb, mood) so the soak can tell
afterwards what the adapter did and when. Its own state (paused, settings) lives in the
working directory too; the adapter's environment is the runtime's fixed one, so nothing
but the working directory can carry the mood.
"""
import json
import os
import sys
import time

MOODS = ("normal", "slow", "hang", "garbage", "exit1")
BOUNDS = {"limit": {"min": 0.1, "max": 0.9}}  # the agent's own bound: narrower than the manifest's
DEFAULTS = {"limit": 0.5, "interval": 60, "note": ""}
LOG_NAME = "soak.log"


def mood() -> str:
    try:
        with open("mood", encoding="utf-8") as fh:
            word = fh.read().strip()
    except OSError:
        return "normal"
    return word if word in MOODS else "normal"


def record(verb: str, felt: str) -> None:
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "verb": verb, "mood": felt})
    with open("calls.log", "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def answer(doc: dict, code: int = 0) -> None:
    print(json.dumps(doc))
    sys.exit(code)


def settings() -> dict:
    try:
        with open("settings.json", encoding="utf-8") as fh:
            return {**DEFAULTS, **json.load(fh)}
    except (OSError, ValueError):
        return dict(DEFAULTS)


def write(name: str, text: str) -> None:
    tmp = f".{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, name)


def status() -> None:
    paused = os.path.exists("paused")
    state = {"level": "warn", "label": "Paused"} if paused else {"level": "ok", "label": "Ready"}
    answer({"state": state, "gauges": [{"name": "Limit", "used": settings()["limit"], "label": "soak"}],
            "agent": {"version": "soak-1"}})


def settings_set(argv: list) -> None:
    try:
        wanted = json.loads(argv[0]) if len(argv) == 1 else None
    except ValueError:
        wanted = None
    if not isinstance(wanted, dict) or not wanted:
        answer({"message": "settings set takes one JSON object."}, 1)
    for key, value in wanted.items():
        if key not in DEFAULTS:
            answer({"message": f"{key}: not a setting of the soak agent"}, 1)
        if key in BOUNDS and value is not None and not BOUNDS[key]["min"] <= value <= BOUNDS[key]["max"]:
            answer({"message": f"{key}: {value} is outside the soak agent's bounds"}, 1)
    current = {**settings(), **wanted}
    write("settings.json", json.dumps(current))
    answer({"message": "Saved."})


def verb(argv: list) -> None:
    words = argv[:2] if argv[:1] in (["settings"], ["log"]) else argv[:1]
    rest = argv[len(words):]
    name = " ".join(words)
    if name == "status":
        status()
    elif name == "pause":
        write("paused", "1")
        answer({"message": "Paused."})
    elif name == "resume":
        if os.path.exists("paused"):
            os.unlink("paused")
        answer({"message": "Pause lifted."})
    elif name == "run-now":
        answer({"message": "Requested."})
    elif name == "settings get":
        answer({"values": settings(), "bounds": BOUNDS})
    elif name == "settings set":
        settings_set(rest)
    elif name == "log --list":
        answer({"logs": [LOG_NAME]})
    elif name.startswith("log "):
        if argv[1] != LOG_NAME:
            answer({"message": "There is no such log."}, 1)
        sys.stdout.write("soak log line\n" * 20)
        sys.exit(0)
    else:
        sys.stderr.write(f"{name}: not supported\n")
        sys.exit(2)


def main() -> None:
    argv = sys.argv[1:]
    felt = mood()
    record(" ".join(argv[:2]), felt)
    if felt == "slow":
        time.sleep(1.5)
    elif felt == "hang":
        time.sleep(3600)  # the runtime's timeout kills the whole process group
    elif felt == "garbage":
        sys.stdout.write("}{ soak garbage \x01\x02 not json [[[\n")
        sys.exit(0)
    elif felt == "exit1":
        answer({"message": "The soak adapter refused: it is in its exit-1 mood."}, 1)
    verb(argv)


if __name__ == "__main__":
    main()
