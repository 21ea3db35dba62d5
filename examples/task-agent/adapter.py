#!/usr/bin/env python3
"""The task agent's caldera adapter: one verb per call, one JSON object on stdout,
diagnostics on stderr, exit 0 done / 1 refused / 2 unknown verb.

It reads and writes only the agent's own files (taskagent.py), answers status
from them (no other service is asked, so it is fast), and is safe even if a
manifest allowed everything: its own bounds are checked on every set.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import taskagent as ta  # noqa: E402

LOG_TAIL = 256 * 1024


def say(message, held=None, code=0):
    print(json.dumps({"message": message, **({"held": held} if held else {})}))
    sys.exit(code)


def status():
    now = ta.time.time()
    held = ta.held(now)
    used, resets = ta.week_used(now)
    paused = "paused" in held
    if paused:
        state = {"level": "warn", "label": "Paused", "since": ta.since("paused")}
    elif held:
        state = {"level": "warn", "label": "Held: " + "; ".join(held)}
    else:
        state = {"level": "ok", "label": "Ready"}
    limit = ta.settings()["max_7d"]
    gauge = {"name": "Week", "used": round(used, 4), "label": f"{used:.0%} of the {limit:.0%} weekly limit"}
    if resets:
        gauge["resets_at"] = ta.now_iso(resets)
    runs = [{k: r[k] for k in ("id", "title", "started_at", "finished_at", "outcome", "log")}
            for r in reversed(ta.runs()[-10:])]
    body = {"state": {k: v for k, v in state.items() if v is not None}, "gauges": [gauge], "runs": runs,
            "agent": {"version": ta.VERSION}, "held": held, "health": timer_health(now)}
    if not held:
        reason = "requested" if ta.exists("run-now") else "timer"
        body["next_run"] = {"at": ta.now_iso(ta.next_run_at(now)), "reason": reason}
    print(json.dumps(body))


def timer_health(now):
    tick = ta.read_json("tick", None)
    if tick is None:
        return [{"name": "Timer", "level": "warn", "reason": "the timer has not run yet (python3 agent.py)"}]
    age = now - tick["ts"]
    if age > 120:
        return [{"name": "Timer", "level": "warn", "reason": f"the timer last looked {age / 60:.0f} min ago"}]
    return [{"name": "Timer", "level": "ok", "reason": "looking every 5 s"}]


def resume():
    was_paused = ta.remove("paused")
    held = ta.held()
    if not was_paused:
        message = "Not paused."
    elif held:
        message = "Pause lifted, but no run starts: " + "; ".join(held) + "."
    else:
        message = "Pause lifted."
    say(message, held)


def run_now():
    if not ta.tasks():
        say("Nothing to run: the task list is empty.", code=1)
    ta.touch("run-now", ta.now_iso())
    held = ta.held()
    say("Requested, but held." if held else "Requested; the timer starts it within 5 s.", held)


def settings_get():
    values = ta.settings()
    print(json.dumps({"values": {k: values.get(k) for k in ta.DEFAULTS}, "bounds": ta.BOUNDS}))


def setting_problem(key, value):
    if key not in ta.DEFAULTS:
        return f"{key}: not a setting of the task agent"
    if value is None:
        return None
    if key == "note":
        if isinstance(value, str) and len(value) <= ta.NOTE_MAX:
            return None
        return f"note: a text of at most {ta.NOTE_MAX} characters"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key}: must be a number"
    if key == "interval_minutes" and not isinstance(value, int):
        return "interval_minutes: must be a whole number"
    low, high = ta.BOUNDS[key]["min"], ta.BOUNDS[key]["max"]
    if not low <= value <= high:
        # Refuse, never clamp: the person must learn the value was not taken.
        return f"{key}: {value} is outside {low} to {high}"
    return None


def settings_set(argv):
    if len(argv) != 1 or len(argv[0].encode()) > 8192:
        say("settings set takes one JSON object of at most 8 KiB.", code=1)
    try:
        wanted = json.loads(argv[0])
    except ValueError as exc:
        say(f"not valid JSON: {exc}", code=1)
    if not isinstance(wanted, dict) or not wanted:
        say("settings set takes one JSON object of key: value.", code=1)
    for key, value in wanted.items():
        problem = setting_problem(key, value)
        if problem:
            say(problem, code=1)  # all or nothing: nothing was written
    current = ta.read_json("settings.json", {})
    for key, value in wanted.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    ta.write_json("settings.json", current)
    say("Saved; the next run uses it.")


def log(argv):
    if argv == ["--list"]:
        print(json.dumps({"logs": [{"name": n} for n in ta.logs()[:50]]}))
        return
    if len(argv) != 1 or not ta.LOG_RE.match(argv[0]):
        say("There is no such log.", code=1)  # a path, or any name that is not ours
    file = os.path.join(ta.path("logs"), argv[0])
    try:
        with open(file, "rb") as fh:
            fh.seek(max(0, os.path.getsize(file) - LOG_TAIL))
            sys.stdout.buffer.write(fh.read())
    except FileNotFoundError:
        say("There is no such log.", code=1)


def main(argv):
    verb, rest = (argv[0], argv[1:]) if argv else ("", [])
    if verb == "status" and not rest:
        status()
    elif verb == "pause" and not rest:
        already = ta.exists("paused")
        ta.touch("paused", ta.now_iso())
        say("Already paused." if already else "Paused.")
    elif verb == "resume" and not rest:
        resume()
    elif verb == "run-now" and not rest:
        run_now()
    elif verb == "settings" and rest == ["get"]:
        settings_get()
    elif verb == "settings" and rest[:1] == ["set"]:
        settings_set(rest[1:])
    elif verb == "log" and rest:
        log(rest)
    else:
        print(f"unknown verb: {' '.join(argv)!r}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
