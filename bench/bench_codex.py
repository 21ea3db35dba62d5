"""Benchmarks of the Codex backend (printed as numbers and ratios measured in one run).

1. Normalisation throughput: a 100,000-line app-server stream (built from the message
   shapes of a recorded real tool turn: deltas, items, diffs, usage) through the whole
   path a run uses: the real reader thread body hands whole-line blocks to a Channel,
   whose Dispatcher (run log, parse, route) -> Normalizer -> EventSink (redaction, caps)
   -> RunLog (redacted transcript on disk) run on the consuming thread, as in a turn;
   fed through a pipe. Target >= 150,000 lines per CPU second (issue 16), memory flat; printed
   beside json.loads alone on the same lines.
2. Overhead on a real minimal turn against the local fake provider: caldera's
   `service.execute` vs a bare script driving `codex app-server` itself (both with a
   fresh CODEX_HOME each time). Target <= 1.15x. Needs CALDERA_CODEX_BIN.
3. What caldera's bubblewrap around the app-server costs (issue 43): the same caldera turn
   with it and without it (`codex/sandbox.plan(confined=False)`), interleaved with the two
   above. Target <= 1.1x.

Usage: python bench/bench_codex.py [--lines N] [--turns N]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "backends"))

from caldera.backends.codex.appserver import Channel, pump_stdout  # noqa: E402
from caldera.backends.codex.backend import handle_batch  # noqa: E402
from caldera.backends.codex.normalize import Normalizer  # noqa: E402
from caldera.backends.events import EventSink  # noqa: E402
from caldera.backends.runlog import RunLog  # noqa: E402
from caldera.redact import Redactor  # noqa: E402

CANARY = "sk-fake-LEAKCANARY-0123456789abcdef"
TARGET_LINES = 150_000


def stream(lines: int):
    """Lines shaped like a real turn's transcript, repeated with fresh ids."""
    t, u = "01a237bf-2cae-7923-9fd1-144d1d7663fa", "01a237bf-2cc4-7943-bde8-159400cf9fa3"
    n = 0
    cycle = 0
    while n < lines:
        cycle += 1
        c, m = f"call_{cycle}", f"msg_{cycle}"
        block = [
            {"method": "item/started", "params": {"item": {"type": "commandExecution", "id": c,
                                                           "command": "/bin/bash -lc 'make test'", "cwd": "/w",
                                                           "status": "inProgress"}, "threadId": t, "turnId": u}},
            *({"method": "item/commandExecution/outputDelta",
               "params": {"threadId": t, "turnId": u, "itemId": c, "delta": f"line {i} of test output ok\n"}}
              for i in range(20)),
            {"method": "item/completed", "params": {"item": {"type": "commandExecution", "id": c, "status": "completed",
                                                             "command": "/bin/bash -lc 'make test'", "exitCode": 0,
                                                             "aggregatedOutput": "ok\n" * 40, "durationMs": 12},
                                                    "threadId": t, "turnId": u}},
            {"method": "turn/diff/updated", "params": {"threadId": t, "turnId": u,
                                                       "diff": "diff --git a/x b/x\n-old\n+new\n" * 10}},
            {"method": "item/started", "params": {"item": {"type": "agentMessage", "id": m, "text": ""}}},
            *({"method": "item/agentMessage/delta",
               "params": {"threadId": t, "turnId": u, "itemId": m, "delta": "Hello from the fake "}}
              for _ in range(25)),
            {"method": "item/completed", "params": {"item": {"type": "agentMessage", "id": m,
                                                             "text": "Hello from the fake model. " * 20}}},
            {"method": "thread/tokenUsage/updated", "params": {"tokenUsage": {"total": {"totalTokens": 15}}}},
            {"method": "account/rateLimits/updated", "params": {"rateLimits": {"limitId": "codex"}}},
        ]
        for msg in block:
            msg["emittedAtMs"] = 1796231601650
            yield (json.dumps(msg, separators=(",", ":")) + "\n").encode()
            n += 1
            if n >= lines:
                return


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def bench_normalise(lines: int) -> dict:
    """The stream through a pipe, as codex writes it: a feeder thread writes, the real reader
    thread body (pump_stdout) reads and hands whole-line blocks over, this thread takes them
    from the Channel as the turn loop does (parse and run log -> handle_batch -> Normalizer
    -> EventSink -> RunLog). Lines per second of this process's CPU time (all three threads),
    so other loads on the machine do not count."""
    data = b"".join(stream(lines))
    with tempfile.TemporaryDirectory(prefix="bench-codex-") as tmp:
        redactor = Redactor([CANARY, "another-secret-value-42", "gw-key-0123456789"])
        log = RunLog(Path(tmp) / "run-bench.log", redactor)
        sink = EventSink("bench", redactor, log)
        norm = Normalizer(sink)
        channel = Channel(log)
        read_fd, write_fd = os.pipe()

        def feed():
            view = memoryview(data)
            for at in range(0, len(view), 65536):
                os.write(write_fd, view[at:at + 65536])
            os.close(write_fd)

        rss = [_rss_kib()]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        feeder = threading.Thread(target=feed, daemon=True)
        reader = threading.Thread(target=pump_stdout, args=(os.fdopen(read_fd, "rb"), channel.reader_end),
                                  daemon=True)
        feeder.start()
        reader.start()
        batches = 0
        while True:
            kind, msg = channel.next(timeout=None)
            if kind == "eof":
                break
            if kind == "batch":
                batches += 1
                handle_batch(msg, norm, lambda request: None)
                if batches % 50 == 0:
                    rss.append(_rss_kib())
            elif kind == "fatal":
                raise SystemExit(f"bench stream refused: {msg}")
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        feeder.join()
        reader.join()
        rss.append(_rss_kib())
        log.close()
        log_bytes = (Path(tmp) / "run-bench.log").stat().st_size
        leaked = CANARY in (Path(tmp) / "run-bench.log").read_text()
    quarter = rss[len(rss) // 4]
    return {"lines": lines, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "lines_per_cpu_s": int(lines / cpu),
            "lines_per_wall_s": int(lines / wall), "events": sink.total, "log_bytes": log_bytes,
            "rss_kib_quarter_to_end": [quarter, rss[-1]], "canary_in_log": leaked}


def bench_json_floor(lines: int) -> int:
    """json.loads alone over the same lines, in lines per CPU second."""
    texts = [raw.decode() for raw in stream(lines)]
    cpu0 = time.process_time()
    for text in texts:
        json.loads(text)
    return int(lines / (time.process_time() - cpu0))


# ---------------------------------------------------------------- overhead

def write_bare_home(home: Path, base_url: str) -> None:
    """A bare CODEX_HOME's config.toml: the fake provider (its key in $K), no retries, nothing
    optional (plugins, apps, analytics) — what caldera's private CODEX_HOME turns off too."""
    (home / "config.toml").write_text(
        f'model = "gpt-5.5"\nmodel_provider = "fake"\n[model_providers.fake]\nname = "F"\nbase_url = "{base_url}"\n'
        f'env_key = "K"\nwire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
        '[features]\nunbounded_connection_retries = false\nplugins = false\nremote_plugin = false\n'
        'apps = false\ntool_suggest = false\n[analytics]\nenabled = false\n')


@contextlib.contextmanager
def unconfined(confined: bool = False) -> Iterator[None]:
    """Caldera's Codex turns inside it run without caldera's box (`sandbox.plan(confined=False)`)
    unless `confined`: what the box costs, apart."""
    from caldera.backends.codex import sandbox

    real = sandbox.plan

    def plan(*args: Any, **kw: Any) -> Any:
        return real(*args, **{**kw, "confined": confined and kw.get("confined", True)})
    sandbox.plan = plan
    try:
        yield
    finally:
        sandbox.plan = real


def _bare_turn(binary: str, base_url: str, key: str, ws: str, tmp: Path) -> float:
    """Spawn -> initialize -> thread/start -> turn/start -> turn/completed -> exit, nothing else."""
    started = time.perf_counter()
    home = tempfile.mkdtemp(dir=tmp)
    write_bare_home(Path(home), base_url)
    proc = subprocess.Popen([binary, "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=ws,
                            env={"PATH": os.environ["PATH"], "HOME": home, "CODEX_HOME": home, "K": key,
                                 "LANG": "C.UTF-8"})

    def send(obj):
        proc.stdin.write((json.dumps(obj) + "\n").encode())
        proc.stdin.flush()

    def until(pred):
        for line in proc.stdout:
            msg = json.loads(line)
            if pred(msg):
                return msg
        raise RuntimeError("codex exited")

    send({"method": "initialize", "id": 1, "params": {"clientInfo": {"name": "bare", "title": "b", "version": "1"},
                                                      "capabilities": None}})
    until(lambda m: m.get("id") == 1)
    send({"method": "initialized"})
    send({"method": "thread/start", "id": 2, "params": {"cwd": ws, "approvalPolicy": "never",
                                                        "sandbox": "workspace-write", "ephemeral": True}})
    thread = until(lambda m: m.get("id") == 2)["result"]["thread"]["id"]
    send({"method": "turn/start", "id": 3, "params": {"threadId": thread, "input": [
        {"type": "text", "text": "hi", "text_elements": []}]}})
    until(lambda m: m.get("method") == "turn/completed")
    proc.stdin.close()
    proc.wait(10)
    return time.perf_counter() - started


def _caldera_turn(binary: str, base_url: str, key: str, tmp: Path, n: int, confined: bool = True) -> float:
    from backends_helpers import environment, execute, request, write_projection

    started = time.perf_counter()
    root = tmp / f"c{n}{'' if confined else 'u'}"
    root.mkdir()
    sec = write_projection(root, base_url=base_url, key=key)
    env = environment(root, binary, sec)
    with unconfined(confined):
        result, events = execute(request(tmp / "ws", run_id=f"b{n}"), env)
    assert result["status"] == "completed", result
    assert events[0]["data"]["commands"].startswith("confined") == confined, events[0]
    return time.perf_counter() - started


def bench_overhead(turns: int) -> dict | None:
    binary = os.environ.get("CALDERA_CODEX_BIN")
    if not binary:
        return None
    from backends_fake_provider import FakeProvider

    bare, ours, unconfined = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-codex-turns-") as name, \
            FakeProvider([{"text": "Hello from the fake model."}]) as provider:
        tmp = Path(name)
        (tmp / "ws").mkdir()
        _bare_turn(binary, provider.url, CANARY, str(tmp / "ws"), tmp)  # warm the page cache
        for n in range(turns):  # interleaved, so drift hits both alike
            bare.append(_bare_turn(binary, provider.url, CANARY, str(tmp / "ws"), tmp))
            ours.append(_caldera_turn(binary, provider.url, CANARY, tmp, n))
            unconfined.append(_caldera_turn(binary, provider.url, CANARY, tmp, n, confined=False))
    b, o, u = statistics.median(bare), statistics.median(ours), statistics.median(unconfined)
    return {"turns": turns, "bare_median_s": round(b, 3), "caldera_median_s": round(o, 3), "ratio": round(o / b, 3),
            "unconfined_median_s": round(u, 3), "sandbox_ratio": round(o / u, 3)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=100000)
    parser.add_argument("--turns", type=int, default=7)
    args = parser.parse_args()
    norm = bench_normalise(args.lines)
    floor = bench_json_floor(args.lines)
    ok = norm["lines_per_cpu_s"] >= TARGET_LINES and not norm["canary_in_log"]
    print(f"normalise: {norm['lines']} lines, run log and redaction on: {norm['lines_per_cpu_s']} lines per CPU s "
          f"(target >= {TARGET_LINES}; wall {norm['lines_per_wall_s']} lines/s); "
          f"json.loads alone {floor} lines per CPU s ({norm['lines_per_cpu_s'] / floor:.2f} x of it); "
          f"events {norm['events']}, run log {norm['log_bytes']} bytes, secret in the log: {norm['canary_in_log']}; "
          f"RSS KiB at a quarter vs at the end {norm['rss_kib_quarter_to_end']}")
    print(json.dumps({"bench": "codex-normalise", **norm, "json_loads_lines_per_cpu_s": floor,
                      "target": TARGET_LINES, "ok": ok}))
    over = bench_overhead(args.turns)
    if over is None:
        print("overhead: skipped (set CALDERA_CODEX_BIN)")
    else:
        print(f"overhead: bare codex turn {over['bare_median_s']} s, caldera turn {over['caldera_median_s']} s, "
              f"ratio {over['ratio']} (target <= 1.15), median of {over['turns']}")
        print(f"sandbox: caldera turn without its bubblewrap {over['unconfined_median_s']} s, with it "
              f"{over['caldera_median_s']} s, ratio {over['sandbox_ratio']} (target <= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
