#!/usr/bin/env python3
"""Many agents on one host (issue 41, point 1): N `caldera run` daemons (the example adapter
agent, examples/task-agent) against one embedded plane at the default intervals; after a
settle, over a window: each daemon's PSS (`/proc/PID/smaps_rollup`: shared pages divided
among the processes that map them, so N copies of one interpreter share its code) and its
CPU as a share of one core, caldera's own (utime+stime) apart from the adapter's calls it
waited for (cutime+cstime). Targets: <= 15 MiB PSS and <= 0.3 % of a core per agent.

The floors, N copies of each left sleeping beside them in the same run (so that they share
pages as the daemons do): bare `python3 -c "import time; time.sleep(...)"`, and the same
with `requests, jsonschema, yaml` imported (the runtime's dependencies before issue 41), with
`requests` alone, and with the standard library the client needs (`http.client`, `ssl`, ...).

`--before PATH` runs the same N agents from another checkout first (the tree before a
change: `git worktree add /tmp/before main`), then this tree's, in one run: before/after.

Usage: bench/bench_host.py N [--settle 45] [--window 60] [--before PATH] [--python /usr/bin/python3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_runtime import install  # noqa: E402

from caldera.plane.server import PlaneServer  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
# the idle daemon imports neither requests (since issue 41: its client is http.client's) nor jsonschema
# nor yaml (tests/cli/test_cli_import_budgets.py): its floor is the stdlib its client needs
FLOORS = {"python3 (bare)": "import time; time.sleep(3600)",
          "python3 + the client stdlib": ("import http.client, ssl, email.utils, logging, json, threading, "
                                            "subprocess, time; time.sleep(3600)"),
          "python3 + requests": "import requests, time; time.sleep(3600)",
          "python3 + requests, jsonschema, yaml": "import requests, jsonschema, yaml, time; time.sleep(3600)"}


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def cpu(pid: int) -> tuple[float, float]:
    """(own utime+stime, waited-for children's cutime+cstime) in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


def phase(label: str, tree: Path, count: int, settle: float, window: float, python: str) -> dict[str, float]:
    subprocess.run([python, "-m", "compileall", "-q", str(tree / "caldera")], check=True)
    with tempfile.TemporaryDirectory(prefix="bench-host-") as name:
        tmp = Path(name)
        tokens = {f"bench-host-token-{i:04d}-abcdef": i for i in range(1, count + 1)}
        plane = PlaneServer(str(tmp / "plane.db"), tokens=tokens).start()
        procs: list[subprocess.Popen[bytes]] = []
        floors: dict[str, list[subprocess.Popen[bytes]]] = {k: [] for k in FLOORS}
        try:
            for token, n in tokens.items():
                env = install(tmp / f"agent{n}", plane.url, tree=tree, instance=n, token=token)
                # cwd: `python -m` puts the current dir first on sys.path, before PYTHONPATH's tree
                procs.append(subprocess.Popen([python, "-m", "caldera.cli", "run", "--agent", "bench"],
                                              env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                for key, code in FLOORS.items():
                    floors[key].append(subprocess.Popen([python, "-c", code]))
            wait = threading.Event()
            wait.wait(settle)
            before = [cpu(p.pid) for p in procs]
            wait.wait(window)
            after = [cpu(p.pid) for p in procs]
            dead = [p.pid for p in procs if p.poll() is not None]
            if dead:
                raise SystemExit(f"{label}: daemons exited during the run: {dead}")
            pss = [pss_kib(p.pid) / 1024 for p in procs]
            floor_pss = {k: statistics.median(pss_kib(p.pid) / 1024 for p in v) for k, v in floors.items()}
        finally:
            for p in [*procs, *(x for v in floors.values() for x in v)]:
                p.terminate()
            for p in [*procs, *(x for v in floors.values() for x in v)]:
                p.wait(60)
            plane.stop()
    own = statistics.mean((a[0] - b[0]) / window * 100 for a, b in zip(after, before, strict=True))
    adapter = statistics.mean((a[1] - b[1]) / window * 100 for a, b in zip(after, before, strict=True))
    result = {"pss_mib": statistics.mean(pss), "pss_max_mib": max(pss), "cpu_own_pct": own,
              "cpu_adapter_pct": adapter}
    result.update({f"floor {k}": v for k, v in floor_pss.items()})
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int)
    parser.add_argument("--settle", type=float, default=45.0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--before", type=Path, help="another checkout, run first (before/after)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter of the daemons and floors (the .deb's: /usr/bin/python3)")
    args = parser.parse_args()
    trees = ([("before", args.before.resolve())] if args.before else []) + [("this tree", ROOT)]
    for label, tree in trees:
        r = phase(label, tree, args.count, args.settle, args.window, args.python)
        deps, own_floor = r["floor python3 + requests, jsonschema, yaml"], r["floor python3 + requests"]
        print(f"{label} ({tree}, {args.python}): {args.count} agents, settle {args.settle:g} s, "
              f"window {args.window:g} s")
        print(f"  PSS per agent {r['pss_mib']:.1f} MiB (max {r['pss_max_mib']:.1f}; target <= 15: "
              f"{'ok' if r['pss_mib'] <= 15 else 'MISSED'}); floors, {args.count} copies each: bare python3 "
              f"{r['floor python3 (bare)']:.1f} MiB, with the client's stdlib "
              f"{r['floor python3 + the client stdlib']:.1f} MiB, with requests {own_floor:.1f} MiB "
              f"({r['pss_mib'] / own_floor:.2f} x that), with requests, jsonschema, yaml {deps:.1f} MiB "
              f"({r['pss_mib'] / deps:.2f} x)")
        print(f"  CPU per agent {r['cpu_own_pct']:.2f} % of a core caldera's own (target <= 0.3: "
              f"{'ok' if r['cpu_own_pct'] <= 0.3 else 'MISSED'}), "
              f"the adapter's calls {r['cpu_adapter_pct']:.2f} % apart")
        print(json.dumps({"bench": "host", "tree": label, "agents": args.count,
                          **{k: round(v, 3) for k, v in r.items()},
                          "ok": r["pss_mib"] <= 15 and r["cpu_own_pct"] <= 0.3}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
