"""An adapter whose status level is whatever the file `level` in its workdir says (ok when absent)."""
import json
import os
import sys

verb = sys.argv[1] if len(sys.argv) > 1 else ""
if verb == "status":
    level = open("level").read().strip() if os.path.exists("level") else "ok"
    print(json.dumps({"state": {"level": level, "label": level.title()}}))
elif verb == "settings" and sys.argv[2:3] == ["get"]:
    print(json.dumps({"values": {"max_7d": 0.5}}))
else:
    sys.exit(2)
