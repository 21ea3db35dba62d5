"""One full system sample: caldera's Sampler against the same figures taken with psutil.

    python bench/bench_sampler.py [--samples N]

psutil is for this benchmark only (never a runtime dependency). When the running
interpreter lacks it, this script creates /tmp/benchvenv (override with
$CALDERA_BENCH_VENV), installs psutil there with pip and runs itself again under
that venv's python; caldera is imported from this checkout. Both sides run
interleaved in one process, so the ratio holds on a busy machine too.

psutil's equivalent of one sample: cpu_count, getloadavg, virtual_memory,
disk_usage, net_io_counters(pernic=True), net_if_addrs, net_if_stats. It reads no
cgroup files, so caldera does more work per sample (limits, working set, extras).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from caldera.host.sampler import Sampler  # noqa: E402

VENV = os.environ.get("CALDERA_BENCH_VENV", "/tmp/benchvenv")
TARGET_US = 1000.0


def ensure_psutil(argv) -> None:
    """Import psutil; else re-run this script in the bench venv, installing psutil there."""
    if importlib.util.find_spec("psutil") is not None:
        return
    python = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        if not os.path.exists(python):
            _step([sys.executable, "-m", "venv", VENV], python)
        os.execv(python, [python, os.path.abspath(__file__), *argv])
    _step([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "psutil"], python)
    importlib.invalidate_caches()


def _step(argv, python) -> None:
    from caldera.host import proc
    print("bench:", " ".join(argv), file=sys.stderr)
    res = proc.run(argv, env=dict(os.environ), timeout=300, stdout_cap=1 << 20)
    if not res.ok:
        sys.exit(f"bench: {' '.join(argv)} failed ({res.failure()}):\n"
                 f"{res.stderr.decode(errors='replace')}\n"
                 f"install psutil yourself: python3 -m venv {VENV} && {python} -m pip install psutil")


def psutil_sample(psutil, path):
    """The figures of one caldera sample, taken the psutil way."""
    return (psutil.cpu_count(), psutil.getloadavg(), psutil.virtual_memory(),
            psutil.disk_usage(path), psutil.net_io_counters(pernic=True),
            psutil.net_if_addrs(), psutil.net_if_stats())


def psutil_four(psutil, path):
    """The four calls issue 16's table names: cpu_times, virtual_memory, disk_usage,
    net_io_counters (fewer figures than a sample holds: no addresses, no link state)."""
    return (psutil.cpu_times(), psutil.virtual_memory(), psutil.disk_usage(path),
            psutil.net_io_counters(pernic=True))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args(argv)
    ensure_psutil(argv)
    import psutil

    path = tempfile.gettempdir()
    sampler = Sampler(persistent_dir=path)
    fixture = os.path.join(REPO, "tests", "host", "fixtures", "v2_quota_memory")
    fixture_sampler = Sampler(os.path.join(fixture, "proc"), os.path.join(fixture, "sys/fs/cgroup"),
                              os.path.join(fixture, "persistent"))
    for _ in range(50):  # warm caches (layout, CPU count, page cache) on both sides
        sampler.sample(), fixture_sampler.sample(), psutil_sample(psutil, path)
    ours, theirs, fix, four = [], [], [], []
    for _ in range(args.samples):  # interleaved: both sides see the same machine load
        ours.append(timed(sampler.sample))
        theirs.append(timed(lambda: psutil_sample(psutil, path)))
        fix.append(timed(fixture_sampler.sample))
        four.append(timed(lambda: psutil_four(psutil, path)))
    sample = sampler.sample()
    m_ours, m_theirs, m_fix, m_four = (statistics.median(x) for x in (ours, theirs, fix, four))
    print(f"sampler: {args.samples} samples each, interleaved, python {sys.version.split()[0]}, "
          f"psutil {psutil.__version__}")
    print(f"  caldera Sampler.sample() (this machine)   median {m_ours:8.1f} us"
          f"   p90 {sorted(ours)[int(len(ours) * 0.9)]:8.1f} us"
          f"   metrics_collector={sample.metrics_collector}")
    print(f"  caldera Sampler.sample() (v2 fixture tree) median {m_fix:7.1f} us")
    print(f"  psutil equivalent figures                median {m_theirs:8.1f} us"
          f"   p90 {sorted(theirs)[int(len(theirs) * 0.9)]:8.1f} us")
    print(f"  psutil four calls (cpu_times, virtual_memory, disk_usage, net_io_counters)"
          f" median {m_four:6.1f} us")
    print(f"  ratio caldera / psutil, same figures = {m_ours / m_theirs:.2f}   (target <= 1.00)")
    print(f"  ratio caldera / psutil, four calls   = {m_ours / m_four:.2f}   (issue 16's table; "
          "a sample also holds addresses, link state and the cgroup limits)")
    sampler.close()
    fixture_sampler.close()
    print(json.dumps({"bench": "sampler", "samples": args.samples, "caldera_us": round(m_ours, 1),
                      "psutil_same_figures_us": round(m_theirs, 1), "psutil_four_calls_us": round(m_four, 1),
                      "ratio": round(m_ours / m_theirs, 2), "ratio_four_calls": round(m_ours / m_four, 2),
                      "target": 1.0, "ok": m_ours <= m_theirs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
