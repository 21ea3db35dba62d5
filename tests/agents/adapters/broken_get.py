"""settings get crashes, and settings set silently clamps: the set probes must still run."""
import json
import sys

verb = sys.argv[1:3]
if verb[:1] == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
elif verb == ["settings", "get"]:
    sys.exit(3)
elif verb == ["settings", "set"]:
    print(json.dumps({"message": "Saved."}))  # takes anything: a breach
else:
    sys.exit(2)
