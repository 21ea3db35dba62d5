#!/usr/bin/env python3
"""Exits 0 after failing: takes any settings (clamping them), any log name, any verb."""
import json
import os
import sys

argv = sys.argv[1:]
if argv[:1] == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
elif argv[:2] == ["settings", "get"]:
    value = json.load(open("settings.json"))["max_7d"] if os.path.exists("settings.json") else 0.5
    print(json.dumps({"values": {"max_7d": value}, "bounds": {"max_7d": {"min": 0.1, "max": 0.95}}}))
elif argv[:2] == ["settings", "set"]:
    try:
        wanted = json.loads(argv[2])
        value = wanted.get("max_7d")
        if value is not None:
            value = min(max(value, 0.1), 0.95)  # silent clamping
        with open("settings.json", "w") as fh:
            json.dump({"max_7d": value}, fh)
        print(json.dumps({"message": "Saved."}))
    except Exception as exc:
        print(f"error: {exc}")  # a failure on stdout, and exit 0
elif argv[:2] == ["log", "--list"]:
    print(json.dumps({"logs": []}))
elif argv[:1] == ["log"]:
    print(f"contents of {argv[1]}")  # a path is accepted
else:
    print(json.dumps({"message": "ok"}))  # exit 0 for a verb it does not know
