"""Many turns at once (issue 41, point 5): three agents, each running three turns at once, one
per backend (Codex, Claude Code, OpenCode): nine turns together, each with its own workspace,
its own fake provider (the real CLIs against the tests' local fakes), one command and a text
answer. Each agent has its own state dir and secrets (its projection) and, for OpenCode, its
own server (a `ServerOwner`, as its daemon holds it).

Each workspace holds a marker file; every turn's command prints its HOME and tries to read
every other workspace's marker and every other turn's HOME. Checked: all nine complete; no
command output holds another turn's marker or names another turn's HOME; after the agents'
servers are closed, no process is left that names the bench's dirs. Timed: one turn of each
backend alone (an agent of its own, OpenCode's server started by that turn), then the nine at
once, wall, against the slowest single turn.

Needs CALDERA_CODEX_BIN, CALDERA_CLAUDE_CODE_BIN and CALDERA_OPENCODE_BIN (.ci/install-*.sh);
a backend whose binary is missing is left out and said so.

Usage: python bench/bench_many.py
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "backends"))

from backends_drivers import ClaudeCodeDriver, CodexDriver  # noqa: E402
from backends_fake_anthropic import FakeAnthropic  # noqa: E402
from backends_fake_chat import FakeChat  # noqa: E402
from backends_fake_provider import FakeProvider  # noqa: E402

from caldera.backends import base, service  # noqa: E402
from caldera.backends.opencode.owner import ServerOwner  # noqa: E402
from caldera.backends.registry import BackendServers  # noqa: E402
from caldera.redact import Redactor  # noqa: E402

KEY = "sk-bench-many-0123456789abcdef"
BACKENDS = {
    "codex": ("CALDERA_CODEX_BIN", FakeProvider, lambda cmd: {"call": "exec_command", "args": {"cmd": cmd}}),
    "claude-code": ("CALDERA_CLAUDE_CODE_BIN", FakeAnthropic,
                    lambda cmd: {"tool": "Bash", "input": {"command": cmd, "description": "probe"}}),
    "opencode": ("CALDERA_OPENCODE_BIN", FakeChat,
                 lambda cmd: {"call": "bash", "args": {"command": cmd, "description": "probe"}}),
}


def opencode_projection(secrets: Path, url: str) -> None:
    home = secrets / "opencode"
    (home / "env").mkdir(parents=True, exist_ok=True)
    (home / "opencode.json").write_text(json.dumps({
        "provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "Fake",
                              "options": {"baseURL": url, "apiKey": "{env:FAKE_PROVIDER_API_KEY}"},
                              "models": {"fake-model": {}}}}, "model": "fake/fake-model"}))
    (home / "env" / "FAKE_PROVIDER_API_KEY").write_text(KEY + "\n")


class Agent:
    """One agent's dirs, its servers, and its three turns' workspaces and providers."""

    def __init__(self, root: Path, name: str):
        # as on a host: every agent's config under one config root, its state under one state
        # root (both hidden from every run), the workspaces under the workspace root apart
        self.name, self.base = name, root
        self.root = root / "etc" / name
        self.state = root / "var" / name
        self.secrets = self.root / "secrets"
        self.servers = BackendServers(self.state / "runs")
        self.servers.get("opencode", lambda runs: ServerOwner(runs, idle_seconds=600))
        self.workspaces = {b: root / "workspaces" / name / b for b in BACKENDS}
        for backend, ws in self.workspaces.items():
            ws.mkdir(parents=True)
            (ws / "marker").write_text(f"MARK-{name}-{backend}\n")

    def environment(self, backend: str, binary: str, url: str, roots: str) -> base.Environment:
        if backend == "codex":
            CodexDriver().projection(self.root, url, KEY)
        elif backend == "claude-code":
            ClaudeCodeDriver().projection(self.root, url, KEY)
        else:
            opencode_projection(self.secrets, url)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), BACKENDS[backend][0]: binary,
               "CALDERA_WORKSPACE_ROOTS": roots}
        return base.Environment(redactor=Redactor(), logs_dir=str(self.state / "logs"),
                                runs_dir=str(self.state / "runs"), secrets_dir=str(self.secrets), env=env,
                                servers=self.servers, config_root=str(self.base / "etc"),
                                state_root=str(self.base / "var"))


def probe(workspace: Path, others: list[Path]) -> str:
    """A command that prints HOME and tries every other workspace's marker and every other
    agent's state dir: a script in the workspace (Claude Code and OpenCode ask about, and so
    refuse, a command line that names a path outside the workspace; the sandbox is what is tried)."""
    reads = "".join(f"cat {ws}/marker 2>/dev/null\nls {ws} 2>/dev/null\n" for ws in others)
    (workspace / "probe.sh").write_text(f"echo HOME=$HOME\n{reads}echo probe-done\n")
    return "sh probe.sh"


def turn(agent: Agent, backend: str, binary: str, others: list[Path], roots: str, run_id: str) -> dict[str, Any]:
    _, fake_class, command = BACKENDS[backend]
    with fake_class([command(probe(agent.workspaces[backend], others)), {"text": "done"}]) as fake:
        env = agent.environment(backend, binary, fake.url, roots)
        events: list[dict[str, Any]] = []
        started = time.perf_counter()
        request = {"run_id": run_id, "prompt": "Run the probe", "workspace": str(agent.workspaces[backend]),
                   "backend_profile": backend, "execution_policy": {"timeout_seconds": 180}}
        result = service.execute(request, env, roots=None, listeners=[events.append])
        wall = time.perf_counter() - started
    output = "\n".join(e["data"].get("output", "") for e in events if e["type"] == "command_output")
    return {"agent": agent.name, "backend": backend, "status": result["status"], "wall": wall,
            "output": output, "message": result.get("message")}


def leftovers(root: Path) -> list[str]:
    """Processes whose command line names the bench's dirs."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                if str(root).encode() in argv:
                    found.append(f"{entry}: {argv[:200].decode(errors='replace')}")
    return found


