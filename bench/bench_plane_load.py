"""Load on one caldera plane: N simulated runtimes on loopback for a while.

    python bench/bench_plane_load.py [--runtimes 200] [--seconds 60] [--heartbeat 2] [--poll 1]
                                     [--report 2] [--commands-per-second 20]

The plane runs as its own process (`python -m caldera.cli plane serve`), so the
clients' threads don't share its GIL. Each simulated runtime is a thread with
its own `requests.Session`: register, then heartbeats, command polls and state
reports at the given intervals; a fetched command is started and finished once.
The bench enqueues commands into the plane's database (another process, WAL)
at a steady rate, stops enqueueing at the end, lets the runtimes drain, and
checks: no 5xx, every command finished exactly once (terminal status and one
finish request). It prints the request count, rate and latency percentiles.
Exit 1 when a check fails.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from caldera.plane.store import Store  # noqa: E402


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}
        self.errors: list[str] = []

    def note(self, seconds: float, status: int) -> None:
        with self.lock:
            self.latencies.append(seconds)
            self.statuses[status] = self.statuses.get(status, 0) + 1

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)


def _call(http, stats, method, url, token, body=None):
    started = time.perf_counter()
    try:
        resp = http.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=(5, 30))
    except requests.RequestException as exc:
        stats.error(f"{method} {url}: {type(exc).__name__}")
        return None
    stats.note(time.perf_counter() - started, resp.status_code)
    return resp


def runtime(index: int, base: str, args, stats: Stats, stop: threading.Event, drained: threading.Event):
    """One simulated runtime: register, then heartbeat / poll / report on their intervals."""
    http = requests.Session()
    instance, agent_id = index + 1, f"bench-{index + 1}-main"
    api = base + "/api/v1/agent"
    resp = _call(http, stats, "POST", api + "/register", f"boot-{instance}",
                 {"instance_id": instance, "agent_id": agent_id, "agent_version": "bench", "protocol_version": "v1"})
    if resp is None or resp.status_code != 200:
        stats.error(f"register {instance}: {resp.status_code if resp is not None else 'no answer'}")
        return
    token = resp.json()["data"]["session_token"]
    now = time.monotonic()
    due = {"hb": now + random.uniform(0, args.heartbeat), "poll": now + random.uniform(0, args.poll),
           "report": now + random.uniform(0, args.report)}
    while not drained.is_set():
        now = time.monotonic()
        if now >= due["hb"] and not stop.is_set():
            _call(http, stats, "POST", api + "/heartbeat", token, {"agent_id": agent_id, "openclaw_status": "running",
                                                                  "current_config_revision_id": None})
            due["hb"] = now + args.heartbeat
        if now >= due["report"] and not stop.is_set():
            _call(http, stats, "POST", api + "/state/report", token, {
                "agent_id": agent_id, "runtime": {"openclaw_status": "running", "openclaw_pid": 1000 + index,
                                                  "current_config_revision_id": None},
                "system_info": {"cpu": {"cores": 2, "load": {"1m": random.random()}}}, "health": {"agent": "ok"}})
            due["report"] = now + args.report
        if now >= due["poll"]:
            _poll(http, stats, api, token, agent_id)
            due["poll"] = now + args.poll
        drained.wait(max(0.0, min(due.values()) - time.monotonic()))


def _poll(http, stats, api, token, agent_id):
    resp = _call(http, stats, "GET", api + "/commands/next", token)
    if resp is None or resp.status_code != 200:
        return
    command = resp.json()["data"]["command"]
    if command is None:
        return
    cid = command["id"]
    _call(http, stats, "POST", f"{api}/commands/{cid}/start", token, {"agent_id": agent_id})
    _call(http, stats, "POST", f"{api}/commands/{cid}/finish", token,
          {"agent_id": agent_id, "status": "succeeded", "result": {"echo": command["payload"]}})


def _start_plane(db: Path, args) -> tuple[subprocess.Popen, str]:
    url_file = db.parent / "url"
    argv = [sys.executable, "-m", "caldera.cli", "plane", "serve", "--db", str(db), "--port", "0",
            "--url-file", str(url_file), "--heartbeat-interval", str(int(args.heartbeat)),
            "--poll-interval", str(max(1, int(args.poll)))]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    deadline = time.monotonic() + 30
    while not url_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the plane did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    return proc, url_file.read_text().strip()


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--heartbeat", type=float, default=2.0, help="heartbeat interval (s)")
    parser.add_argument("--poll", type=float, default=1.0, help="command poll interval (s)")
    parser.add_argument("--report", type=float, default=2.0, help="state report interval (s)")
    parser.add_argument("--commands-per-second", type=float, default=20.0)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="plane-load-"))
    db = workdir / "plane.db"
    seed = Store(db)
    for i in range(1, args.runtimes + 1):
        seed.add_instance(i, f"boot-{i}")
    proc, base = _start_plane(db, args)
    stats, stop, drained = Stats(), threading.Event(), threading.Event()
    threads = [threading.Thread(target=runtime, args=(i, base, args, stats, stop, drained), daemon=True)
               for i in range(args.runtimes)]
    began = time.monotonic()
    for t in threads:
        t.start()
    enqueued = 0
    try:
        while time.monotonic() - began < args.seconds:
            seed.enqueue(random.randint(1, args.runtimes), "collect_system_info", {"n": enqueued})
            enqueued += 1
            stop.wait(1.0 / args.commands_per_second)
        stop.set()
        drain_deadline = time.monotonic() + max(10.0, 5 * args.poll)
        while time.monotonic() < drain_deadline:
            open_ = seed._read("SELECT COUNT(*) FROM commands WHERE status NOT IN ('succeeded','failed')")[0][0]
            if open_ == 0:
                break
            drained.wait(0.2)
        elapsed = time.monotonic() - began
        drained.set()
        for t in threads:
            t.join(timeout=35)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)

    rows = seed._read("SELECT status, finish_count FROM commands")
    not_finished = sum(1 for r in rows if r["status"] not in ("succeeded", "failed"))
    not_once = sum(1 for r in rows if r["finish_count"] != 1)
    fivexx = sum(n for s, n in stats.statuses.items() if s >= 500)
    other = {s: n for s, n in stats.statuses.items() if s != 200}
    lat = stats.latencies
    print(f"plane load: {args.runtimes} runtimes, {elapsed:.1f} s (heartbeat {args.heartbeat:g} s, "
          f"poll {args.poll:g} s, report {args.report:g} s)")
    print(f"requests {len(lat)} ({len(lat) / elapsed:.0f}/s); status counts {dict(sorted(stats.statuses.items()))}")
    print(f"latency p50 {_percentile(lat, 50) * 1000:.1f} ms, p95 {_percentile(lat, 95) * 1000:.1f} ms, "
          f"p99 {_percentile(lat, 99) * 1000:.1f} ms, max {max(lat) * 1000:.1f} ms")
    print(f"commands enqueued {enqueued}, in the plane {len(rows)}, not finished {not_finished}, "
          f"finish requests != 1: {not_once}; 5xx {fivexx}; network errors {len(stats.errors)}")
    ok = fivexx == 0 and not_finished == 0 and not_once == 0 and not stats.errors and not other \
        and len(rows) == enqueued
    print("PASS" if ok else f"FAIL (non-200 answers {other}; first errors {stats.errors[:3]})")
    seed.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
