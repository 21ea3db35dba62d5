#!/usr/bin/env python3
"""Run every bench/bench_*.py in turn (`make bench`); each prints its own ratios, and one
JSON line per figure ({"bench": …, "ok": …}); a summary of those lines closes the run.

    python bench/run_all.py [--quick]

--quick: shorter runs (fewer rounds, shorter windows, the plane load at 250 runtimes only),
for a smoke check; the figures in docs/performance.md come from full runs.
"""
import json
import subprocess
import sys
from pathlib import Path

QUICK = {
    "bench_pause.py": ["--runs", "15"],
    "bench_runtime.py": ["--seconds", "30", "--runs", "3"],
    "bench_drain.py": ["--commands", "50"],
    "bench_sampler.py": ["--samples", "500"],
    "bench_skills.py": ["--rounds", "3"],
    "bench_codex.py": ["--lines", "50000"],
    "bench_claude_code.py": ["--turns", "3", "--rounds", "20"],
    "bench_opencode.py": ["--rounds", "2", "--later", "3", "--idle", "10"],
    "bench_plane_load.py": ["--steps", "250", "--seconds", "20"],
    "bench_run_watch.py": ["--events", "120", "--big", "20000", "--runs", "2000"],
    "bench_turns.py": ["--rounds", "2", "--memory-turns", "10"],
}


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failed, figures = [], []
    for script in sorted(Path(__file__).parent.glob("bench_*.py")):
        print(f"\n== {script.name}", flush=True)
        argv = [sys.executable, str(script), *(QUICK.get(script.name, []) if quick else [])]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.startswith("{"):
                try:
                    figures.append(json.loads(line))
                except ValueError:
                    pass
        if proc.wait() != 0:
            failed.append(f"{script.name} (exit {proc.returncode})")
    print("\n== summary")
    for fig in figures:
        shown = {k: v for k, v in fig.items() if k in ("ratio", "rss_ratio", "cpu_with_adapter_pct", "lines_per_cpu_s",
                                                       "rescan_stat_share", "p99_ms", "verdict", "target")}
        print(f"  {fig.get('bench', '?'):<18} {'ok ' if fig.get('ok', fig.get('verdict') == 'ok') else 'NOT'} {shown}")
    if failed:
        print("exited non-zero: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
