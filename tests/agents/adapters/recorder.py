#!/usr/bin/env python3
"""A well-behaved adapter that records every call (argv) in calls.log in its workdir."""
import json
import os
import sys

BOUNDS = {"max_7d": {"min": 0.1, "max": 0.95}}


def say(message, held=None, code=0):
    print(json.dumps({"message": message, **({"held": held} if held else {})}))
    sys.exit(code)


def main(argv):
    with open("calls.log", "a") as fh:
        fh.write(json.dumps(argv) + "\n")
    verb, rest = (argv[0], argv[1:]) if argv else ("", [])
    if verb == "status":
        print(json.dumps({"state": {"level": "ok", "label": "Ready"}, "extra": "dropped"}))
    elif verb == "pause":
        open("paused", "w").close()
        say("Paused.")
    elif verb == "resume":
        say("Pause lifted. Alex is working in a session, so no run starts.",
            ["Alex is working in a session", "weekly limit reached"])
    elif verb == "run-now":
        if os.path.exists("nothing-to-run"):
            say("Nothing to run.", code=1)
        say("Requested, but held.", ["paused"])
    elif verb == "settings" and rest == ["get"]:
        values = json.load(open("settings.json")) if os.path.exists("settings.json") else {"max_7d": 0.75}
        print(json.dumps({"values": values, "bounds": BOUNDS}))
    elif verb == "settings" and rest[:1] == ["set"]:
        wanted = json.loads(rest[1])
        for key, value in wanted.items():
            if key != "max_7d" or not 0.1 <= value <= 0.95:
                say(f"{key}: not allowed.", code=1)
        with open("settings.json.tmp", "w") as fh:
            json.dump(wanted, fh)
        os.replace("settings.json.tmp", "settings.json")
        say("Saved.")
    elif verb == "log" and rest == ["--list"]:
        print(json.dumps({"logs": [{"name": "run-20261003-124101.log"}, {"name": "../bad"}]}))
    elif verb == "log" and rest == ["run-20261003-124101.log"]:
        sys.stdout.write("line\n" * 3)
    elif verb == "log":
        say("There is no such log.", code=1)
    else:
        sys.exit(2)


main(sys.argv[1:])
