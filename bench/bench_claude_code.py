"""Claude Code behind caldera, printed as numbers and ratios measured in one run.

1. Overhead of a turn over the CLI alone. The same one-line prompt against the same local
   fake Anthropic provider (a child process: its work counts on neither side), after a
   warm-up, interleaved round by round:
   a. caldera: `service.execute` with backend_profile claude-code (projection, forwarder,
      settings, sandbox, stream-json, workspace snapshot and diff, run log, cleanup);
   b. the CLI alone, as a person runs it: `claude -p PROMPT --output-format stream-json
      --verbose`, the key in its environment;
   c. the CLI alone with caldera's argv and settings (the bubblewrap sandbox, the policy's
      tools, stream-json on stdin), driven by a bare loop: what of (a) is the CLI's own work
      under caldera's policy.
   CPU is user+sys: for (a) this process's (RUSAGE_SELF: the turn loop, the readers, the
   forwarder, redaction, the run log) plus its reaped children's (claude and what it ran);
   for (b) and (c) the children's. Wall beside it. Ratios of medians: a/b (the issue's) and a/c.
2. Memory over a long stream: one turn of ROUNDS model answers, each a text of TEXT bytes in
   16-byte deltas (the SSE passes through caldera's forwarder) and a Bash command printing
   OUTPUT bytes (its result comes back on the CLI's stdout); the RSS of this process (caldera's
   side: the CLI is a child) at the turn's start (the CLI's session_started), every second,
   and at its end (terminal_status).

Usage: CALDERA_CLAUDE_CODE_BIN=... python bench/bench_claude_code.py [--turns N] [--rounds N]
       [--text BYTES] [--output BYTES]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "backends")]

from caldera.backends import base, service  # noqa: E402
from caldera.backends.claude_code import config as cc  # noqa: E402
from caldera.redact import Redactor  # noqa: E402

KEY = "sk-ant-bench-0123456789abcdef"
PROMPT = "Say hello"


# -- the provider, in a child process ----------------------------------------------------

def serve(spec: dict) -> None:
    """The child: a FakeAnthropic for `spec`, its URL on stdout, until stdin closes."""
    from backends_fake_anthropic import FakeAnthropic

    with FakeAnthropic(script(spec)) as provider:
        print(provider.url, flush=True)
        sys.stdin.read()


def script(spec: dict) -> list[dict]:
    if spec["mode"] == "text":
        return [{"text": "Hello from the fake model."}]
    text = ("All work and no play makes a long stream. " * (spec["text"] // 40 + 1))[:spec["text"]]
    command = f"python3 -c 'print(\"x\" * {spec['output']})'"
    rounds = [{"text": text, "tool": "Bash", "input": {"command": command, "description": "print"}}
              for _ in range(spec["rounds"])]
    return [{"text": "warm-up"}, *rounds, {"text": "done"}]  # the first turn is the warm-up


class Provider:
    def __init__(self, spec: dict):
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# -- the three ways of running a turn -------------------------------------------------------

def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def measured(run) -> tuple[float, float, float]:
    """(wall, own CPU, children's CPU) of run()."""
    self0, child0, wall0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    run()
    return (time.perf_counter() - wall0, _cpu(resource.RUSAGE_SELF) - self0,
            _cpu(resource.RUSAGE_CHILDREN) - child0)


def caldera_environment(binary: str, url: str, tmp: Path) -> base.Environment:
    env_dir = tmp / "secrets" / "claude-code" / "env"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "ANTHROPIC_API_KEY").write_text(KEY)
    (env_dir / "ANTHROPIC_BASE_URL").write_text(url)
    return base.Environment(redactor=Redactor(), logs_dir=str(tmp / "logs"), runs_dir=str(tmp / "runs"),
                            secrets_dir=str(tmp / "secrets"),
                            env={"PATH": os.environ["PATH"], "CALDERA_CLAUDE_CODE_BIN": binary,
                                 "CALDERA_CLAUDE_CODE_MAX_RETRIES": "0"})


