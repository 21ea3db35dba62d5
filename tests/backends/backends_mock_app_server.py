#!/usr/bin/env python3
"""A scripted stand-in for `codex app-server` (JSON lines over stdio), for T1/T2.

Usage: backends_mock_app_server.py --script FILE app-server
The script (JSON) says what to do:
  "exit_before_init": RC        print a usage line to stderr and exit RC at once
  "late_stderr": S              with exit_before_init: close stdout, print the usage line
                                S s later and exit (EOF comes before the reason)
  "stderr": [lines]             written to stderr at start
  "initialize": {...}|"error"|"no_result"   the initialize answer (default: a normal result)
  "thread_start": same shape    the thread/start answer
  "turn_start": same shape      the turn/start answer
  "on_turn": [steps]            after turn/start; a step is a message to send (strings
                                "$THREAD", "$TURN" and "$ENV:NAME" are substituted) or
                                ("$NOW": the Unix time as the step is sent)
                                {"raw": line} | {"exit": rc} | {"sleep": s} |
                                {"exit": rc, "late_stderr": [s, line]} (close stdout,
                                write line to stderr s later, exit) |
                                {"request": msg} (wait for the reply, then send it back
                                as an agentMessage) | {"wait_interrupt": true}
  "interrupt": "honor" (default) | "ignore"
It also writes what it received to "$MOCK_LOG" when that variable is set.
"""
import json
import os
import re
import sys
import time

THREAD, TURN = "thr_1", "turn_1"


def send(obj):
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()


def subst(value):
    if isinstance(value, str):
        value = re.sub(r"\$ENV:([A-Za-z_][A-Za-z0-9_]*)", lambda m: os.environ.get(m.group(1), ""), value)
        value = value.replace("$THREAD", THREAD).replace("$TURN", TURN)
        return value.replace("$NOW", repr(time.time())) if "$NOW" in value else value
    if isinstance(value, list):
        return [subst(v) for v in value]
    if isinstance(value, dict):
        return {k: subst(v) for k, v in value.items()}
    return value


def answer(req, spec, default):
    if spec == "error":
        send({"id": req["id"], "error": {"code": -32600, "message": "failed to load configuration: x:3:29"}})
    elif spec == "no_result":
        send({"id": req["id"]})
    else:
        send({"id": req["id"], "result": spec if isinstance(spec, dict) else default})


def completed(status, error=None):
    send({"method": "turn/completed", "params": {"threadId": THREAD, "turn": {
        "id": TURN, "status": status, "error": error, "items": []}}})


def read_message():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    msg = json.loads(line)
    log = os.environ.get("MOCK_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps(msg) + "\n")
    return msg


def late_stderr(delay, text):
    """Close stdout and explain on stderr later: the runtime sees the EOF before the reason
    (as a loaded machine can). Written by this process before it exits, not by a child after:
    in caldera's bubblewrap (a pid namespace) a child ends with the app-server."""
    sys.stdout.flush()
    os.close(1)
    time.sleep(delay)
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def run_turn(script):
    for step in script.get("on_turn", []):
        if isinstance(step, dict) and "raw" in step:
            send(step["raw"])
        elif isinstance(step, dict) and "exit" in step:
            if "late_stderr" in step:
                late_stderr(*step["late_stderr"])
            sys.exit(step["exit"])
        elif isinstance(step, dict) and "sleep" in step:
            time.sleep(step["sleep"])
        elif isinstance(step, dict) and "request" in step:
            send(subst(step["request"]))
            reply = read_message()
            send({"method": "item/completed", "params": {"threadId": THREAD, "turnId": TURN, "item": {
                "type": "agentMessage", "id": "msg_reply", "text": json.dumps(reply)}}})
        elif isinstance(step, dict) and step.get("wait_interrupt"):
            return wait_interrupt(script)
        else:
            send(subst(step))


def wait_interrupt(script):
    while True:
        msg = read_message()
        if msg.get("method") == "turn/interrupt":
            send({"id": msg["id"], "result": {}})
            if script.get("interrupt", "honor") == "honor":
                completed("interrupted")


def main():
    path = sys.argv[sys.argv.index("--script") + 1]
    with open(path) as fh:
        script = json.load(fh)
    for line in script.get("stderr", []):
        sys.stderr.write(subst(line) + "\n")
        sys.stderr.flush()
    if "exit_before_init" in script:
        usage = "error: unexpected argument found\n\nUsage: codex app-server [OPTIONS]"
        if "late_stderr" in script:
            late_stderr(script["late_stderr"], usage)
        else:
            sys.stderr.write(usage + "\n")
        sys.exit(script["exit_before_init"])
    while True:
        msg = read_message()
        method = msg.get("method")
        if method == "initialize":
            answer(msg, script.get("initialize"), {"userAgent": "mock/0.169.0", "codexHome": "/x",
                                                   "platformFamily": "unix", "platformOs": "linux"})
        elif method == "thread/start":
            answer(msg, script.get("thread_start"), {"thread": {"id": THREAD}, "model": msg["params"].get("model"),
                                                     "modelProvider": msg["params"].get("modelProvider")})
            send({"method": "thread/started", "params": {"thread": {"id": THREAD}}})
        elif method == "turn/start":
            answer(msg, script.get("turn_start"), {"turn": {"id": TURN, "status": "inProgress", "items": []}})
            send({"method": "turn/started", "params": {"threadId": THREAD, "turn": {"id": TURN}}})
            run_turn(script)
        elif method == "turn/interrupt":
            send({"id": msg["id"], "result": {}})
            if script.get("interrupt", "honor") == "honor":
                completed("interrupted")


if __name__ == "__main__":
    main()
