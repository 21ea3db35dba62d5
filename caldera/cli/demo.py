"""`caldera demo`: the main job on loopback, with nothing to set up.

It starts the embedded plane on a free loopback port, installs the two example
agents into a temporary config/state tree — the adapter agent (`examples/task-agent`,
instance 1) and the process agent (`examples/inbox-watcher`, instance 2, SPEC 7b: the
runtime starts and supervises it) — runs one `caldera run` per agent against the plane
as child processes, queues commands for each (`collect_system_info`, `pause`,
`settings_set`, `run_now`; `restart_openclaw` for the process agent), waits for their
results and prints what the plane saw of each: presence, figures, the agent's state and
gauges, its PID, the command results, and the status page's address. Then it keeps
running until Ctrl-C (or `--seconds N`, or at once with `--once`) and stops the
runtimes (SIGTERM to each process group, then SIGKILL after a grace) and the plane.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caldera.agents import blueprint as bp
from caldera.errors import EXIT_FAILED, EXIT_OK, UsageError
from caldera.host import proc
from caldera.host.fsutil import atomic_write_bytes
from caldera.host.stopsignals import stop_on_signals
from caldera.plane import report_view
from caldera.plane.server import PlaneServer

if TYPE_CHECKING:
    import argparse

    from caldera.plane.store import Store

AGENT_NAME = "task-agent"
INSTANCE_ID = 1
PROCESS_AGENT = "inbox-watcher"
PROCESS_INSTANCE = 2
ONLINE_TIMEOUT = 45.0
COMMAND_TIMEOUT = 90.0
STOP_GRACE = 20.0
DEMO_COMMANDS: list[tuple[str, dict[str, Any]]] = [
    ("collect_system_info", {}),
    ("pause", {}),
    ("settings_set", {"values": {"max_7d": 0.5, "note": "set by caldera demo"}}),
    ("run_now", {}),
]
PROCESS_COMMANDS: list[tuple[str, dict[str, Any]]] = [
    ("collect_system_info", {}),
    ("settings_set", {"values": {"interval_seconds": 10}}),
    ("run_now", {}),
    ("restart_openclaw", {}),
]
# The examples travel with the package (issue 35): caldera/examples is package data (in a
# checkout a link to the top-level examples/, in the .deb a link to /usr/share/caldera/examples).
_EXAMPLES = (Path(__file__).resolve().parents[1] / "examples",)
_BLUEPRINTS = tuple(root / AGENT_NAME for root in _EXAMPLES)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="plane port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--blueprint", metavar="PATH", help=f"agent blueprint (default: examples/{AGENT_NAME})")
    parser.add_argument("--once", action="store_true", help="exit after printing what the plane saw")
    parser.add_argument("--seconds", type=float, metavar="N", help="keep running N seconds after printing, then exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree (logs, database) afterwards")
    parser.add_argument("--no-process", action="store_true",
                        help=f"leave out the process-mode example ({PROCESS_AGENT})")


def _blueprint(arg: str | None) -> Path:
    if arg:
        path = Path(arg)
        if not path.exists():
            raise UsageError(f"--blueprint: no such file or directory: {arg}")
        return path
    for candidate in _BLUEPRINTS:
        if (candidate / "caldera.agent.yaml").is_file():
            return candidate
    raise UsageError(f"the example agent was not found (looked in {', '.join(map(str, _BLUEPRINTS))}); "
                     "pass --blueprint PATH")


class Demo:
    """The pieces of one demo run; `close()` undoes them in reverse order."""

    def __init__(self, root: Path, stop: threading.Event) -> None:
        self.root, self.stop = root, stop
        self.config_dir, self.state_dir = root / "etc", root / "var"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_"))}
        self.env.update(CALDERA_CONFIG_DIR=str(self.config_dir), CALDERA_STATE_DIR=str(self.state_dir))
        self.plane: PlaneServer | None = None
        self.procs: dict[str, subprocess.Popen] = {}  # agent name -> its `caldera run`
        self.log_path = root / "caldera-run.log"
        self.tokens = {INSTANCE_ID: "agt_boot_" + secrets.token_hex(24),
                       PROCESS_INSTANCE: "agt_boot_" + secrets.token_hex(24)}

    @property
    def returncode(self) -> int | None:
        """The exit code of the first runtime that ended (for the messages), else None."""
        ended = [p.returncode for p in self.procs.values() if p.poll() is not None]
        return ended[0] if ended else None

    def start_plane(self, port: int) -> PlaneServer:
        self.plane = PlaneServer(self.root / "plane.db", port=port,
                                 tokens={token: iid for iid, token in self.tokens.items()},
                                 heartbeat_interval=5, poll_interval=1).start()
        return self.plane

    def install_agent(self, blueprint: Path, base_url: str, instance_id: int) -> str:
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        result = bp.install(blueprint, environ=self.env, systemd_dir=self.root / "no-systemd")
        config_dir = Path(result["config_dir"])
        agent_env = (f"CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL={base_url}\n"
                     f"CALDERA_INSTANCE_ID={instance_id}\nCALDERA_PERSISTENT_DIR={self.state_dir}\n")
        atomic_write_bytes(config_dir / "agent.env", agent_env.encode(), mode=0o640)
        atomic_write_bytes(config_dir / "secrets.env", f"CALDERA_TOKEN={self.tokens[instance_id]}\n".encode(),
                           mode=0o600)
        return result["name"]

    def start_runtime(self, name: str) -> None:
        log = open(self.log_path, "ab")
        try:
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--agent", name],
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env, cwd=self.root, start_new_session=True)
        finally:
            log.close()

    def runtime_alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs.values())

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def close(self, keep: bool) -> None:
        for runtime in self.procs.values():
            if runtime.poll() is None:
                # TERM lets the runtime drain (and stop its agent); KILL after the grace
                proc.kill_group(runtime, STOP_GRACE)
        if self.plane is not None:
            self.plane.stop()
        if keep:
            print(f"kept {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def _wait(demo: Demo, what: str, check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not demo.stop.is_set():
        if check():
            return True
        if not demo.runtime_alive():
            print(f"caldera run exited ({demo.returncode}) while waiting for {what}:\n{demo.log_tail()}",
                  file=sys.stderr)
            return False
        if time.monotonic() > deadline:
            print(f"gave up waiting for {what} after {timeout:.0f} s; caldera run's log:\n{demo.log_tail()}",
                  file=sys.stderr)
            return False
        demo.stop.wait(0.2)
    return False


def _online(store: Store, instance_ids: tuple[int, ...] = (INSTANCE_ID,)) -> bool:
    agents = {a["instance_id"]: a for a in store.agents()}
    return all(i in agents and agents[i]["presence"] == "online" and store.reports(i, last=True) is not None
               for i in instance_ids)


def _all_done(store: Store, ids: list[tuple[int, int]]) -> bool:
    """ids: (instance_id, command_id) pairs."""
    return all(store.command(iid, cid)["status"] in ("succeeded", "failed") for iid, cid in ids)


def _process_blueprint(no_process: bool) -> Path | None:
    if no_process:
        return None
    for root in _EXAMPLES:
        if (root / PROCESS_AGENT / "caldera.agent.yaml").is_file():
            return root / PROCESS_AGENT
    return None


def main(args: argparse.Namespace) -> int:
    stop = threading.Event()
    stop_on_signals(stop)
    blueprint = _blueprint(args.blueprint)
    demo = Demo(Path(tempfile.mkdtemp(prefix="caldera-demo-")), stop)
    try:
        return _run(demo, blueprint, args)
    finally:
        demo.close(args.keep)


# (instance id, blueprint, the commands queued for it)
DemoAgent = tuple[int, Path, list[tuple[str, dict[str, Any]]]]


def _run(demo: Demo, blueprint: Path, args: argparse.Namespace) -> int:
    try:
        plane = demo.start_plane(args.port)
    except OSError as exc:
        from caldera.cli.plane import listen_problem

        print(f"caldera demo: {listen_problem('127.0.0.1', args.port, exc)}", file=sys.stderr)
        return EXIT_FAILED
    print(f"plane listening on {plane.url} (status page {plane.url}/)", flush=True)
    agents: list[DemoAgent] = [(INSTANCE_ID, blueprint, DEMO_COMMANDS)]
    process = _process_blueprint(getattr(args, "no_process", False))
    if process is not None:
        agents.append((PROCESS_INSTANCE, process, PROCESS_COMMANDS))
    _start_agents(demo, plane.url, agents)
    print("waiting for the agents to come online…", flush=True)
    store = plane.store
    instances = tuple(i for i, _, _ in agents)
    if not _wait(demo, "the agents to come online", lambda: _online(store, instances), ONLINE_TIMEOUT):
        return EXIT_FAILED if not demo.stop.is_set() else EXIT_OK
    ids = _queue_commands(store, agents)
    if not _wait(demo, "the command results", lambda: _all_done(store, ids), COMMAND_TIMEOUT):
        return EXIT_FAILED if not demo.stop.is_set() else EXIT_OK
    demo.stop.wait(1.5)  # let the report that follows the last command arrive
    for instance_id in instances:
        print()
        print(report_view.render(store, instance_id, [cid for iid, cid in ids if iid == instance_id]))
    print(f"\nstatus page: {plane.url}/")
    if args.once:
        return EXIT_OK
    return _keep_running(demo, args.seconds)


def _start_agents(demo: Demo, base_url: str, agents: list[DemoAgent]) -> None:
    for instance_id, source, _ in agents:
        name = demo.install_agent(source, base_url, instance_id)
        print(f"installed {name} (instance {instance_id}) from {source} into {demo.root}", flush=True)
        demo.start_runtime(name)
        print(f"started caldera run --agent {name} (pid {demo.procs[name].pid})", flush=True)


def _queue_commands(store: Store, agents: list[DemoAgent]) -> list[tuple[int, int]]:
    """(instance id, command id) of each command queued."""
    ids = []
    for instance_id, _, commands in agents:
        for command_type, payload in commands:
            ids.append((instance_id, store.enqueue(instance_id, command_type, payload)))
            print(f"queued {command_type} for instance {instance_id} (command {ids[-1][1]})", flush=True)
    return ids


def _keep_running(demo: Demo, seconds: float | None) -> int:
    """Until Ctrl-C (or `seconds`); EXIT_FAILED when a runtime ended meanwhile."""
    if seconds is not None:
        demo.stop.wait(max(0.0, seconds))
    else:
        print("running; press Ctrl-C to stop", flush=True)
        demo.stop.wait()
    if not demo.runtime_alive():
        print(f"caldera run exited early ({demo.returncode}):\n{demo.log_tail()}", file=sys.stderr)
        return EXIT_FAILED
    print("stopping…", flush=True)
    return EXIT_OK
