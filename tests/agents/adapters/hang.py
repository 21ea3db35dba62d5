#!/usr/bin/env python3
"""Hangs in every verb, with a child in its process group that must die with it."""
import subprocess
import time

child = subprocess.Popen(["sleep", "3600"])
with open("child.pid", "w") as fh:
    fh.write(str(child.pid))
time.sleep(3600)
