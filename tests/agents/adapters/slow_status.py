#!/usr/bin/env python3
"""status takes 30 s unless a file named `fast` is in its workdir."""
import json
import os
import sys
import time

if sys.argv[1:] == ["status"]:
    if not os.path.exists("fast"):
        with open("status-started", "w") as fh:
            fh.write(str(time.time()))
        time.sleep(30)
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
else:
    sys.exit(2)
