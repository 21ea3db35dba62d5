"""The soak's runtime side: the agent's tree (config, state dir, adapter home), the small
tmpfs under the state dir, `caldera run` under a supervisor that restarts it as systemd's
Restart=on-failure does, and what /proc says about its processes."""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from caldera.agents import blueprint as bp
from caldera.host.fsutil import atomic_write_bytes

AGENT = "soak-agent"
INSTANCE = 1
ADAPTER = Path(__file__).resolve().parent / "soak_adapter.py"
ADAPTER_TIMEOUT = 4  # runtime.timeout_seconds: the hang mood sleeps far past it
RESTART_DELAY = 1.0  # systemd's RestartSec= of the soak's supervisor
KILL_WAIT = 10.0  # a SIGKILLed runtime has exited within this (its sockets closed)
TMPFS_SIZE = "8m"
PR_SET_CHILD_SUBREAPER = 36

MANIFEST = """\
name: {name}
version: 1.0.0
description: The soak's agent (bench/soak.py).
runtime:
  type: adapter
  command: [{python}, {adapter}]
  workdir: {home}
  timeout_seconds: {timeout}
settings:
  schema:
    - {{ key: limit, label: Limit, type: percent, min: 0.0, max: 1.0 }}
    - {{ key: interval, label: Minutes between runs, type: integer, min: 1, max: 1440 }}
    - {{ key: note, label: Note, type: string, max_length: 200 }}
  defaults: {{ limit: 0.5, interval: 60 }}
controls: [pause, resume, run_now]
"""


class AgentTree:
    """<root>/etc (config), <root>/var (state root; the agent's dir may be a tmpfs), <root>/home
    (the adapter's working directory: its mood file, its call log, its own state)."""

    def __init__(self, root: Path, bootstrap: str):
        self.root, self.bootstrap = root, bootstrap
        self.config_root, self.state_root = root / "etc", root / "var"
        self.state_dir = self.state_root / AGENT
        self.home = root / "home"
        self.log_path = root / "runtime.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_"))}
        self.env.update(CALDERA_CONFIG_DIR=str(self.config_root), CALDERA_STATE_DIR=str(self.state_root),
                        CALDERA_LOG_LEVEL="debug", PYTHONFAULTHANDLER="1")

    def install(self, base_url: str) -> None:
        for d in (self.config_root, self.state_dir, self.home, self.root / "blueprint"):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "blueprint" / "caldera.agent.yaml").write_text(MANIFEST.format(
            name=AGENT, python=sys.executable, adapter=ADAPTER, home=self.home, timeout=ADAPTER_TIMEOUT))
        self.set_mood("normal")
        result = bp.install(self.root / "blueprint", environ=self.env, systemd_dir=self.root / "no-systemd")
        config_dir = Path(result["config_dir"])
        agent_env = (f"CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL={base_url}\n"
                     f"CALDERA_INSTANCE_ID={INSTANCE}\n")
        atomic_write_bytes(config_dir / "agent.env", agent_env.encode(), mode=0o640)
        atomic_write_bytes(config_dir / "secrets.env", f"CALDERA_TOKEN={self.bootstrap}\n".encode(), mode=0o600)

    def set_mood(self, mood: str) -> None:
        atomic_write_bytes(self.home / "mood", mood.encode(), mode=0o644)


# ---- the full disk --------------------------------------------------------------------------

class Disk:
    """A small tmpfs on the agent's state dir; `fill()` takes every free byte, `free()` gives them back."""

    def __init__(self, where: Path):
        self.where = where
        self.mounted = False
        self.filler = where / "soak-filler"

    def mount(self) -> str | None:
        """None when mounted; else why not (a sentence)."""
        self.where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "soak-state",
                               str(self.where)], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return f"mount -t tmpfs failed: {done.stderr.strip() or done.returncode}"
        self.mounted = True
        return None

    def fill(self) -> int:
        """Write until ENOSPC (appending: a top-up takes back what the runtime freed); the bytes taken."""
        taken = 0
        try:
            fh = open(self.filler, "ab", buffering=0)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return 0  # full already
        with fh:
            for size in (1 << 20, 1 << 12, 1):
                try:
                    while True:
                        fh.write(b"\0" * size)
                        taken += size
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        return taken

    def usage(self) -> list[tuple[int, str]]:
        """The largest files under the mount: (bytes, path), largest first."""
        files = [(p.stat().st_size, str(p.relative_to(self.where))) for p in self.where.rglob("*") if p.is_file()]
        return sorted(files, reverse=True)[:5]

    def free(self) -> None:
        try:
            self.filler.unlink()
        except FileNotFoundError:
            pass

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.where)], capture_output=True, timeout=30)
            self.mounted = False


