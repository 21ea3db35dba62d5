#!/usr/bin/env python3
"""Process mode: the runtime's memory while its agent floods stdout (SPEC 7b, issue 15).

A process-mode agent prints as fast as it can (200-byte lines, in 10 KiB writes) for
FLOOD_SECONDS while the runtime's supervisor pumps the output into agent.log (rotated
at 10 MiB x 3). The runtime's RSS (this process: the supervisor, pump and writer
threads) is sampled every second. Printed: the RSS ratio, last sample / first sample
after the flood began (flat = about 1.0), the throughput the log took, what was dropped,
and that the log never grew past its rotation bound. A second pass throttles the
disk (every write sleeps) to show the bounded queue dropping instead of growing.
"""
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.agents.manifest import load_manifest  # noqa: E402
from caldera.agents.process import logpump  # noqa: E402
from caldera.agents.process.driver import open_driver  # noqa: E402
from caldera.config import AgentPaths  # noqa: E402
from caldera.host.statefile import StateFile  # noqa: E402
from caldera.redact import Redactor  # noqa: E402

FLOOD_SECONDS = float(os.environ.get("BENCH_FLOOD_SECONDS", "8"))
AGENT = "import sys\nline = b'x' * 199 + b'\\n'\nout = sys.stdout.buffer\nwhile True:\n    out.write(line * 50)\n"


def rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run(root: Path, slow_disk: bool) -> dict:
    work = root / "work"
    work.mkdir(parents=True)
    (work / "flood.py").write_text(AGENT)
    manifest = work / "caldera.agent.yaml"
    manifest.write_text(f"name: flood\nruntime:\n  type: process\n  command: [{json.dumps(sys.executable)}, flood.py]\n"
                        "  workdir: .\n  stop_timeout_seconds: 2\n")
    state = root / "state"
    (state / "logs").mkdir(parents=True)
    paths = AgentPaths("flood", work, manifest, state)
    driver = open_driver(paths, load_manifest(manifest), store=StateFile(state / "state.json"), redactor=Redactor(),
                         environ={})
    original = logpump.RotatingFile.write
    if slow_disk:
        def slow_write(self, data, _orig=original):
            time.sleep(0.01)  # ~100 writes a second: a disk far slower than the agent
            _orig(self, data)
        logpump.RotatingFile.write = slow_write
    stop = threading.Event()
    thread = threading.Thread(target=driver.supervise, args=(stop,))
    samples = []
    before = rss_kib()
    try:
        thread.start()
        while driver.supervisor.pid() is None:
            stop.wait(0.05)
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_SECONDS:
            stop.wait(1.0)
            samples.append(rss_kib())
        elapsed = time.monotonic() - started
        written = driver.pump.file.written
        dropped = driver.pump.dropped_total
    finally:
        stop.set()
        thread.join()
        logpump.RotatingFile.write = original
    biggest = max(p.stat().st_size for p in (state / "logs").glob("agent.log*"))
    files = sorted(p.name for p in (state / "logs").glob("agent.log*"))
    return {"before": before, "samples": samples, "written_mib_s": written / elapsed / 2**20,
            "dropped_mib": dropped / 2**20, "flood_mib_s": (written + dropped) / elapsed / 2**20,
            "biggest_mib": biggest / 2**20, "files": files}


def main() -> int:
    ok = True
    for slow in (False, True):
        root = Path(tempfile.mkdtemp(prefix="bench-flood-"))
        try:
            got = run(root, slow)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        first, last, peak = got["samples"][0], got["samples"][-1], max(got["samples"])
        ratio = last / first
        label = "slow disk (10 ms per write)" if slow else "fast disk"
        print(f"{label}: runtime RSS {got['before'] / 1024:.1f} MiB before the agent, {first / 1024:.1f} MiB after 1 s "
              f"of flood, {last / 1024:.1f} MiB after {len(got['samples'])} s (peak {peak / 1024:.1f}); "
              f"ratio last/first = {ratio:.2f}, peak/before = {peak / got['before']:.2f}")
        print(f"  the agent printed {got['flood_mib_s']:.0f} MiB/s; agent.log took {got['written_mib_s']:.0f} MiB/s, "
              f"{got['dropped_mib']:.0f} MiB dropped (counted, never queued); "
              f"files {', '.join(got['files'])}, largest {got['biggest_mib']:.1f} MiB (bound 10 MiB)")
        ok = ok and got["biggest_mib"] <= 10.0 + 0.1 and len(got["files"]) <= 4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
