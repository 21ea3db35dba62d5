#!/usr/bin/env python3
"""Answers settings set with exit 1 (refused); records calls."""
import json
import sys

argv = sys.argv[1:]
with open("calls.log", "a") as fh:
    fh.write(json.dumps(argv) + "\n")
if argv[:2] == ["settings", "get"]:
    print(json.dumps({"values": {"max_7d": 0.75}}))
elif argv[:2] == ["settings", "set"]:
    print(json.dumps({"message": "the agent is mid-run; try again later"}))
    sys.exit(1)
else:
    sys.exit(2)
