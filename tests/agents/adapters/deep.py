"""A hostile adapter: every verb prints 20,000 nested arrays, until the file `fixed` exists."""
import json
import os
import sys

if os.path.exists("fixed"):
    if sys.argv[1:2] == ["status"]:
        print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
    else:
        print(json.dumps({"message": "Done."}))
else:
    sys.stdout.write("[" * 20000 + "]" * 20000)