@contextlib.contextmanager
def workdir(binary: str, url: str) -> Iterator[tuple[Path, Path, base.Environment]]:
    """A temporary dir, its workspace, and caldera's environment (projection, logs, runs) in it."""
    with tempfile.TemporaryDirectory(prefix="bench-cc-") as name:
        tmp = Path(name)
        (tmp / "ws").mkdir()
        yield tmp, tmp / "ws", caldera_environment(binary, url, tmp)


def caldera_turn(environment: base.Environment, ws: Path, run_id: str, listeners=()) -> dict:
    result = service.execute({"run_id": run_id, "prompt": PROMPT, "workspace": str(ws),
                              "backend_profile": "claude-code", "execution_policy": {"timeout_seconds": 3600}},
                             environment, roots=None, listeners=list(listeners))
    assert result["status"] == "completed", result
    return result


def bare_env(url: str, tmp: Path) -> dict[str, str]:
    home = tmp / "bare-home"
    (home / ".claude").mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(tmp), "LANG": "C.UTF-8",
            "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": KEY, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0"}


def bare_turn(binary: str, url: str, tmp: Path, ws: Path, extra: tuple[str, ...] = ()) -> bytes:
    """`claude -p` as a person runs it (`extra`: more arguments); its stdout."""
    return subprocess.run([binary, "-p", PROMPT, "--output-format", "stream-json", "--verbose", *extra],
                          env=bare_env(url, tmp), cwd=str(ws), capture_output=True, check=True, timeout=120).stdout


