"""The OpenCode backend: `opencode run --format json` per turn against the agent's
`opencode serve` (what caldera does), with the real CLI and the local fake provider,
measured interleaved in one run (the machine is shared: each round measures every form).

Per round:
  run    `opencode run --format json --title T PROMPT` in fresh private dirs (what a turn
         would cost as one process per turn): wall, CPU and peak RSS of the process
  first  caldera's first turn on a new `ServerOwner`: the server's start plus the turn
         (service.execute), wall; CPU of the server and of this process
  later  caldera's later turns on the same server (N of them), wall and CPU each
then, once: the server's RSS after the turns and its CPU over an idle stretch (after 10 s
to settle: the first seconds after a turn still do the turn's bookkeeping).

Prints the medians, the ratios run/first and run/later (wall and CPU), and one JSON line:
target run/later wall >= 5 (serving later turns must be far cheaper than a process per
turn) and first/run wall <= 1.5 (the first turn may cost no more than a process would).
Needs CALDERA_OPENCODE_BIN (.ci/install-opencode.sh).

Usage: python bench/bench_opencode.py [--rounds N] [--later N] [--idle S]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "backends"))
sys.path.insert(0, str(ROOT / "tests" / "backends" / "opencode"))

from backends_fake_chat import FakeChat as FakeChatProvider  # noqa: E402
from opencode_helpers import environment, request, write_projection  # noqa: E402

from caldera.backends import service  # noqa: E402
from caldera.backends.opencode.owner import ServerOwner  # noqa: E402
from caldera.backends.opencode.server import OFFLINE_ENV  # noqa: E402

KEY = "sk-bench-0123456789abcdef"
TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """utime + stime of a process and its waited-for children, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICK


def _rss_kib(pid: int, key: str = "VmRSS:") -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key))


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def private_env(url: str, home: Path) -> dict[str, str]:
    """Dirs of its own under `home` and an environment that uses them, offline as caldera's
    server is, the fake provider configured (for `opencode run` and a bare `opencode serve`)."""
    for name in ("home", "config", "data", "cache", "state", "tmp"):
        (home / name).mkdir(parents=True)
    config = {"provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "options": {
        "baseURL": url, "apiKey": "{env:BENCH_KEY}"}, "models": {"fake-model": {}}}},
        "model": "fake/fake-model", "small_model": "fake/fake-model", "autoupdate": False, "share": "disabled",
        "snapshot": False, "formatter": False, "lsp": False}
    (home / "opencode.json").write_text(json.dumps(config))
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(home / "home"),
           "XDG_CONFIG_HOME": str(home / "config"), "XDG_DATA_HOME": str(home / "data"),
           "XDG_CACHE_HOME": str(home / "cache"), "XDG_STATE_HOME": str(home / "state"), "TMPDIR": str(home / "tmp"),
           "OPENCODE_CONFIG": str(home / "opencode.json"), "BENCH_KEY": KEY, **OFFLINE_ENV}
    return env


