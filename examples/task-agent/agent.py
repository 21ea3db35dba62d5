#!/usr/bin/env python3
"""The task agent itself: a timer that runs the task list every `interval_minutes`,
unless it is held (the manual pause, someone's session, the weekly limit).

  python3 agent.py                 the timer (a systemd unit or a terminal keeps it running)
  python3 agent.py pause|resume    the agent's own channel (what a chat command would call)
  python3 agent.py session NAME    someone works in a session: no run starts
  python3 agent.py session --end
  python3 agent.py check           the health check caldera's manifest names

caldera never starts or stops this program: it calls adapter.py.
"""
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import taskagent as ta  # noqa: E402

TICK = 5.0


def timer(stop: threading.Event) -> None:
    while not stop.is_set():
        now = ta.time.time()
        ta.write_json("tick", {"ts": now})
        requested = ta.exists("run-now")
        due = now >= ta.next_run_at(now)
        if (requested or due) and not ta.held(now) and ta.tasks():
            ta.remove("run-now")
            record = ta.run_once("requested" if requested else "timer")
            print(f"{record['started_at']} run {record['id']}: {record['outcome']}", flush=True)
        stop.wait(TICK)


def check() -> int:
    """Health: the data directory is writable and the agent's own files parse."""
    try:
        ta.write_json("health-probe", {"ts": ta.time.time()})
        ta.remove("health-probe")
        ta.settings()
        ta.tasks()
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {exc}")
        return 1
    print("ok")
    return 0


def main(argv) -> int:
    if not argv:
        stop = threading.Event()
        # Not stop.set() in the handler: it runs in this thread between two bytecodes, maybe
        # while this thread holds the Event's lock inside wait(), and would wait for it forever.
        set_later = lambda *_: threading.Thread(target=stop.set, daemon=True).start()  # noqa: E731
        signal.signal(signal.SIGTERM, set_later)
        signal.signal(signal.SIGINT, set_later)
        timer(stop)
        return 0
    if argv == ["pause"]:
        ta.touch("paused", ta.now_iso())
        print("Paused.")
    elif argv == ["resume"]:
        ta.remove("paused")
        print("Pause lifted." + (" Held: " + "; ".join(ta.held()) if ta.held() else ""))
    elif argv[:1] == ["session"] and len(argv) == 2:
        if argv[1] == "--end":
            ta.remove("session")
        else:
            ta.touch("session", argv[1])
    elif argv == ["check"]:
        return check()
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
