"""Run the real daemon (`python -m caldera.cli run`) against the embedded plane on loopback."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from core_helpers import BOOT

INSTANCE = 7  # the daemon tests' instance on their loopback plane (conftest.py)
WAIT = 10.0  # upper bound for an event the contract says happens within a few seconds


def wait_for(predicate, timeout=WAIT, step=0.05, what="condition"):
    stop = threading.Event()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        stop.wait(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Daemon:
    def __init__(self, agent="demo", extra_env=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_"))}
        env["CALDERA_CONFIG_DIR"] = os.environ["CALDERA_CONFIG_DIR"]
        env["CALDERA_STATE_DIR"] = os.environ["CALDERA_STATE_DIR"]
        env["CALDERA_LOG_LEVEL"] = "debug"
        env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread's stack (Daemon.stop)
        env.update(extra_env or {})
        self.stderr_path = Path(os.environ["CALDERA_STATE_DIR"]) / f"daemon-{time.monotonic_ns()}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--agent", agent], env=env,
                                     stdout=subprocess.DEVNULL, stderr=self._stderr, start_new_session=True)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._dump_and_kill()
        self._stderr.close()
        return self.proc.returncode

    def _dump_and_kill(self):
        """A daemon that did not stop: its threads' stacks (faulthandler on SIGABRT) and
        its log go to the test's captured output, so that a CI failure names the cause."""
        self.proc.send_signal(signal.SIGABRT)
        try:
            self.proc.wait(3)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the abort ended it (and its group): the stacks are in its log
        self.proc.wait()
        print(f"--- the daemon did not stop; its log and stacks ({self.stderr_path}):")
        print(self.log()[-20000:])

    def kill9(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._stderr.close()

    def log(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")


def plane_paths(requests, path):
    return [r for r in requests if r[1] == path or r[1].startswith(path)]


def count(plane, method, path):
    return sum(1 for r in list(plane.requests) if r[0] == method and r[1] == path)


__all__ = ["BOOT", "Daemon", "wait_for", "count"]
