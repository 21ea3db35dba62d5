#!/usr/bin/env python3
"""`caldera pause` against the example adapter vs calling the adapter directly, in one run.

overhead = median(caldera pause) - median(adapter pause), set against the floor of
any Python CLI that spawns a process: `python -c "import argparse, json, subprocess"`.
Target: overhead <= 1.5 x floor. The three commands are run interleaved, so drift
on the machine hits all three alike. Prints one JSON line at the end.

    python bench/bench_pause.py [--runs 40]
"""
from __future__ import annotations

import argparse
import json
import os
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


def timed(argv, **kw) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, **kw)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pause-") as tmp:
        bundle = Path(tmp) / "task-agent"
        shutil.copytree(EXAMPLE, bundle, ignore=shutil.ignore_patterns("data", "__pycache__"))
        manifest, state = bundle / "caldera.agent.yaml", Path(tmp) / "state"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CALDERA_", "CLAWMANAGER_")) and k != "PYTHONDONTWRITEBYTECODE"}
        # Bytecode as any installed package has it (this shell may forbid writing it).
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        script = Path(sys.executable).parent / "caldera"  # what a person types
        entry = [str(script)] if script.exists() else [sys.executable, "-m", "caldera.cli"]
        caldera = [*entry, "pause", "--manifest", str(manifest), "--state-dir", str(state)]
        direct = ["python3", "adapter.py", "pause"]  # exactly what the manifest's command runs
        floor = [sys.executable, "-c", "import argparse, json, subprocess"]
        for _ in range(2):  # warm: bytecode and the manifest cache, as any later call finds them
            timed(caldera, env=env, cwd=REPO)
            timed(floor, env=env)
        samples = {"caldera": [], "direct": [], "floor": []}
        for _ in range(args.runs):
            samples["caldera"].append(timed(caldera, env=env, cwd=REPO))
            samples["direct"].append(timed(direct, env=ADAPTER_ENV, cwd=bundle))
            samples["floor"].append(timed(floor, env=env))
    med = {k: statistics.median(v) for k, v in samples.items()}
    overhead = med["caldera"] - med["direct"]
    ratio = overhead / med["floor"]
    for key in ("caldera", "direct", "floor"):
        print(f"{key:<8} median {med[key] * 1000:7.1f} ms  (min {min(samples[key]) * 1000:.1f} ms)")
    print(f"overhead {overhead * 1000:7.1f} ms = {ratio:.2f} x the floor (target <= 1.5 x)")
    print(json.dumps({"bench": "pause", "runs": args.runs, "caldera_ms": round(med["caldera"] * 1000, 1),
                      "direct_ms": round(med["direct"] * 1000, 1), "floor_ms": round(med["floor"] * 1000, 1),
                      "overhead_ms": round(overhead * 1000, 1), "ratio": round(ratio, 2), "target": 1.5,
                      "ok": ratio <= 1.5}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
