#!/usr/bin/env python3
"""Commands drain at the speed of their work (issue 24, point 5).

`caldera run` (the example task-agent, default intervals) against the embedded plane on
loopback; once it reports, N trivial commands (collect_system_info and health_check in turn,
the two that ask for a state report) are queued at once. Printed: the drain rate from the
first command's dispatch to the last finish (the plane's own timestamps: the poll interval
before the first fetch is not the runtime's work), and from the queueing. Target >= 10/s
(before issue 24 each waited for the 2 s report floor: 0.5/s). Also the state reports the
plane received meanwhile: one report answers many commands.

    python bench/bench_drain.py [--commands 100]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_runtime import TOKEN, install  # noqa: E402

from caldera.plane.server import PlaneServer  # noqa: E402

KINDS = ("collect_system_info", "health_check")
TARGET = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=100)
    args = parser.parse_args()
    wait = threading.Event()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        plane = PlaneServer(str(tmp / "plane.db"), tokens={TOKEN: 1}).start()
        env = install(tmp, plane.url)
        daemon = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--agent", "bench"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not plane.store.reports(1):
                wait.wait(0.2)
            reports_before = len(plane.store.reports(1))
            queued_at = time.time()
            ids = [plane.store.enqueue(1, KINDS[n % len(KINDS)], {}, 60) for n in range(args.commands)]
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                rows = [c for c in plane.store.commands(1) if c["id"] in ids]
                if all(c["status"] in ("succeeded", "failed") for c in rows):
                    break
                wait.wait(0.2)
            reports = len(plane.store.reports(1)) - reports_before
        finally:
            daemon.terminate()
            daemon.wait(60)
            plane.stop()
    ok = [c for c in rows if c["status"] == "succeeded"]
    first = min(c["dispatched_at"] for c in rows if c["dispatched_at"])
    last = max(c["finished_at"] for c in rows if c["finished_at"])
    rate = len(rows) / max(last - first, 1e-6)
    from_queue = len(rows) / max(last - queued_at, 1e-6)
    print(f"{len(ok)} of {args.commands} trivial commands succeeded ({', '.join(KINDS)} in turn):")
    print(f"  {rate:.1f} commands/s from the first dispatch to the last finish ({last - first:.2f} s; "
          f"target >= {TARGET:g}: {'ok' if rate >= TARGET else 'MISSED'})")
    print(f"  {from_queue:.1f} commands/s from queueing (includes waiting for the first poll)")
    print(f"  {reports} state reports meanwhile (the 2 s floor limits reports, not commands)")
    print(json.dumps({"bench": "drain", "commands": args.commands, "succeeded": len(ok),
                      "per_second": round(rate, 1), "per_second_from_queue": round(from_queue, 1),
                      "reports": reports, "target": TARGET, "ok": rate >= TARGET and len(ok) == len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