def run_all(agents: list[Agent], binaries: dict[str, str], tag: str) -> list[dict[str, Any]]:
    every = [(a, b) for a in agents for b in binaries]
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(agent: Agent, backend: str) -> None:
        others = [x.workspaces[b] for x in agents for b in binaries if (x, b) != (agent, backend)]
        others += [x.state for x in agents if x is not agent]
        got = turn(agent, backend, binaries[backend], others, str(agent.base / "workspaces" / agent.name),
                   f"{tag}-{agent.name}-{backend}")
        with lock:
            results.append(got)

    threads = [threading.Thread(target=one, args=pair) for pair in every]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main() -> int:
    binaries = {b: os.environ[v] for b, (v, _, _) in BACKENDS.items() if os.environ.get(v)}
    missing = sorted(set(BACKENDS) - set(binaries))
    if missing:
        print(f"bench_many: left out (binary not set): {', '.join(missing)}")
    if not binaries:
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-many-") as name:
        root = Path(name)
        alone = Agent(root, "alone")
        singles = {}
        for backend in binaries:
            singles[backend] = run_all([alone], {backend: binaries[backend]}, "alone")[0]
        agents = [Agent(root, f"agent{n}") for n in range(3)]
        started = time.perf_counter()
        results = run_all(agents, binaries, "many")
        together = time.perf_counter() - started
        for agent in [alone, *agents]:
            agent.servers.close()
        left = leftovers(root)
    marks = {f"MARK-{r['agent']}-{r['backend']}" for r in results}
    problems: list[str] = []
    notes: list[str] = []
    for r in results:
        if r["status"] != "completed":
            problems.append(f"{r['agent']} {r['backend']}: {r['status']}: {r['message']}")
        seen = [m for m in marks if m in r["output"] and m != f"MARK-{r['agent']}-{r['backend']}"]
        mine = [m for m in seen if m.startswith(f"MARK-{r['agent']}-")]
        if len(seen) > len(mine):
            problems.append(f"{r['agent']} {r['backend']} read another agent's workspace: "
                            + ", ".join(sorted(set(seen) - set(mine))))
        if mine:  # documented: an agent's workspace roots are read-only to its commands (docs/backends.md)
            notes.append(f"{r['agent']} {r['backend']} read its agent's other workspaces: {', '.join(sorted(mine))}")
        if "probe-done" not in r["output"]:
            problems.append(f"{r['agent']} {r['backend']}: its command did not run to its end "
                            f"(output: {r['output'][-300:]!r}; {r['message']})")
    homes = [line for r in results for line in r["output"].splitlines() if line.startswith("HOME=")]
    if len(set(homes)) != len(homes):
        problems.append(f"two turns had one HOME: {homes}")
    problems += [f"left running: {x}" for x in left]
    slowest = max(s["wall"] for s in singles.values())
    print(f"bench_many: {len(agents)} agents x {len(binaries)} backends = {len(results)} turns at once")
    for backend, s in singles.items():
        walls = sorted(r["wall"] for r in results if r["backend"] == backend)
        print(f"  {backend:12s} alone {s['wall']:6.2f} s ({s['status']}: {s['message']}); at once "
              + ", ".join(f"{w:.2f}" for w in walls) + " s")
    print(f"  all nine together {together:.2f} s: {together / slowest:.2f} x the slowest turn alone "
          f"({slowest:.2f} s), {together / sum(s['wall'] for s in singles.values()):.2f} x the singles' sum")
    for note in notes:
        print(f"  note: {note}")
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    print(json.dumps({"bench": "many", "turns": len(results), "together_s": round(together, 2),
                      "singles_s": {b: round(s["wall"], 2) for b, s in singles.items()},
                      "problems": problems, "ok": not problems}))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
