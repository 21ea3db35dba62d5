#!/usr/bin/env python3
"""Writes its whole environment and working directory to env.json, then answers."""
import json
import os
import sys

with open("env.json", "w") as fh:
    json.dump({"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv[1:]}, fh)
detail = " ".join(f"{k}={v}" for k, v in os.environ.items())
print(json.dumps({"state": {"level": "ok", "label": "Ready"}, "detail": detail}))