def become_subreaper() -> bool:
    """Orphans of a killed runtime (adapter calls in their own groups) become the soak's
    children, as they stay in the unit's cgroup under systemd: the supervisor ends them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# ---- /proc --------------------------------------------------------------------------------

def proc_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, state, start time in clock ticks)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        table[int(entry)] = (int(fields[1]), fields[0].decode(), int(fields[19]))
    return table


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(table: dict[int, tuple[int, str, int]], root: int) -> list[int]:
    out, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
        out.extend(kids)
        frontier.extend(kids)
    return out


def age_seconds(start_ticks: int) -> float:
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    at: float
    pid: int
    rss_kib: int
    threads: int
    fds: int


def sample(pid: int) -> Sample | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return Sample(time.time(), pid, int(fields["VmRSS"].split()[0]), int(fields["Threads"]), fds)


# ---- the supervisor -----------------------------------------------------------------------

@dataclass
class Supervisor:
    """`caldera run --agent` restarted RESTART_DELAY after it exits (any exit but 0, as
    Restart=on-failure); `kill()` is SIGKILL to it, then the leftovers of its cgroup
    (the orphans that came to the soak) are killed as systemd would."""

    tree: AgentTree
    stop: threading.Event
    starts: list[tuple[float, int]] = field(default_factory=list)  # (when, pid)
    exits: list[tuple[float, int, int | None]] = field(default_factory=list)  # (when, pid, code)
    kills: list[float] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)  # orphans killed after a kill (command lines)
    clean_exit: bool = False  # the runtime exited 0 on its own: not restarted
    stuck: bool = False  # SIGTERM did not end it within the grace (its stacks are in the log)
    proc: subprocess.Popen[bytes] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="soak-supervisor", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        with open(self.tree.log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--agent", AGENT],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=self.tree.env, cwd=self.tree.root, start_new_session=True)
        with self._lock:
            self.proc = proc
            self.starts.append((time.time(), proc.pid))

    def _watch(self) -> None:
        while not self.stop.is_set():
            proc = self.proc
            if proc is None or proc.poll() is None:
                self.stop.wait(0.1)
                continue
            self.exits.append((time.time(), proc.pid, proc.returncode))
            self.sweep()
            if proc.returncode == 0:
                self.clean_exit = True
                return
            if self.stop.wait(RESTART_DELAY):
                return
            self._spawn()

    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def kill(self, wait: float = KILL_WAIT) -> bool:
        """SIGKILL to the runtime's process group, then wait (at most `wait`) until the runtime
        has exited: its sockets are closed when this returns True, so a poll the proxy has not
        forwarded yet finds its client gone. (The supervisor thread polls the same Popen: both
        are safe together, one of them reaps.)"""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return True
        self.kills.append(time.time())
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            return False
        return True

    def sweep(self) -> None:
        """SIGKILL and reap every child of the soak that is not a live runtime or a helper the
        soak ran itself (what a killed runtime left in its cgroup)."""
        me = os.getpid()
        keep = {p.pid for p in [self.proc] if p is not None and p.poll() is None}
        for pid, (ppid, state, _) in proc_table().items():
            if ppid != me or pid in keep:
                continue
            line = cmdline(pid)
            if "caldera.cli run" in line or str(ADAPTER) in line or state == "Z":
                if state != "Z":
                    self.swept.append(line[:200])
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if "caldera.cli run" not in line:  # the runtime's own Popen reaps it
                    try:
                        os.waitpid(pid, 0)
                    except ChildProcessError:
                        pass

    def terminate(self, grace: float = 30.0) -> int | None:
        """SIGTERM (the unit's stop), SIGKILL after `grace`; the exit code."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(5)
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.stuck = True
                os.kill(proc.pid, signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack into the log
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        return proc.returncode
