"""`caldera demo`: the main job on loopback, with nothing to set up.

It starts the embedded plane on a free loopback port, installs the example
adapter agent (`examples/task-agent`) into a temporary config/state tree, runs
`caldera run` against the plane as a child process, queues
`collect_system_info`, `pause`, `settings_set` and `run_now`, waits for their
results and prints what the plane saw: presence, figures, the agent's state and
gauges, the command results, and the status page's address. Then it keeps
running until Ctrl-C (or `--seconds N`, or at once with `--once`) and stops the
runtime (SIGTERM to its process group, then SIGKILL after a grace) and the plane.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from caldera.agents import blueprint as bp
from caldera.errors import EXIT_FAILED, EXIT_OK, UsageError
from caldera.host import proc
from caldera.host.fsutil import atomic_write_bytes
from caldera.plane import report_view
from caldera.plane.server import PlaneServer

AGENT_NAME = "task-agent"
INSTANCE_ID = 1
ONLINE_TIMEOUT = 45.0
COMMAND_TIMEOUT = 90.0
STOP_GRACE = 20.0
DEMO_COMMANDS = [
    ("collect_system_info", {}),
    ("pause", {}),
    ("settings_set", {"values": {"max_7d": 0.5, "note": "set by caldera demo"}}),
    ("run_now", {}),
]
_BLUEPRINTS = (
    Path(__file__).resolve().parents[2] / "examples" / AGENT_NAME,  # a checkout
    Path("/usr/share/caldera/examples") / AGENT_NAME,  # the Debian package
)


def configure(parser) -> None:
    parser.add_argument("--port", type=int, default=0, help="plane port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--blueprint", metavar="PATH", help=f"agent blueprint (default: examples/{AGENT_NAME})")
    parser.add_argument("--once", action="store_true", help="exit after printing what the plane saw")
    parser.add_argument("--seconds", type=float, metavar="N", help="keep running N seconds after printing, then exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree (logs, database) afterwards")


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

    def __init__(self, root: Path, stop: threading.Event):
        self.root, self.stop = root, stop
        self.config_dir, self.state_dir = root / "etc", root / "var"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_"))}
        self.env.update(CALDERA_CONFIG_DIR=str(self.config_dir), CALDERA_STATE_DIR=str(self.state_dir))
        self.plane = None
        self.proc: subprocess.Popen | None = None
        self.log_path = root / "caldera-run.log"

    def start_plane(self, port: int) -> None:
        self.token = "agt_boot_" + secrets.token_hex(24)
        self.plane = PlaneServer(self.root / "plane.db", port=port, tokens={self.token: INSTANCE_ID},
                                 heartbeat_interval=5, poll_interval=1).start()

    def install_agent(self, blueprint: Path) -> str:
        self.config_dir.mkdir(parents=True)
        self.state_dir.mkdir(parents=True)
        result = bp.install(blueprint, environ=self.env, systemd_dir=self.root / "no-systemd")
        config_dir = Path(result["config_dir"])
        agent_env = (f"CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL={self.plane.url}\n"
                     f"CALDERA_INSTANCE_ID={INSTANCE_ID}\nCALDERA_PERSISTENT_DIR={self.state_dir}\n")
        atomic_write_bytes(config_dir / "agent.env", agent_env.encode(), mode=0o640)
        atomic_write_bytes(config_dir / "secrets.env", f"CALDERA_TOKEN={self.token}\n".encode(), mode=0o600)
        return result["name"]

    def start_runtime(self, name: str) -> None:
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--agent", name],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=self.root, start_new_session=True)
        finally:
            log.close()

    def runtime_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def close(self, keep: bool) -> None:
        if self.runtime_alive():
            # TERM lets the runtime drain; KILL after the grace
            proc.kill_group(self.proc, STOP_GRACE)
        if self.plane is not None:
            self.plane.stop()
        if keep:
            print(f"kept {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def _wait(demo: Demo, what: str, check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not demo.stop.is_set():
        if check():
            return True
        if not demo.runtime_alive():
            print(f"caldera run exited ({demo.proc.returncode}) while waiting for {what}:\n{demo.log_tail()}",
                  file=sys.stderr)
            return False
        if time.monotonic() > deadline:
            print(f"gave up waiting for {what} after {timeout:.0f} s; caldera run's log:\n{demo.log_tail()}",
                  file=sys.stderr)
            return False
        demo.stop.wait(0.2)
    return False


def _online(store) -> bool:
    agent = store.agents()[0]
    return agent["presence"] == "online" and store.reports(INSTANCE_ID, last=True) is not None


def _all_done(store, ids) -> bool:
    return all(store.command(INSTANCE_ID, cid)["status"] in ("succeeded", "failed") for cid in ids)


def main(args) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    blueprint = _blueprint(args.blueprint)
    demo = Demo(Path(tempfile.mkdtemp(prefix="caldera-demo-")), stop)
    try:
        return _run(demo, blueprint, args)
    finally:
        demo.close(args.keep)


def _run(demo: Demo, blueprint: Path, args) -> int:
    demo.start_plane(args.port)
    print(f"plane listening on {demo.plane.url} (status page {demo.plane.url}/)", flush=True)
    name = demo.install_agent(blueprint)
    print(f"installed {name} from {blueprint} into {demo.root}", flush=True)
    demo.start_runtime(name)
    print(f"started caldera run --agent {name} (pid {demo.proc.pid}); waiting for it to come online…", flush=True)
    store = demo.plane.store
    if not _wait(demo, "the agent to come online", lambda: _online(store), ONLINE_TIMEOUT):
        return EXIT_FAILED if not demo.stop.is_set() else EXIT_OK
    ids = []
    for command_type, payload in DEMO_COMMANDS:
        ids.append(store.enqueue(INSTANCE_ID, command_type, payload))
        print(f"queued {command_type} (command {ids[-1]})", flush=True)
    if not _wait(demo, "the command results", lambda: _all_done(store, ids), COMMAND_TIMEOUT):
        return EXIT_FAILED if not demo.stop.is_set() else EXIT_OK
    demo.stop.wait(1.5)  # let the report that follows the last command arrive
    print()
    print(report_view.render(store, INSTANCE_ID, ids))
    print(f"\nstatus page: {demo.plane.url}/")
    if args.once:
        return EXIT_OK
    if args.seconds is not None:
        demo.stop.wait(max(0.0, args.seconds))
    else:
        print("running; press Ctrl-C to stop", flush=True)
        demo.stop.wait()
    if not demo.runtime_alive():
        print(f"caldera run exited early ({demo.proc.returncode}):\n{demo.log_tail()}", file=sys.stderr)
        return EXIT_FAILED
    print("stopping…", flush=True)
    return EXIT_OK
