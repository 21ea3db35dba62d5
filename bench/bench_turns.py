"""A turn through caldera against its CLI alone, per backend, in one table (issue 41, point 3).

For each real CLI, on the same local fake provider (the tests' fakes, each in a child process
of its own so its work counts on no side), interleaved round by round (the sides of one
backend and kind of turn one after the other, their order swapped every round, so the
machine's load hits them alike), two kinds of turn:
  one-line     the model answers a text;
  one-command  the model calls its shell tool once (`echo`), then answers a text.
Sides:
  codex        caldera's turn (`service.execute`: `codex app-server` in caldera's bubblewrap)
               against `codex exec --json -s workspace-write` with a fresh CODEX_HOME (as
               caldera's run has); and caldera's turn without its box (`sandbox.plan(confined=
               False)`), to show what the box costs apart; and caldera's turn with the run's
               Codex making its state databases itself (before codex/seed.py made them once),
               and `codex exec` with them made ahead too (caldera's CODEX_HOME, like for like);
  claude-code  caldera's turn against `claude -p PROMPT --output-format stream-json --verbose
               [--allowedTools Bash]`, the key in its environment; and the CLI with caldera's
               argv and settings (its bubblewrap sandbox for commands) driven by a bare loop;
  opencode     caldera's later turn on the agent's running `opencode serve` (how the daemon
               drives it: one `ServerOwner` per agent) against `opencode run --format json`
               (a process per turn, server start included), and against a bare turn on a
               bare `opencode serve` started once and driven directly over its HTTP API
               (`POST /session`, `POST /session/{id}/message`, which answers when the turn
               ends; `DELETE /session/{id}`): the like-for-like floor of caldera's turn.
CPU is user+system of the whole process tree: for a CLI alone its reaped children's (the CLI
and what it waited for); for caldera this process's own (turn loop, readers, forwarder,
normaliser, run log) plus its reaped children's (the CLI, bubblewrap), and for a server (caldera's
or the bare one) the server's own and its waited-for children's (/proc/PID/stat) over the turn.
Ratios are caldera / CLI alone of the medians; p90 beside them.

Memory (`--memory-turns N`, default 100): per backend, in a fresh child process, caldera's side
driven as the daemon's `agent_run` drives it (`service.execute`, the agent's servers kept
between runs): its RSS and PSS after three warm-up one-command turns, its peak during one more
turn, and after N more turns (the growth per N turns).

Needs CALDERA_CODEX_BIN, CALDERA_CLAUDE_CODE_BIN, CALDERA_OPENCODE_BIN (.ci/install-*.sh);
a backend whose binary is missing is left out and said so.

Usage: python bench/bench_turns.py [--rounds 10] [--memory-turns 100] [--backends codex,claude-code,opencode]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "backends"), str(ROOT / "tests" / "backends" / "opencode"),
                str(ROOT / "bench")]

import bench_claude_code as bcc  # noqa: E402
import bench_codex  # noqa: E402
import bench_opencode as boc  # noqa: E402
import requests  # noqa: E402
from bench_many import BACKENDS, Agent  # noqa: E402

from caldera.backends import base, service  # noqa: E402
from caldera.backends.codex import seed as codex_seed  # noqa: E402

MARK = "bench-turn-ok"
KINDS = ("one-line", "one-command")
PROMPT = "Run echo"


def script(backend: str, kind: str) -> list[dict[str, Any]]:
    if kind == "one-line":
        return [{"text": "Hello from the fake model."}]
    return [BACKENDS[backend][2](f"echo {MARK}"), {"text": "done"}]


# -- the providers, each in a child process ------------------------------------------------------

def serve(backend: str) -> None:
    """The child: the backend's fake; its URL on stdout; each line on stdin names the kind of
    the next turn: its script from the next request on (one URL: OpenCode's server keeps it)."""
    with BACKENDS[backend][1](script(backend, "one-line")) as provider:
        print(provider.url, flush=True)
        for line in sys.stdin:
            with provider.lock:
                provider.script = script(backend, line.strip())
                provider.requests.clear()
                if hasattr(provider, "_offset"):
                    provider._offset = 0
            print("ok", flush=True)


class Provider(bcc.Provider):  # its close(): stdin closed, the child waited for
    def __init__(self, backend: str):
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", backend],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def reset(self, kind: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"


# -- measuring --------------------------------------------------------------------------------------

cpu = bcc._cpu  # user + system of RUSAGE_SELF or RUSAGE_CHILDREN


def tree_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of a process (a server: itself and what it waited for)."""
    return boc._proc_cpu(pid)


def subreaper() -> None:
    """Orphans of this process's tree become its children (PR_SET_CHILD_SUBREAPER): bubblewrap's
    outer process exits without reaping the namespace's first process, so the CPU of what ran
    inside (the app-server in caldera's box) would reach no one's RUSAGE_CHILDREN."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise SystemExit(f"prctl(PR_SET_CHILD_SUBREAPER): errno {ctypes.get_errno()}")


def children() -> set[int]:
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as fh:
            found.update(int(pid) for pid in fh.read().split())
    return found


def reap_adopted(before: set[int], wait: float = 0.5) -> None:
    """Reap the orphans adopted during a turn (their CPU then counts); one still alive after
    `wait` is a server caldera started and keeps (its owner reaps it)."""
    stop, deadline = threading.Event(), time.monotonic() + wait
    pending = children() - before
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            pending.discard(pid)
        if pending:
            stop.wait(0.01)


def measure(run: Callable[[], None], server: Callable[[], int] | None = None, own: bool = True) -> tuple[float, float]:
    """(wall, CPU) of run(): reaped children's CPU, this process's if `own`, a server's if given."""
    pid = server() if server else 0
    s0 = tree_cpu(pid) if pid else 0.0
    before = children()
    self0, child0, wall0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    run()
    wall = time.perf_counter() - wall0
    reap_adopted(before)
    used = cpu(resource.RUSAGE_CHILDREN) - child0 + (cpu(resource.RUSAGE_SELF) - self0 if own else 0.0)
    return wall, used + (tree_cpu(pid) - s0 if pid else 0.0)


def caldera_turn(agent: Agent, env: base.Environment, backend: str, kind: str, run_id: str) -> None:
    events: list[dict[str, Any]] = []
    request = {"run_id": run_id, "prompt": PROMPT, "workspace": str(agent.workspaces[backend]),
               "backend_profile": backend, "execution_policy": {"timeout_seconds": 300}}
    result = service.execute(request, env, roots=None, listeners=[events.append])
    if result["status"] != "completed":
        raise SystemExit(f"caldera {backend} turn failed: {result.get('failure_kind')}: {result.get('message')}")
    output = "".join(e["data"].get("output", "") for e in events if e["type"] == "command_output")
    if kind == "one-command" and MARK not in output:
        raise SystemExit(f"caldera {backend} turn ran no command: {output[-300:]!r}")


@contextlib.contextmanager
def databases_by_codex() -> Iterator[None]:
    """Caldera's Codex turn as before codex/seed.py: the run's Codex makes its own databases."""
    saved = codex_seed.seed_home
    codex_seed.seed_home = lambda binary, home, note=None: False
    try:
        yield
    finally:
        codex_seed.seed_home = saved


# -- the CLIs alone ---------------------------------------------------------------------------------

@contextlib.contextmanager
def codex_home_dir() -> Iterator[Path]:
    """A dir for fresh CODEX_HOMEs (as caldera's run has), outside /tmp: Codex refuses to make
    its helper aliases (`codex-linux-sandbox`, its commands' sandbox) under a temporary dir."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-turns-codex-home-", dir=cache) as name:
        yield Path(name)


def codex_exec(binary: str, url: str, ws: Path, kind: str, seeded: bool = False) -> None:
    """`seeded`: its CODEX_HOME with the state databases made ahead, as caldera's run has them."""
    with codex_home_dir() as home:
        bench_codex.write_bare_home(home, url)
        if seeded:
            codex_seed.seed_home(binary, home)
        out = _codex_exec(binary, home, ws)
    _check(b"turn.completed" in out and (kind == "one-line" or MARK.encode() in out), "codex exec", out)


def codex_app_server(binary: str, url: str, ws: Path) -> None:
    """A bare loop driving `codex app-server` (bench_codex's: initialize, thread/start,
    turn/start, turn/completed, stdin closed, its exit waited for): caldera's protocol alone."""
    with codex_home_dir() as homes:
        bench_codex._bare_turn(binary, url, bench_codex.CANARY, str(ws), homes)


def _codex_exec(binary: str, home: Path, ws: Path) -> bytes:
    return subprocess.run([binary, "exec", "--json", "--skip-git-repo-check", "-s", "workspace-write", PROMPT],
                          cwd=str(ws), env={"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home),
                                            "K": bench_codex.CANARY, "LANG": "C.UTF-8"},
                          stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=120).stdout


def claude_p(binary: str, url: str, ws: Path, tmp: Path, kind: str) -> None:
    out = bcc.bare_turn(binary, url, tmp, ws, () if kind == "one-line" else ("--allowedTools", "Bash"))
    _check(b'"type":"result"' in out and (kind == "one-line" or MARK.encode() in out), "claude -p", out)


def _check(ok: bool, what: str, out: bytes) -> None:
    if not ok:
        raise SystemExit(f"{what} did not answer as expected: {out[-500:]!r}")


def _drain(lines: Iterator[bytes]) -> None:
    """Read a subscriber's event stream until it is closed under it (the turn's end)."""
    with contextlib.suppress(AttributeError, OSError, requests.RequestException):
        collections.deque(lines, 0)


class BareServe:
    """A bare `opencode serve` (no caldera: no password, no sandbox, no forwarder), its turns
    over HTTP: the floor of a turn on a running server."""

    def __init__(self, binary: str, url: str, tmp: Path):
        self.env = boc.private_env(url, tmp / "bare-serve")
        self.proc = subprocess.Popen([binary, "serve", "--hostname", "127.0.0.1", "--port", "0", "--pure"],
                                     cwd=str(tmp / "bare-serve"), env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            if "listening on http://" in line:
                self.base = line.split("listening on ", 1)[1].strip()
                break
        else:
            raise SystemExit("bare opencode serve exited before listening")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.http = requests.Session()

    def turn(self, ws: Path, kind: str, as_caldera: bool = False) -> None:
        """One turn; `as_caldera`: with what caldera's protocol adds on the server's side (its
        health check, and the turn's events streamed to a subscriber while it runs)."""
        if not as_caldera:
            return self._turn(ws, kind)
        assert self.http.get(f"{self.base}/global/health", timeout=60).json().get("healthy") is True
        with requests.get(f"{self.base}/event", params={"directory": str(ws)}, stream=True, timeout=60) as events:
            lines = events.iter_lines()
            next(lines)  # server.connected: subscribed before the prompt, as caldera is
            reader = threading.Thread(target=_drain, args=(lines,), daemon=True)
            reader.start()
            self._turn(ws, kind)
        reader.join(timeout=5)

    def _turn(self, ws: Path, kind: str) -> None:
        params = {"directory": str(ws)}
        # titled: an untitled session asks the model for a title, which would take the script's first answer
        created = self.http.post(f"{self.base}/session", params=params, json={"title": "bench"}, timeout=60)
        session = created.json()["id"]
        body = {"parts": [{"type": "text", "text": PROMPT}], "model": {"providerID": "fake", "modelID": "fake-model"}}
        answer = self.http.post(f"{self.base}/session/{session}/message", params=params, json=body, timeout=120)
        answer.raise_for_status()
        if kind == "one-command":  # the command's output is in the session's messages
            messages = self.http.get(f"{self.base}/session/{session}/message", params=params, timeout=60)
            _check(MARK.encode() in messages.content, "bare opencode serve (its command)", messages.content)
        self.http.delete(f"{self.base}/session/{session}", params=params, timeout=60)
        _check(answer.json().get("info", {}).get("role") == "assistant", "bare opencode serve", answer.content)

    def close(self) -> None:
        self.http.close()
        os.killpg(self.proc.pid, 15)
        self.proc.wait(timeout=30)


# -- the sides of each backend ------------------------------------------------------------------------

Side = Callable[[str, int], tuple[float, float]]  # (kind, n) -> (wall, CPU)


@contextlib.contextmanager
def sides(backend: str, binary: str, root: Path, provider: Provider) -> Iterator[tuple[dict[str, Side], list[str]]]:
    """The backend's sides (caldera's first) and the names of its CLI-alone references."""
    agent = Agent(root, "agent")
    ws = agent.workspaces[backend]
    env = agent.environment(backend, binary, provider.url)

    def ours(kind: str, n: int) -> tuple[float, float]:
        return measure(lambda: caldera_turn(agent, env, backend, kind, f"t{n}-{kind}"), server)

    server = None
    bare: BareServe | None = None
    try:
        if backend == "codex":
            def no_box(kind: str, n: int) -> tuple[float, float]:
                with bench_codex.unconfined():
                    return measure(lambda: caldera_turn(agent, env, backend, kind, f"u{n}-{kind}"))
            def unseeded(kind: str, n: int) -> tuple[float, float]:
                with databases_by_codex():
                    return measure(lambda: caldera_turn(agent, env, backend, kind, f"d{n}-{kind}"), server)
            yield {"caldera": ours, "caldera without its box": no_box,
                   "caldera, Codex making its databases (before)": unseeded,
                   "bare codex app-server": lambda kind, n: measure(lambda: codex_app_server(binary, provider.url, ws),
                                                                    own=False),
                   "codex exec": lambda kind, n: measure(lambda: codex_exec(binary, provider.url, ws, kind),
                                                         own=False),
                   "codex exec, its databases made ahead": lambda kind, n: measure(
                       lambda: codex_exec(binary, provider.url, ws, kind, seeded=True), own=False)}, ["codex exec"]
        elif backend == "claude-code":
            yield {"caldera": ours,
                   "the CLI with caldera's settings": lambda kind, n: measure(
                       lambda: bcc.policy_turn(binary, provider.url, root, ws), own=False),
                   "claude -p": lambda kind, n: measure(lambda: claude_p(binary, provider.url, ws, root, kind),
                                                        own=False)}, ["claude -p"]
        else:
            owner = agent.servers.get("opencode", lambda runs: None)

            def server() -> int:
                return owner.server.serving_pid() or 0 if owner.server else 0
            bare = BareServe(binary, provider.url, root)
            yield {"caldera (its running server)": ours,
                   "opencode run": lambda kind, n: measure(lambda: boc.one_run(
                       binary, provider.url, ws, root, n * 10 + KINDS.index(kind), PROMPT,
                       MARK.encode() if kind == "one-command" else b""), own=False),
                   "bare opencode serve over HTTP": lambda kind, n: measure(lambda: bare.turn(ws, kind),
                                                                            lambda: bare.proc.pid),
                   "bare opencode serve, events streamed": lambda kind, n: measure(
                       lambda: bare.turn(ws, kind, as_caldera=True), lambda: bare.proc.pid)}, \
                ["opencode run", "bare opencode serve over HTTP"]
    finally:
        if bare is not None:
            bare.close()
        agent.servers.close()


def bench_backend(backend: str, binary: str, rounds: int) -> dict[str, Any]:
    provider = Provider(backend)
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix=f"bench-turns-{backend}-") as name, \
                sides(backend, binary, Path(name), provider) as (runs, refs):
            for n in range(-1, rounds):  # round -1: the warm-up (page cache, imports, OpenCode's servers)
                for kind in KINDS:
                    order = list(runs.items())
                    for side, run in order if n % 2 else reversed(order):
                        provider.reset(kind)
                        got = run(kind, n + 1)
                        if n >= 0:
                            samples.setdefault((kind, side), []).append(got)
    finally:
        provider.close()
    return {"backend": backend, "samples": samples, "refs": refs, "sides": list(runs)}


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def table(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for res in results:
        for kind in KINDS:
            stats = {side: {"wall": statistics.median(w for w, _ in res["samples"][(kind, side)]),
                            "wall_p90": p90([w for w, _ in res["samples"][(kind, side)]]),
                            "cpu": statistics.median(c for _, c in res["samples"][(kind, side)]),
                            "cpu_p90": p90([c for _, c in res["samples"][(kind, side)]])}
                     for side in res["sides"]}
            ours = stats[res["sides"][0]]
            for side in res["sides"][1:]:
                ref = stats[side]
                rows.append({"backend": res["backend"], "kind": kind, "against": side, "reference": side in res["refs"],
                             "caldera_wall": ours["wall"], "caldera_wall_p90": ours["wall_p90"],
                             "caldera_cpu": ours["cpu"], "caldera_cpu_p90": ours["cpu_p90"],
                             "other_wall": ref["wall"], "other_wall_p90": ref["wall_p90"],
                             "other_cpu": ref["cpu"], "other_cpu_p90": ref["cpu_p90"],
                             "wall_ratio": ours["wall"] / ref["wall"], "cpu_ratio": ours["cpu"] / ref["cpu"]})
    return rows


# -- memory ---------------------------------------------------------------------------------------------

def memory_kib() -> tuple[int, int]:
    """(RSS, PSS) of this process in KiB."""
    with open("/proc/self/smaps_rollup") as fh:
        fields = {line.split(":")[0]: int(line.split()[1]) for line in fh if line.split()[-1:] == ["kB"]}
    return fields["Rss"], fields["Pss"]


def bench_memory(backend: str, binary: str, turns: int) -> dict[str, Any]:
    """In a fresh process: caldera's RSS and PSS around one turn and after `turns` more."""
    provider = Provider(backend)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], memory_kib()[0])
    try:
        with tempfile.TemporaryDirectory(prefix=f"bench-turns-mem-{backend}-") as name:
            root = Path(name)
            agent = Agent(root, "agent")
            env = agent.environment(backend, binary, provider.url)

            def turn(n: int) -> None:
                provider.reset("one-command")
                caldera_turn(agent, env, backend, "one-command", f"m{n}")
            try:
                for n in range(3):
                    turn(n)
                before = memory_kib()
                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                turn(3)
                done.set()
                sampler.join()
                after_one = memory_kib()
                for n in range(turns):
                    turn(4 + n)
                after = memory_kib()
            finally:
                agent.servers.close()
    finally:
        provider.close()
    return {"backend": backend, "turns": turns, "rss_before": before[0], "pss_before": before[1],
            "rss_peak_in_turn": max(peak[0], after_one[0]), "rss_after_one": after_one[0],
            "pss_after_one": after_one[1], "rss_after": after[0], "pss_after": after[1]}


# -- main ------------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--memory", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--memory-turns", type=int, default=100)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    binaries = {b: os.environ[BACKENDS[b][0]] for b in args.backends.split(",") if os.environ.get(BACKENDS[b][0])}
    if args.memory:
        print(json.dumps(bench_memory(args.memory, binaries[args.memory], args.memory_turns)))
        return 0
    left_out = sorted(set(args.backends.split(",")) - set(binaries))
    if left_out:
        print(f"bench_turns: left out (binary not set): {', '.join(left_out)}")
    subreaper()
    load = [os.getloadavg()[0]]
    results = []
    for backend, binary in binaries.items() if args.rounds > 0 else ():  # --rounds 0: the memory rows alone
        results.append(bench_backend(backend, binary, args.rounds))
        load.append(os.getloadavg()[0])
    rows = table(results)
    memory = []
    for backend in binaries if args.memory_turns > 0 else ():
        out = subprocess.run([sys.executable, __file__, "--memory", backend, "--memory-turns", str(args.memory_turns),
                              "--backends", backend], capture_output=True, text=True, check=True, timeout=3600)
        memory.append(json.loads(out.stdout.splitlines()[-1]))
        load.append(os.getloadavg()[0])
    print_report(rows, memory, args.rounds, load)
    return 0


def print_report(rows: list[dict[str, Any]], memory: list[dict[str, Any]], rounds: int, load: list[float]) -> None:
    print(f"bench_turns: median (p90) of {rounds} interleaved rounds; load average (1 min) "
          f"{min(load):.1f}-{max(load):.1f} during the run")
    print("| backend | turn | caldera against | caldera wall | other wall | wall ratio | caldera CPU | other CPU "
          "| CPU ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        name = r["against"] if r["reference"] else f"({r['against']})"
        print(f"| {r['backend']} | {r['kind']} | {name} | {r['caldera_wall']:.3f} ({r['caldera_wall_p90']:.3f}) s "
              f"| {r['other_wall']:.3f} ({r['other_wall_p90']:.3f}) s | **{r['wall_ratio']:.2f} ×** "
              f"| {r['caldera_cpu']:.3f} ({r['caldera_cpu_p90']:.3f}) s | {r['other_cpu']:.3f} "
              f"({r['other_cpu_p90']:.3f}) s | **{r['cpu_ratio']:.2f} ×** |")
    if memory:
        print("| backend | caldera RSS / PSS after 3 turns | peak RSS in one turn | after it | after N more turns "
              "| growth per 100 turns |")
        print("| --- | --- | --- | --- | --- | --- |")
    for m in memory:
        per100 = (m["rss_after"] - m["rss_after_one"]) * 100 / m["turns"] / 1024
        print(f"| {m['backend']} | {m['rss_before'] / 1024:.1f} / {m['pss_before'] / 1024:.1f} MiB "
              f"| {m['rss_peak_in_turn'] / 1024:.1f} MiB | {m['rss_after_one'] / 1024:.1f} MiB "
              f"| {m['rss_after'] / 1024:.1f} / {m['pss_after'] / 1024:.1f} MiB (N = {m['turns']}) "
              f"| {per100:+.2f} MiB RSS |")
    print(json.dumps({"bench": "turns", "rounds": rounds, "load": [round(x, 1) for x in load], "rows": rows,
                      "memory": memory, "target": "caldera / CLI alone <= 1.1 (wall and CPU)",
                      "ok": all(r["wall_ratio"] <= 1.1 and r["cpu_ratio"] <= 1.1 for r in rows if r["reference"])}))


if __name__ == "__main__":
    sys.exit(main())
