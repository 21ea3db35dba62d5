"""A careless adapter: lone surrogates (valid JSON escapes, not characters) everywhere, and
it records the argv it was given (as bytes, hex) in argv.log."""
import json
import sys

with open("argv.log", "a") as fh:
    fh.write(json.dumps([a.encode("utf-8", "surrogateescape").hex() for a in sys.argv[1:]]) + "\n")
verb = sys.argv[1:3]
if verb[:1] == ["status"]:
    sys.stdout.write('{"state": {"level": "warn", "label": "Odd \\ud800 label"}, "detail": "x\\udfff",'
                     ' "held": ["\\ud83d"]}')
elif verb == ["settings", "get"]:
    sys.stdout.write('{"values": {"note": "\\ud800"}}')
elif verb == ["settings", "set"]:
    sys.stdout.write('{"message": "Saved \\udc80."}')
elif verb == ["log", "--list"]:
    sys.stdout.write('{"logs": [{"name": "bad\\ud800.log"}, {"name": "good.log"}]}')
elif verb[:1] == ["pause"]:
    sys.stdout.write('{"message": "Paused \\ud800.", "held": ["\\udfff"]}')
else:
    sys.exit(2)
