#!/usr/bin/env python3
"""Quick verbs against their floors, in one run (issue 16, point 1):

1. `caldera pause` on the example adapter: overhead = caldera pause - the adapter called
   directly (`python3 adapter.py pause`), set against the floor of any Python CLI that
   spawns a process, `python -c "import argparse, json, subprocess"`. Target <= 1.2 x.
2. `caldera --help` against `python -c pass`, for information: --help is argparse's own
   again and its 1.15 x target is retired (docs/performance.md, section 1).

Measure: CPU time (user+sys) of each child and its children, from
resource.getrusage(RUSAGE_CHILDREN) deltas, so that the other loads on a shared machine
(run queue waits) do not count; wall time is printed beside it. The commands run
interleaved, the ratios are of medians. Prints one JSON line per figure at the end.

    python bench/bench_pause.py [--runs 40]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "task-agent"
ADAPTER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.path.expanduser("~"), "LANG": "C.UTF-8",
               "CALDERA_AGENT": "task-agent", "CALDERA_VERB": "pause"}


def measured(argv, **kw) -> tuple[float, float]:
    """(cpu seconds, wall seconds) of one run of argv, its children included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, **kw)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def report(name, samples, keys, numerator, floor_key, target=None) -> dict:
    """target None: printed for information, never a failure."""
    med = {k: statistics.median(s[0] for s in samples[k]) for k in keys}
    wall = {k: statistics.median(s[1] for s in samples[k]) for k in keys}
    for key in keys:
        print(f"  {key:<8} cpu median {med[key] * 1000:6.1f} ms   wall median {wall[key] * 1000:6.1f} ms")
    value = numerator(med)
    ratio = value / med[floor_key]
    wall_ratio = numerator(wall) / wall[floor_key]
    aim = f"target <= {target} x" if target is not None else "no target"
    print(f"  {name}: {value * 1000:.1f} ms cpu = {ratio:.2f} x the floor ({aim}; wall {wall_ratio:.2f} x)")
    return {"bench": name, "cpu_ms": round(value * 1000, 1), "floor_cpu_ms": round(med[floor_key] * 1000, 1),
            "ratio": round(ratio, 2), "wall_ratio": round(wall_ratio, 2), "target": target,
            "ok": target is None or ratio <= target}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pause-") as tmp:
        bundle = Path(tmp) / "task-agent"
        shutil.copytree(EXAMPLE, bundle, ignore=shutil.ignore_patterns("data", "__pycache__", ".caldera-state"))
        manifest, state = bundle / "caldera.agent.yaml", Path(tmp) / "state"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CALDERA_", "CLAWMANAGER_")) and k != "PYTHONDONTWRITEBYTECODE"}
        # Bytecode as any installed package has it (this shell may forbid writing it).
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        script = Path(sys.executable).parent / "caldera"  # what a person types
        entry = [str(script)] if script.exists() else [sys.executable, "-m", "caldera.cli"]
        commands = {
            "caldera": ([*entry, "pause", "--manifest", str(manifest), "--state-dir", str(state)], REPO, env),
            "direct": (["python3", "adapter.py", "pause"], bundle, ADAPTER_ENV),  # what the manifest runs
            "floor": ([sys.executable, "-c", "import argparse, json, subprocess"], None, env),
            "help": ([*entry, "--help"], None, env),
            "pass": ([sys.executable, "-c", "pass"], None, env),
        }
        samples = {key: [] for key in commands}
        for round_ in range(args.runs + 2):  # two warm rounds: bytecode and the manifest cache
            for key, (argv, cwd, run_env) in commands.items():
                got = measured(argv, cwd=cwd, env=run_env)
                if round_ >= 2:
                    samples[key].append(got)
    print(f"caldera pause (runs {args.runs}, interleaved):")
    pause = report("pause", samples, ("caldera", "direct", "floor"), lambda m: m["caldera"] - m["direct"],
                   "floor", 1.2)
    print("caldera --help:")
    helped = report("help", samples, ("help", "pass"), lambda m: m["help"], "pass")
    for line in (pause, helped):
        print(json.dumps({**line, "runs": args.runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
