"""A process-mode agent for tests. argv[1] is the behaviour:

run        write the status file, count SIGUSR1 runs and SIGHUPs in it, exit 0 on SIGTERM
crash      exit 3 at once
clean      exit 0 at once
stubborn   ignore SIGTERM, start a grandchild that ignores it too, record its pid
env        write the environment to $CALDERA_AGENT_STATE_DIR/env.json, then run
flood      print lines as fast as possible until killed
orphans    leave grandchildren behind (each helper starts one and exits at once; the grandchild
           records its parent after the helper is gone, then ends), then run
"""
import json
import os
import signal
import subprocess
import sys
import time

mode = sys.argv[1]
state = os.environ.get("CALDERA_AGENT_STATE_DIR", ".")
counts = {"runs": 0, "hups": 0}


def write_status():
    body = {"state": {"level": "ok", "label": f"Idle, {counts['runs']} runs"},
            "gauges": [{"name": "runs", "used": min(1.0, counts["runs"] / 10)}],
            "agent": {"version": "fake-2.0"}, "detail": f"hups={counts['hups']}", "junk": "dropped"}
    tmp = os.path.join(state, ".status.tmp")
    with open(tmp, "w") as fh:
        json.dump(body, fh)
    os.replace(tmp, os.path.join(state, "status.json"))


def on_usr1(*_):
    counts["runs"] += 1
    write_status()


def on_hup(*_):
    counts["hups"] += 1
    write_status()


if mode == "crash":
    print("crashing", flush=True)
    sys.exit(3)
if mode == "clean":
    sys.exit(0)
if mode == "flood":
    line = b"x" * 200 + b"\n"
    out = sys.stdout.buffer
    while True:
        out.write(line * 50)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    with open(os.path.join(state, "grandchild.pid"), "w") as fh:
        fh.write(str(child.pid))
    with open(os.path.join(state, "ready"), "w") as fh:
        fh.write(str(os.getpid()))
    while True:
        time.sleep(1)
if mode == "env":  # atomically: the test reads it as soon as it exists
    with open(os.path.join(state, ".env.json.tmp"), "w") as fh:
        json.dump(dict(os.environ), fh)
    os.replace(os.path.join(state, ".env.json.tmp"), os.path.join(state, "env.json"))
if mode == "orphans":
    grandchild = ("import os, sys, time; time.sleep(0.5); "
                  "open(sys.argv[1], 'w').write(str(os.getppid())); time.sleep(0.3)")
    helper = ("import subprocess, sys; "
              f"print(subprocess.Popen([sys.executable, '-c', {grandchild!r}, sys.argv[1]]).pid)")
    orphans = []
    for n in range(3):
        record = os.path.join(state, f"orphan-{n}.ppid")
        out = subprocess.run([sys.executable, "-c", helper, record], capture_output=True, text=True, check=True)
        orphans.append({"pid": int(out.stdout), "record": record})
    with open(os.path.join(state, ".orphans.tmp"), "w") as fh:
        json.dump(orphans, fh)
    os.replace(os.path.join(state, ".orphans.tmp"), os.path.join(state, "orphans.json"))
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGHUP, on_hup)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("agent up", os.getpid(), flush=True)
write_status()
while True:
    time.sleep(0.2)