def policy_turn(binary: str, url: str, tmp: Path, ws: Path) -> None:
    """The CLI with caldera's argv and settings, driven over stdin by a bare loop."""
    policy = base.Policy(timeout_seconds=600)
    settings = tmp / "bare-home" / ".claude" / "settings.json"
    env = bare_env(url, tmp)
    settings.write_text(json.dumps(cc.policy_settings(policy, str(ws), cc.confine([], [str(ws)]), {})))
    proc = subprocess.Popen(cc.argv(binary, policy, str(settings), None), env=env, cwd=str(ws),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    for message in ({"type": "control_request", "request_id": "init_1", "request": {"subtype": "initialize"}},
                    {"type": "user", "session_id": "", "parent_tool_use_id": None,
                     "message": {"role": "user", "content": [{"type": "text", "text": PROMPT}]}}):
        proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if json.loads(line).get("type") == "result":
            break
    proc.stdin.close()
    proc.wait(timeout=30)


def bench_overhead(binary: str, turns: int) -> dict:
    provider = Provider({"mode": "text"})
    try:
        with workdir(binary, provider.url) as (tmp, ws, environment):
            sides = {"caldera": lambda n: caldera_turn(environment, ws, f"bench-{n}"),
                     "bare": lambda n: bare_turn(binary, provider.url, tmp, ws),
                     "policy": lambda n: policy_turn(binary, provider.url, tmp, ws)}
            for run in sides.values():  # warm-up: page cache, imports
                run(-1)
            samples: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
            for n in range(turns):
                for side, run in sides.items():
                    wall, own, children = measured(lambda: run(n))  # noqa: B023 -- called at once
                    samples[side].append((wall, own + children))
    finally:
        provider.close()
    med = {side: (statistics.median(s[0] for s in runs), statistics.median(s[1] for s in runs))
           for side, runs in samples.items()}
    out: dict = {"bench": "claude-code-overhead", "turns": turns}
    for side, (wall, cpu) in med.items():
        out[f"{side}_wall_s"], out[f"{side}_cpu_s"] = round(wall, 3), round(cpu, 3)
    out["ratio"] = round(med["caldera"][1] / med["bare"][1], 2)  # CPU, the figure
    out["wall_ratio"] = round(med["caldera"][0] / med["bare"][0], 2)
    out["ratio_over_policy_cli"] = round(med["caldera"][1] / med["policy"][1], 2)
    out["wall_ratio_over_policy_cli"] = round(med["caldera"][0] / med["policy"][0], 2)
    out["ok"] = True  # printed, no target (docs/performance.md, section 8)
    return out


# -- memory over a long stream ----------------------------------------------------------------

def rss_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def bench_memory(binary: str, rounds: int, text: int, output: int) -> dict:
    from backends_fake_anthropic import message_events

    spec = {"mode": "long", "rounds": rounds, "text": text, "output": output}
    sse = sum(len(b"".join(message_events(entry, 0, "claude-opus-5-5"))) for entry in script(spec))
    provider = Provider(spec)
    marks: dict[str, int] = {}
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            samples.append(rss_kib())

    def listen(event: dict) -> None:
        if event["data"].get("phase") == "session_started":
            marks["start"] = rss_kib()
        elif event["type"] == "terminal_status":
            marks["end"] = rss_kib()

    try:
        with workdir(binary, provider.url) as (_, ws, environment):
            caldera_turn(environment, ws, "warm-up")  # imports, first allocations
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            wall0, cpu0 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
            result = caldera_turn(environment, ws, "long", [listen])
            wall, cpu = time.perf_counter() - wall0, _cpu(resource.RUSAGE_SELF) - cpu0
            done.set()
            sampler.join()
            log_bytes = Path(result["log"]).stat().st_size
    finally:
        provider.close()
    return {"bench": "claude-code-memory", "rounds": rounds, "sse_mb": round(sse / 1e6, 1),
            "run_log_mb": round(log_bytes / 1e6, 1), "events": result["events_total"], "wall_s": round(wall, 1),
            "caldera_cpu_s": round(cpu, 2), "rss_kib_start": marks["start"], "rss_kib_end": marks["end"],
            "rss_kib_peak": max(samples + [marks["end"]]),
            "rss_kib_quarters": [samples[len(samples) * q // 4] for q in (1, 2, 3)] if samples else [],
            "rss_ratio": round(marks["end"] / marks["start"], 3),
            "ok": marks["end"] <= 1.1 * marks["start"], "target": "flat (end <= 1.1 x start)"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--text", type=int, default=64 * 1024, help="bytes of text per model answer")
    parser.add_argument("--output", type=int, default=8 * 1024, help="bytes each Bash command prints")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve))
        return 0
    binary = os.environ.get("CALDERA_CLAUDE_CODE_BIN")
    if not binary:
        print("claude-code: skipped (set CALDERA_CLAUDE_CODE_BIN: .ci/install-claude-code.sh)")
        return 0
    if not args.skip_overhead:
        print_overhead(bench_overhead(binary, args.turns))
    if not args.skip_memory:
        print_memory(bench_memory(binary, args.rounds, args.text, args.output))
    return 0


def print_overhead(over: dict) -> None:
    print(f"claude-code turn, median of {over['turns']}, interleaved: caldera {over['caldera_cpu_s']} s CPU "
          f"({over['caldera_wall_s']} s wall); bare claude -p {over['bare_cpu_s']} s CPU "
          f"({over['bare_wall_s']} s wall) "
          f"= {over['ratio']}x CPU, {over['wall_ratio']}x wall; the CLI alone with caldera's argv and settings "
          f"{over['policy_cpu_s']} s CPU ({over['policy_wall_s']} s wall) = {over['ratio_over_policy_cli']}x CPU, "
          f"{over['wall_ratio_over_policy_cli']}x wall")
    print(json.dumps(over))


def print_memory(mem: dict) -> None:
    print(f"claude-code long stream: {mem['rounds']} rounds, {mem['sse_mb']} MB of SSE through the forwarder, "
          f"{mem['events']} events, run log {mem['run_log_mb']} MB, {mem['wall_s']} s; caldera's RSS "
          f"{mem['rss_kib_start']} KiB at the start, {mem['rss_kib_end']} KiB at the end "
          f"({mem['rss_ratio']}x), peak {mem['rss_kib_peak']} KiB, at each quarter {mem['rss_kib_quarters']} KiB; "
          f"caldera's CPU {mem['caldera_cpu_s']} s")
    print(json.dumps(mem))


if __name__ == "__main__":
    sys.exit(main())