def one_run(binary: str, url: str, ws: Path, tmp: Path, n: int, prompt: str = "Say hello",
            expect: bytes = b"") -> dict[str, float]:
    """`opencode run --format json` once, in dirs of its own, offline as caldera's server is;
    its output must hold a text part (and `expect`)."""
    env = private_env(url, tmp / f"run{n}")
    started = time.perf_counter()
    proc = subprocess.Popen([binary, "run", "--format", "json", "--title", "bench", prompt], cwd=str(ws),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if status != 0 or b'"type":"text"' not in out.replace(b" ", b"") or expect not in out:
        raise SystemExit(f"opencode run failed (status {status}): {out[-500:]!r}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}


def caldera_turn(env: Any, ws: Path, n: int, owner: ServerOwner) -> dict[str, float]:
    server_cpu0 = _proc_cpu(_serving(owner)) if owner.server else 0.0
    self0, started = _self_cpu(), time.perf_counter()
    result = service.execute(request(ws, run_id=f"bench-{n}"), env, roots=None)
    wall = time.perf_counter() - started
    if result["status"] != "completed":
        raise SystemExit(f"caldera turn failed: {result['failure_kind']}: {result['message']}")
    assert owner.server is not None
    return {"wall": wall, "cpu": _proc_cpu(_serving(owner)) - server_cpu0 + _self_cpu() - self0}


def _serving(owner: ServerOwner) -> int:
    """The `opencode serve` process (the server's pid is its bubblewrap's where it has one)."""
    assert owner.server is not None
    return owner.server.serving_pid() or 0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--later", type=int, default=5)
    parser.add_argument("--idle", type=float, default=30.0)
    args = parser.parse_args()
    binary = os.environ.get("CALDERA_OPENCODE_BIN")
    if not binary:
        print("bench_opencode: CALDERA_OPENCODE_BIN is not set (.ci/install-opencode.sh); skipped")
        return 0
    runs, firsts, laters, rss, hwm = [], [], [], [], []
    idle_cpu = float("nan")
    with tempfile.TemporaryDirectory(prefix="bench-opencode-") as name, FakeChatProvider([{"text": "Hello."}]) as fake:
        tmp = Path(name)
        ws = tmp / "ws"
        ws.mkdir()
        secrets = write_projection(tmp, fake.url, key=KEY)
        for rnd in range(args.rounds):
            runs.append(one_run(binary, fake.url, ws, tmp, rnd))
            owner = ServerOwner(tmp / "state" / "runs", idle_seconds=600)
            env = environment(tmp, secrets, owner=owner, binary=binary)
            try:
                firsts.append(caldera_turn(env, ws, rnd * 100, owner))
                for i in range(args.later):
                    laters.append(caldera_turn(env, ws, rnd * 100 + i + 1, owner))
                pid = _serving(owner) if owner.server else 0
                rss.append(_rss_kib(pid) / 1024)
                hwm.append(_rss_kib(pid, "VmHWM:") / 1024)
                if rnd == args.rounds - 1:
                    threading.Event().wait(10.0)  # settle
                    cpu0 = _proc_cpu(pid)
                    threading.Event().wait(args.idle)
                    idle_cpu = (_proc_cpu(pid) - cpu0) / args.idle * 100
            finally:
                owner.close()
    report = {
        "opencode run --format json (per turn)": {"wall_s": median([r["wall"] for r in runs]),
                                                  "cpu_s": median([r["cpu"] for r in runs]),
                                                  "peak_rss_mib": median([r["rss_mib"] for r in runs])},
        "caldera first turn (server start + turn)": {"wall_s": median([r["wall"] for r in firsts]),
                                                     "cpu_s": median([r["cpu"] for r in firsts])},
        "caldera later turn (same server)": {"wall_s": median([r["wall"] for r in laters]),
                                             "cpu_s": median([r["cpu"] for r in laters])},
        "server": {"rss_mib_after_turns": median(rss), "peak_rss_mib": median(hwm),
                   f"idle_cpu_percent_over_{args.idle:.0f}s": idle_cpu},
    }
    run, first, later = (report[k] for k in list(report)[:3])
    report["ratios"] = {"run/first wall": run["wall_s"] / first["wall_s"],
                        "run/later wall": run["wall_s"] / later["wall_s"],
                        "run/first cpu": run["cpu_s"] / first["cpu_s"], "run/later cpu": run["cpu_s"] / later["cpu_s"]}
    print(f"bench_opencode: {args.rounds} rounds, {args.later} later turns each, interleaved")
    for section, values in report.items():
        print(f"  {section}")
        for key, value in values.items():
            print(f"    {key:36s} {value:8.2f}")
    ratio = report["ratios"]["run/later wall"]
    first_ratio = first["wall_s"] / run["wall_s"]
    print(json.dumps({"bench": "opencode", "ratio": round(ratio, 2), "first_over_run": round(first_ratio, 2),
                      "target": "run/later wall >= 5, first/run wall <= 1.5",
                      "ok": ratio >= 5 and first_ratio <= 1.5}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
