#!/usr/bin/env python3
"""Load on one caldera plane: simulated runtimes on loopback, in steps, at the default intervals.

    python bench/bench_plane_load.py [--steps 250,500,1000] [--seconds 30] [--workers 4]
                                     [--heartbeat 15] [--poll 5] [--report 5] [--commands-per-second 5]

The plane runs as its own process (`caldera plane serve`, 127.0.0.1 only). The simulated
runtimes run in --workers processes of this script (`--worker`), so that the load
generator is never the bottleneck: each worker schedules its runtimes' heartbeats, polls
and state reports on their intervals (each runtime with its own keep-alive session) and a
sender threads (32 each) send them when due. Commands are enqueued into the plane's database
(WAL, from this process) at a steady rate; a fetched command is started and finished once.

Each step runs --seconds, then drains (polls only) until every command is finished. It
checks: 0 network errors, 0 non-200 answers, every command finished exactly once, p99
latency <= 100 ms. It prints the plane's CPU share and the generator's (each worker's
process CPU time over the step, from getrusage) and how late requests left their due time;
when a worker used more than 70 % of a core the step is not reported as the plane's
result: the bench says the generator saturated and stops. Requests sent late (p99 lag
> 100 ms) by workers with CPU to spare were waiting on the plane: a failed check.
Otherwise it stops at the first step that fails a check and says which. Bounded: steps x
(seconds + drain), the plane and the workers are killed at the end, temp dirs removed.
Exit 0 when every step passed, 1 when the plane failed a check, 2 when the generator saturated.
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import queue
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

P99_TARGET = 0.100
GENERATOR_CPU_MAX = 0.70  # of one core, per worker process
LAG_MAX = 0.100
SENDERS = 32  # threads per worker that send due requests: enough that none waits for a free one


# ---------------------------------------------------------------- worker process

def worker(spec: dict) -> dict:
    """Run runtimes spec["first"]..spec["last"] until spec["until"] (wall clock), then drain
    (polls only) until spec["drain_until"]; the stats as a dict."""
    import requests

    api = spec["base"] + "/api/v1/agent"
    intervals = {"hb": spec["heartbeat"], "poll": spec["poll"], "report": spec["report"]}
    sessions, tokens = {}, {}
    due: list = []  # (when, instance, kind)
    lock = threading.Lock()
    stats = {"lat": [], "lag": [], "status": {}, "errors": [], "by": {}}
    now = time.time()
    for inst in range(spec["first"], spec["last"] + 1):
        heapq.heappush(due, (now + random.uniform(0, spec["poll"]), inst, "register"))
    work: queue.Queue = queue.Queue()

    def call(inst, method, path, body=None, token=None):
        started = time.perf_counter()
        try:
            resp = sessions[inst].request(method, api + path, json=body, timeout=(5, 30),
                                          headers={"Authorization": f"Bearer {token or tokens[inst]}"})
        except requests.RequestException as exc:
            with lock:
                stats["errors"].append(f"{method} {path}: {type(exc).__name__}")
            return None
        took = time.perf_counter() - started
        endpoint = path.rsplit("/", 1)[-1] if path.startswith("/commands/") else path.strip("/")
        with lock:
            stats["lat"].append(took)
            stats["by"].setdefault(endpoint, []).append(took)
            stats["status"][resp.status_code] = stats["status"].get(resp.status_code, 0) + 1
        return resp

    def one(inst, kind):
        agent = f"bench-{inst}-main"
        if kind == "register":
            sessions[inst] = requests.Session()
            resp = call(inst, "POST", "/register", {"instance_id": inst, "agent_id": agent, "agent_version": "bench",
                                                    "protocol_version": "v1"}, token=f"boot-{inst}")
            if resp is None or resp.status_code != 200:
                return False
            tokens[inst] = resp.json()["data"]["session_token"]
        elif kind == "hb":
            call(inst, "POST", "/heartbeat", {"agent_id": agent, "openclaw_status": "running",
                                              "current_config_revision_id": None})
        elif kind == "report":
            call(inst, "POST", "/state/report", {
                "agent_id": agent, "runtime": {"openclaw_status": "running", "openclaw_pid": 1000 + inst,
                                               "current_config_revision_id": None},
                "system_info": {"cpu": {"cores": 2, "load": {"1m": random.random()}}}, "health": {"agent": "ok"}})
        elif kind == "poll":
            resp = call(inst, "GET", "/commands/next")
            command = resp.json()["data"]["command"] if resp is not None and resp.status_code == 200 else None
            if command is not None:
                cid = command["id"]
                call(inst, "POST", f"/commands/{cid}/start", {"agent_id": agent})
                call(inst, "POST", f"/commands/{cid}/finish", {"agent_id": agent, "status": "succeeded",
                                                              "result": {"echo": command["payload"]}})
        return True

    def sender():
        while True:
            item = work.get()
            if item is None:
                return
            when, inst, kind = item
            with lock:
                stats["lag"].append(max(0.0, time.time() - when))
            ok = one(inst, kind)
            nxt = []
            if kind == "register" and ok:
                t = time.time()
                nxt = [(t + random.uniform(0, intervals[k]), inst, k) for k in intervals]
            elif kind != "register":
                nxt = [(when + intervals[kind], inst, kind)]  # on its interval, as a runtime's loop does
            with lock:
                for entry in nxt:
                    heapq.heappush(due, entry)

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(SENDERS)]
    for t in threads:
        t.start()
    cpu0 = _cpu()
    started = time.time()
    while True:
        t = time.time()
        if t >= spec["drain_until"]:
            break
        with lock:
            while due and due[0][0] <= t:
                entry = heapq.heappop(due)
                if entry[2] in ("hb", "report") and t >= spec["until"]:
                    continue  # draining: polls only
                work.put(entry)
            wait = (due[0][0] - t) if due else 0.05
        time.sleep(min(max(wait, 0.001), 0.05))  # a scheduler tick, this process's own loop
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join(timeout=35)
    wall = time.time() - started
    return {"cpu_share": (_cpu() - cpu0) / wall, "lat": stats["lat"], "lag": stats["lag"], "by": stats["by"],
            "status": stats["status"], "errors": stats["errors"][:20], "error_count": len(stats["errors"])}


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# ---------------------------------------------------------------- the parent

def _start_plane(db: Path, args) -> tuple[subprocess.Popen, str]:
    url_file = db.with_suffix(".url")  # one per step: an old one would name a stopped plane
    argv = [sys.executable, "-m", "caldera.cli", "plane", "serve", "--db", str(db), "--host", "127.0.0.1",
            "--port", "0", "--url-file", str(url_file), "--heartbeat-interval", str(int(args.heartbeat)),
            "--poll-interval", str(max(1, int(args.poll)))]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    deadline = time.monotonic() + 30
    while not url_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the plane did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    return proc, url_file.read_text().strip()


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list, pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def step(runtimes: int, args, tmp: Path) -> dict:
    from caldera.plane.store import Store

    db = tmp / f"plane-{runtimes}.db"
    seed = Store(db)
    for i in range(1, runtimes + 1):
        seed.add_instance(i, f"boot-{i}")
    plane, base = _start_plane(db, args)
    drain = max(10.0, 3 * args.poll)
    start = time.time() + 1.0
    until, drain_until = start + args.seconds, start + args.seconds + drain
    per = -(-runtimes // args.workers)
    procs = []
    try:
        for w in range(args.workers):
            first, last = w * per + 1, min(runtimes, (w + 1) * per)
            if first > last:
                continue
            spec = {"base": base, "first": first, "last": last, "until": until, "drain_until": drain_until,
                    "heartbeat": args.heartbeat, "poll": args.poll, "report": args.report}
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                          stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}))
        plane_cpu0, wall0 = _proc_cpu(plane.pid), time.time()
        enqueued = 0
        while time.time() < until:
            seed.enqueue(random.randint(1, runtimes), "collect_system_info", {"n": enqueued})
            enqueued += 1
            time.sleep(1.0 / args.commands_per_second)
        plane_share = (_proc_cpu(plane.pid) - plane_cpu0) / (time.time() - wall0)
        load = os.getloadavg()[0]  # the machine's, over the last minute: others' load shows here
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=drain + 120)
            results.append(json.loads(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        os.killpg(plane.pid, signal.SIGTERM)
        plane.wait(timeout=30)
    rows = seed._read("SELECT status, finish_count FROM commands")
    seed.close()
    lat = [x for r in results for x in r["lat"]]
    lag = [x for r in results for x in r["lag"]]
    by: dict = {}
    for r in results:
        for endpoint, values in r["by"].items():
            by.setdefault(endpoint, []).extend(values)
    statuses: dict = {}
    for r in results:
        for code, n in r["status"].items():
            statuses[int(code)] = statuses.get(int(code), 0) + n
    return {"runtimes": runtimes, "seconds": args.seconds, "requests": len(lat),
            "rate": len(lat) / (args.seconds + drain),
            "p50_ms": _percentile(lat, 50) * 1000, "p95_ms": _percentile(lat, 95) * 1000,
            "p99_ms": _percentile(lat, 99) * 1000, "statuses": statuses,
            "errors": sum(r["error_count"] for r in results),
            "first_errors": [e for r in results for e in r["errors"]][:3],
            "enqueued": enqueued, "commands": len(rows),
            "not_finished": sum(1 for r in rows if r["status"] not in ("succeeded", "failed")),
            "not_once": sum(1 for r in rows if r["finish_count"] != 1),
            "plane_cpu_share": plane_share, "generator_cpu_share_max": max(r["cpu_share"] for r in results),
            "lag_p99_ms": _percentile(lag, 99) * 1000, "loadavg_1m": load, "cores": os.cpu_count(),
            "p99_ms_by_endpoint": {k: round(_percentile(v, 99) * 1000, 1) for k, v in sorted(by.items())}}


def verdict(s: dict) -> tuple[str, str]:
    """("ok" | "plane" | "generator", why). Requests sent late with workers short of CPU
    mean the generator saturated; late with idle workers, every sender was waiting on
    the plane: the plane's lateness, said as such."""
    if s["generator_cpu_share_max"] > GENERATOR_CPU_MAX:
        return "generator", (f"the load generator saturated (a worker used {100 * s['generator_cpu_share_max']:.0f} % "
                             f"of a core, p99 send lag {s['lag_p99_ms']:.0f} ms): not the plane's figure")
    problems = []
    if s["lag_p99_ms"] > LAG_MAX * 1000:
        problems.append(f"requests left {s['lag_p99_ms']:.0f} ms late (p99) with the workers at "
                        f"{100 * s['generator_cpu_share_max']:.0f} % of a core: "
                        "all their senders were waiting on the plane")
    if s["errors"]:
        problems.append(f"{s['errors']} network errors ({s['first_errors']})")
    other = {c: n for c, n in s["statuses"].items() if c != 200}
    if other:
        problems.append(f"non-200 answers {other}")
    if s["not_finished"] or s["not_once"] or s["commands"] != s["enqueued"]:
        problems.append(f"commands: {s['not_finished']} not finished, {s['not_once']} not finished exactly once")
    if s["p99_ms"] > P99_TARGET * 1000:
        problems.append(f"p99 {s['p99_ms']:.0f} ms > {P99_TARGET * 1000:.0f} ms "
                        f"(plane used {100 * s['plane_cpu_share']:.0f} % of a core; p99 by endpoint "
                        f"{s['p99_ms_by_endpoint']}; the machine's load average {s['loadavg_1m']:.1f} on "
                        f"{s['cores']} cores. Using less than a core, the plane's requests wait rather than "
                        "compute: for a core, for the GIL among its thread-per-connection handlers, and for "
                        "the store's one sqlite connection)")
    return ("plane", "; ".join(problems)) if problems else ("ok", "")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="250,500,1000", help="runtime counts, in order")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", type=int, default=4, help="load generator processes")
    parser.add_argument("--heartbeat", type=float, default=15.0, help="heartbeat interval (s), the plane's default")
    parser.add_argument("--poll", type=float, default=5.0, help="command poll interval (s), the plane's default")
    parser.add_argument("--report", type=float, default=5.0, help="state report interval (s), the runtime's default")
    parser.add_argument("--commands-per-second", type=float, default=5.0)
    args = parser.parse_args()
    code = 0
    with tempfile.TemporaryDirectory(prefix="bench-plane-load-") as name:
        for runtimes in (int(n) for n in args.steps.split(",")):
            s = step(runtimes, args, Path(name))
            kind, why = verdict(s)
            print(f"{runtimes} runtimes, {s['seconds']:g} s (heartbeat {args.heartbeat:g} s, poll {args.poll:g} s, "
                  f"report {args.report:g} s): {s['requests']} requests ({s['rate']:.0f}/s), p50 {s['p50_ms']:.1f} ms, "
                  f"p95 {s['p95_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms; plane CPU {100 * s['plane_cpu_share']:.0f} % "
                  f"of a core; generator: {args.workers} processes, max {100 * s['generator_cpu_share_max']:.0f} % "
                  f"of a core each, p99 send lag {s['lag_p99_ms']:.1f} ms; commands {s['commands']}/{s['enqueued']}, "
                  f"errors {s['errors']}, statuses {dict(sorted(s['statuses'].items()))}")
            print(json.dumps({"bench": "plane-load", **{k: (round(v, 3) if isinstance(v, float) else v)
                                                         for k, v in s.items() if k != "first_errors"},
                              "verdict": kind}))
            if kind != "ok":
                print(f"stops at {runtimes} runtimes: {why}")
                code = 2 if kind == "generator" else 1
                break
            print(f"{runtimes} runtimes: PASS (0 errors, every command finished once, p99 <= 100 ms)")
    return code


if __name__ == "__main__":
    sys.exit(main())
