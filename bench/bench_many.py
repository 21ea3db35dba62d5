"""Many turns at once (issue 41, point 5): three agents, each running three turns at once, one
per backend (Codex, Claude Code, OpenCode): nine turns together, each with its own workspace,
its own fake provider (the real CLIs against the tests' local fakes), one command and a text
answer. The agents are laid out as on a host: `etc/agents/NAME/` (agent.env naming the agent's
workspace root, its projection in secrets/), `var/NAME/` (state), `workspaces/NAME/BACKEND`;
the tree lies outside the temporary dir (in HOME, or --dir), so that a sandbox hiding /tmp
does not hide the other agents' workspaces by chance. For OpenCode each agent has its own
server (a `ServerOwner`, as its daemon holds it).

Each workspace holds a marker file; every turn's command writes where its HOME is into its
workspace and waits until all nine have (a barrier: the runtime then puts a marker in each of
the nine HOMEs, the turns still running, and a `go` file in each workspace), then tries to
read every other workspace's marker, to list every other agent's state dir, and to find every
HOME marker under the tree and the temporary dir (where every backend's run HOMEs are).
Checked: all nine complete; no command output holds another agent's workspace marker or
another turn's HOME marker (all nine HOMEs marked, else a problem); after the
agents' servers are closed, no process is left that names the tree, works in it, or
descends from the bench. Timed: one turn of each backend alone (an agent of its own,
OpenCode's server started by that turn), then the nine at once without the barrier (every
agent's first turns: OpenCode's start its server), wall, against the slowest single turn;
then the nine again with the barrier (OpenCode's servers running), whose outputs are the
ones checked for HOMEs (those of the first nine are checked too).

Needs CALDERA_CODEX_BIN, CALDERA_CLAUDE_CODE_BIN and CALDERA_OPENCODE_BIN (.ci/install-*.sh);
a backend whose binary is missing is left out and said so.

Usage: python bench/bench_many.py [--dir DIR]
"""
from __future__ import annotations

import argparse
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
from caldera.backends.leftovers import tmp_root  # noqa: E402
from caldera.backends.opencode.owner import ServerOwner  # noqa: E402
from caldera.backends.registry import BackendServers  # noqa: E402
from caldera.redact import Redactor  # noqa: E402

KEY = "sk-bench-many-0123456789abcdef"
BACKENDS = {
    # Codex's exec_command hands the model what a command printed after yield_time_ms (10 s by
    # default) and lets it run on: the probe waits at the barrier, so 30 s
    "codex": ("CALDERA_CODEX_BIN", FakeProvider,
              lambda cmd: {"call": "exec_command", "args": {"cmd": cmd, "yield_time_ms": 30000}}),
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
        # root (both hidden from every run), its workspace root apart, named in its agent.env
        self.name, self.base = name, root
        self.root = root / "etc" / "agents" / name
        self.state = root / "var" / name
        self.secrets = self.root / "secrets"
        self.workspace_root = root / "workspaces" / name
        self.root.mkdir(parents=True)
        (self.root / "agent.env").write_text(f"CALDERA_WORKSPACE_ROOTS={self.workspace_root}\n")
        self.servers = BackendServers(self.state / "runs")
        self.servers.get("opencode", lambda runs: ServerOwner(runs, idle_seconds=600))
        self.workspaces = {b: self.workspace_root / b for b in BACKENDS}
        for backend, ws in self.workspaces.items():
            ws.mkdir(parents=True)
            (ws / "marker").write_text(f"MARK-{name}-{backend}\n")

    def environment(self, backend: str, binary: str, url: str) -> base.Environment:
        if backend == "codex":
            CodexDriver().projection(self.root, url, KEY)
        elif backend == "claude-code":
            ClaudeCodeDriver().projection(self.root, url, KEY)
        else:
            opencode_projection(self.secrets, url)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), BACKENDS[backend][0]: binary,
               "CALDERA_WORKSPACE_ROOTS": str(self.workspace_root)}
        return base.Environment(redactor=Redactor(), logs_dir=str(self.state / "logs"),
                                runs_dir=str(self.state / "runs"), secrets_dir=str(self.secrets), env=env,
                                servers=self.servers, config_root=str(self.base / "etc"),
                                state_root=str(self.base / "var"))


def homes_under(root: Path) -> list[str]:
    """Where every backend's run HOMEs lie: the state dirs (in the tree) and the temporary dir."""
    return [str(root), str(tmp_root())]


