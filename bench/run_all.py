#!/usr/bin/env python3
"""Run every bench/bench_*.py in turn (`make bench`); each prints its own ratios."""
import subprocess
import sys
from pathlib import Path

failed = 0
for script in sorted(Path(__file__).parent.glob("bench_*.py")):
    print(f"\n== {script.name}", flush=True)
    failed += subprocess.run([sys.executable, str(script)]).returncode != 0
sys.exit(1 if failed else 0)
