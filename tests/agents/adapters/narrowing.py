"""An adapter that narrows min 0.1 to 0.12 and records the raw bytes of each `settings set` argument."""
import json
import sys

verb = sys.argv[1:3]
if verb == ["settings", "get"]:
    print(json.dumps({"values": {"max_7d": 0.5, "note": None}, "bounds": {"max_7d": {"min": 0.12}}}))
elif verb == ["settings", "set"]:
    with open("set.log", "ab") as fh:
        fh.write(sys.argv[3].encode("utf-8", "surrogateescape") + b"\n")
    print(json.dumps({"message": "Saved."}))
elif verb[:1] == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
else:
    sys.exit(2)