def probe(root: Path, workspace: Path, others: list[Path]) -> str:
    """A command that says where its HOME is, waits for the barrier (`go`, at most 120 s), then
    tries every other workspace's marker, every other agent's state dir and every HOME marker
    (the runtime put one in every turn's HOME at the barrier): a script in the workspace
    (Claude Code and OpenCode ask about, and so refuse, a command line that names a path
    outside the workspace; the sandbox is what is tried)."""
    reads = "".join(f"cat {ws}/marker 2>/dev/null\nls {ws} 2>/dev/null\n" for ws in others)
    where = " ".join(homes_under(root))
    (workspace / "probe.sh").write_text(
        'echo HOME=$HOME\necho "$HOME" > home.path\ntouch ready\n'
        "i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done\n"
        f"{reads}find {where} -name homemark -exec cat {{}} + 2>/dev/null\necho probe-done\n")
    return "sh probe.sh"


def turn(agent: Agent, backend: str, binary: str, others: list[Path], run_id: str) -> dict[str, Any]:
    _, fake_class, command = BACKENDS[backend]
    with fake_class([command(probe(agent.base, agent.workspaces[backend], others)), {"text": "done"}]) as fake:
        env = agent.environment(backend, binary, fake.url)
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
    """Processes whose command line names the tree, whose working dir lies in it, or that
    descend from the bench."""
    found, parents, lines = [], {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            stat = Path(f"/proc/{entry}/stat").read_text()
            parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            lines[int(entry)] = argv[:200].decode(errors="replace")
            cwd = ""
            with contextlib.suppress(OSError):
                cwd = os.readlink(f"/proc/{entry}/cwd")
            if str(root).encode() in argv or cwd.startswith(str(root) + "/"):
                found.append(f"{entry}: {lines[int(entry)]}")
    for pid in parents:
        ancestor, seen = parents.get(pid), 0
        while ancestor and ancestor != os.getpid() and seen < 64:
            ancestor, seen = parents.get(ancestor), seen + 1
        if ancestor == os.getpid():
            found.append(f"{pid} (the bench's descendant): {lines[pid]}")
    return sorted(set(found))


class Barrier:
    """The runtime's side of the probes' barrier: once every workspace holds `ready` (or after
    120 s), puts a marker in every turn's HOME (the path each probe wrote to `home.path`;
    `alive`: how many HOMEs got one) and `go` in each workspace."""

    def __init__(self, workspaces: dict[str, Path]):
        self.workspaces, self.alive = workspaces, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        deadline = time.monotonic() + 120
        while not self.stop.is_set() and time.monotonic() < deadline:
            if all((ws / "ready").exists() for ws in self.workspaces.values()):
                break
            self.stop.wait(0.1)
        for tag, ws in self.workspaces.items():
            with contextlib.suppress(OSError):
                home = Path((ws / "home.path").read_text().strip())
                (home / "homemark").write_text(f"HOMEMARK-{tag}\n")
                self.alive += 1
        for ws in self.workspaces.values():
            (ws / "go").touch()

    def wait_for(self, tags: list[str], seconds: float) -> None:
        """Until the workspaces of `tags` hold `ready`, or `seconds` have passed."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not all((self.workspaces[t] / "ready").exists() for t in tags):
            self.stop.wait(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def run_all(agents: list[Agent], binaries: dict[str, str], tag: str,
            gated: bool = True) -> tuple[list[dict[str, Any]], int]:
    """Every agent's turn of every backend at once; `gated` False: no barrier (`go` is there
    from the start, all nine start together), for the time alone."""
    every = [(a, b) for a in agents for b in binaries]
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    if not gated:
        for agent, backend in every:
            (agent.workspaces[backend] / "go").touch()
    barrier = Barrier({f"{a.name}-{b}": a.workspaces[b] for a, b in every})

    def one(agent: Agent, backend: str) -> None:
        others = [x.workspaces[b] for x in agents for b in binaries if (x, b) != (agent, backend)]
        others += [x.state for x in agents if x is not agent]
        got = turn(agent, backend, binaries[backend], others, f"{tag}-{agent.name}-{backend}")
        with lock:
            results.append(got)

    # Codex's turns start once the others' commands wait at the barrier (at most 60 s later):
    # a Codex turn reaches its command in about a second, and its command must not wait at the
    # barrier longer than its yield time while the OpenCode servers start
    first = [threading.Thread(target=one, args=pair) for pair in every if pair[1] != "codex"]
    last = [threading.Thread(target=one, args=pair) for pair in every if pair[1] == "codex"]
    for thread in first:
        thread.start()
    if gated:
        barrier.wait_for([f"{a.name}-{b}" for a, b in every if b != "codex"], 60)
    for thread in last:
        thread.start()
    for thread in [*first, *last]:
        thread.join()
    barrier.close()
    for agent, backend in every:
        for name in ("ready", "go", "home.path"):
            (agent.workspaces[backend] / name).unlink(missing_ok=True)
    return results, barrier.alive


def check(results: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(problems, notes) of the nine turns' outputs."""
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
        homes = {line for line in r["output"].splitlines() if line.startswith("HOMEMARK-")}
        if homes - {f"HOMEMARK-{r['agent']}-{r['backend']}"}:
            problems.append(f"{r['agent']} {r['backend']} read another turn's HOME: "
                            + ", ".join(sorted(homes - {f"HOMEMARK-{r['agent']}-{r['backend']}"})))
        if "probe-done" not in r["output"]:
            problems.append(f"{r['agent']} {r['backend']}: its command did not run to its end "
                            f"(output: {r['output'][-300:]!r}; {r['message']})")
    homes = [line for r in results for line in r["output"].splitlines() if line.startswith("HOME=")]
    if len(set(homes)) != len(homes):
        problems.append(f"two turns had one HOME: {homes}")
    return problems, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=os.path.expanduser("~"),
                        help="where the tree is made (outside the temporary dir; default: HOME)")
    args = parser.parse_args()
    binaries = {b: os.environ[v] for b, (v, _, _) in BACKENDS.items() if os.environ.get(v)}
    missing = sorted(set(BACKENDS) - set(binaries))
    if missing:
        print(f"bench_many: left out (binary not set): {', '.join(missing)}")
    if not binaries:
        return 0
    with tempfile.TemporaryDirectory(prefix=".bench-many-", dir=args.dir) as name:
        root = Path(os.path.realpath(name))
        alone = Agent(root, "alone")
        singles = {}
        for backend in binaries:
            singles[backend] = run_all([alone], {backend: binaries[backend]}, "alone")[0][0]
        agents = [Agent(root, f"agent{n}") for n in range(3)]
        started = time.perf_counter()
        ungated, _ = run_all(agents, binaries, "free", gated=False)  # the time: first turns, no barrier
        together = time.perf_counter() - started
        started = time.perf_counter()  # the same nine again, every command waiting for the others
        results, alive = run_all(agents, binaries, "many")
        gated = time.perf_counter() - started
        for agent in [alone, *agents]:
            agent.servers.close()
        left = leftovers(root)
    problems, notes = check(results)
    problems += check(ungated)[0]
    if alive < len(results):
        problems.append(f"only {alive} of the {len(results)} HOME markers were there at the barrier: "
                        "the HOME check tried fewer")
    problems += [f"left running: {x}" for x in left]
    slowest = max(s["wall"] for s in singles.values())
    print(f"bench_many: {len(agents)} agents x {len(binaries)} backends = {len(results)} turns at once "
          f"(tree in {args.dir}; {alive} run HOMEs marked at the barrier)")
    for backend, s in singles.items():
        walls = sorted(r["wall"] for r in ungated if r["backend"] == backend)
        print(f"  {backend:12s} alone {s['wall']:6.2f} s ({s['status']}: {s['message']}); at once "
              + ", ".join(f"{w:.2f}" for w in walls) + " s")
    print(f"  all nine together, no barrier {together:.2f} s: {together / slowest:.2f} x the slowest turn alone "
          f"({slowest:.2f} s), {together / sum(s['wall'] for s in singles.values()):.2f} x the singles' sum")
    print(f"  then with the barrier (every command waits for the nine; servers running): {gated:.2f} s")
    print(f"  left running afterwards: {len(left)}")
    for note in notes:
        print(f"  note: {note}")
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    print(json.dumps({"bench": "many", "turns": len(results), "together_s": round(together, 2),
                      "barrier_s": round(gated, 2),
                      "singles_s": {b: round(s["wall"], 2) for b, s in singles.items()}, "homes_marked": alive,
                      "left_running": len(left), "problems": problems, "ok": not problems}))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
