"""One agent process, ever (SPEC section 7b): start it, watch it, restart it by policy,
stop it gracefully, and remember it in `state.json` so the next runtime never starts
a second one.

The supervisor thread calls `step()` every POLL seconds (a `stop.wait`); commands
(start, stop, restart, pause, resume, signals) call in from command threads and the
control socket. One lock (`_op`) serialises everything that starts or stops the
process; `snapshot()` reads without it, so a report never waits on a graceful stop.

Durable keys in state.json:
- `agent_process`: {pid, start_time (clock ticks, /proc/PID/stat field 22), started_at,
  restarts, last_exit {code, signal, at, reason}} of the running (or last) agent;
- `agent_hold`: null, "paused" (pause) or "stopped" (stop_openclaw): survives runtime
  restarts and reboots; resume / start / restart lift it.
"""
from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time

from caldera import TYPE_CHECKING
from caldera.agents.process.policy import ERROR, MAX_FAILURES, RESTART, RestartPolicy
from caldera.host import proc
from caldera.host.loopguard import LoopGuard
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any, Literal

    from caldera.agents.process.logpump import LogPump
    from caldera.host.statefile import StateFile

    Popen = subprocess.Popen[bytes]

log = logging.getLogger("caldera.agents.process")
POLL = 0.25
STARTUP_GRACE = 5.0  # "starting" until this long up (or the status file is written)
LAST_WORDS_WIDTH = 200  # each of a failed agent's last output lines in the daemon's log
KEY, HOLD = "agent_process", "agent_hold"
STARTING, RUNNING, STOPPED, FAILED = "starting", "running", "stopped", "error"


class LaunchError(Exception):
    """The agent could not be started (the message says why)."""


def describe_exit(returncode: int | None) -> tuple[int | None, int | None, str]:
    """(code, signal, sentence) of a Popen returncode."""
    if returncode is None:
        return None, None, "gone"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return None, -returncode, f"killed by {name}"
    return returncode, None, f"exited with status {returncode}"


class Supervisor:
    def __init__(self, *, launch: Callable[[], Popen], store: StateFile, pump: LogPump | None, stop_signal: int,
                 stop_timeout: float, restart: str = "on-failure", policy: RestartPolicy | None = None,
                 on_change: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, proc_root: str = "/proc") -> None:
        """launch() -> Popen (raises LaunchError); pump: where the output goes (None: attached later)."""
        self.launch, self.store, self.pump = launch, store, pump
        self.stop_signal, self.stop_timeout = stop_signal, stop_timeout
        self.policy = policy or RestartPolicy(restart)
        self.on_change, self.clock, self.wall, self.proc_root = on_change, clock, wall, proc_root
        self._op = threading.RLock()
        self._unpumped: IO[bytes] | None = None  # a child's pipe while there is no pump yet
        self._tick = threading.Event()  # never set: a plain timed wait inside stop escalation
        self._view = threading.Lock()  # status, reason and popen change together (a report sees all three)
        self.popen: Popen | None = None
        self._shut = False  # shutdown() ran: nothing starts the agent again in this runtime
        held = store.get(HOLD)
        self.status = STOPPED if held else STARTING  # until boot, which starts it unless it is held
        self.reason = ("paused" if held == "paused" else "stopped by a command") if held else ""  # a sentence
        self.started_at: float | None = None  # monotonic
        self.next_start: float | None = None  # monotonic; None: not scheduled
        self.notes: list[str] = []  # one-off events worth a health entry (adoption)
        record = store.get(KEY) or {}
        self.restarts = int(record.get("restarts") or 0)
        self.last_exit: dict[str, Any] | None = record.get("last_exit")

    def attach_pump(self, pump: LogPump) -> None:
        """Where the agent's output goes (the supervisor thread makes it when it starts). A child
        started before (a resume that came first) has its pipe drained from now on."""
        with self._op:
            self.pump = pump
            if self._unpumped is not None:
                pump.attach(self._unpumped)
                self._unpumped = None

    def configure(self, *, stop_signal: int, stop_timeout: float, restart: str) -> None:
        """A reloaded manifest's stop and restart rules (the command itself applies at the next start)."""
        with self._op:
            self.stop_signal, self.stop_timeout, self.policy.mode = stop_signal, stop_timeout, restart

    # ------------------------------------------------------------ what reports read

    @property
    def hold(self) -> str | None:
        return self.store.get(HOLD)

    def pid(self) -> int | None:
        """The agent's PID while the supervisor holds it (an exit is seen at the next turn, when
        status and PID change together)."""
        popen = self.popen
        return popen.pid if popen is not None else None

    def uptime(self) -> float | None:
        return None if self.pid() is None or self.started_at is None else self.clock() - self.started_at

    def snapshot(self) -> dict[str, Any]:
        with self._view:
            status, reason, pid, uptime = self.status, self.reason, self.pid(), self.uptime()
        return {"status": status, "pid": pid, "uptime": uptime, "restarts": self.restarts,
                "last_exit": self.last_exit, "hold": self.hold, "reason": reason,
                "next_start_in": None if self.next_start is None else max(0.0, self.next_start - self.clock())}

    # ------------------------------------------------------------ the thread's turn

    def boot(self) -> None:
        """First turn: deal with an agent a killed runtime left behind; start unless held."""
        with self._op:
            self._stop_survivor()
            if self.hold is None:
                self.next_start = self.clock()
            else:
                self._set(STOPPED, "paused" if self.hold == "paused" else "stopped by a command")

    def step(self) -> None:
        with self._op:
            popen = self.popen
            if popen is not None and popen.poll() is not None:
                self._exited(popen)
            elif (popen is not None and self.status == STARTING and self.started_at is not None
                  and self.clock() - self.started_at >= STARTUP_GRACE):
                self._set(RUNNING, "")
            if self.popen is None and self.next_start is not None and self.clock() >= self.next_start:
                self.next_start = None
                self._start()

    def mark_running(self) -> None:
        """The agent wrote its status file since it started: it is up."""
        if self.status == STARTING and self.pid() is not None:
            self._set(RUNNING, "")

    # ------------------------------------------------------------ commands

    def start(self) -> str:
        with self._op:
            if self._shut:  # a CLI verb that waited for the stop: no child after the runtime's stop
                return "The runtime is stopping: the agent is not started."
            self.store.set(HOLD, None)
            self.policy.reset()
            if self.pid() is not None:
                return f"The agent is already running (pid {self.pid()})."
            self.next_start = None
            self._start()
            return (f"Started (pid {self.pid()})." if self.pid() is not None
                    else f"The agent did not start: {self.reason}")

    def stop(self, hold: str | None = "stopped") -> str:
        """Graceful stop; `hold` ("stopped" or "paused") keeps it stopped across runtime restarts."""
        with self._op:
            if hold is not None:
                self.store.set(HOLD, hold)
            self.next_start = None
            was = self.pid()
            why = "paused" if hold == "paused" else "stopped by a command"
            self._stop_child(why)
            self._set(STOPPED, why, popen=None)
            return f"Stopped (pid {was})." if was else "The agent was not running."

    def restart(self) -> str:
        with self._op:
            self.stop(hold=None)
            return self.start().replace("Started", "Restarted")

    def send(self, sig: int) -> bool:
        """A signal to the agent's main process only (run-now, SIGHUP after settings)."""
        popen = self.popen
        # poll() first: a reaped child's PID may already belong to another process
        return popen is not None and popen.poll() is None and proc.signal_pid(popen.pid, sig)

    def shutdown(self) -> None:
        """The runtime stops: stop the agent gracefully, keep `agent_hold` as it is."""
        with self._op:
            self._shut = True
            self.next_start = None
            if self.pid() is not None:
                self._stop_child("the runtime stopped")
            self._set(STOPPED, "the runtime stopped", popen=None)

    # ------------------------------------------------------------ inside the lock

    def _set(self, status: str, reason: str, popen: Popen | None | Literal[False] = False) -> None:
        """The new status (and, given, the child: a Popen, or None once it is gone), as one change."""
        with self._view:
            changed = (status, reason) != (self.status, self.reason) or popen is not False
            if popen is not False:
                self.popen = popen
            self.status, self.reason = status, reason
        if changed:
            self.on_change()

    def _start(self) -> None:
        try:
            popen = self.launch()
        except LaunchError as exc:
            self._failed_start(str(exc))
            return
        self.started_at = self.clock()
        self._set(STARTING, "", popen=popen)
        stat = proc.proc_stat(popen.pid, self.proc_root) or {}
        self.store.set(KEY, {"pid": popen.pid, "start_time": stat.get("start_time"), "started_at": rfc3339(self.wall()),
                             "restarts": self.restarts, "last_exit": self.last_exit})
        if self.pump is None:
            self._unpumped = popen.stdout  # attach_pump drains it (spawn always gives the child a pipe)
        elif popen.stdout is not None:
            self.pump.note(f"started pid {popen.pid}")
            self.pump.attach(popen.stdout)
        log.info("agent started: pid %d", popen.pid)

    def _failed_start(self, reason: str) -> None:
        log.warning("agent not started: %s", reason)
        self.last_exit = {"code": None, "signal": None, "at": rfc3339(self.wall()),
                          "reason": f"could not start: {reason}"}
        self._after_exit(uptime=0.0, failed=True, what=f"could not start: {reason}")

    def _close_unpumped(self) -> None:
        """The pipe of a child gone before any pump was attached: nobody else will close it."""
        if self._unpumped is not None:
            self._unpumped.close()
            self._unpumped = None

    def _exited(self, popen: Popen) -> None:
        self._close_unpumped()
        uptime = self.clock() - (self.started_at or self.clock())
        code, sig, what = describe_exit(popen.returncode)
        proc.signal_pgid(popen.pid, signal.SIGKILL)  # what it left in its group goes with it
        self.last_exit = {"code": code, "signal": sig, "at": rfc3339(self.wall()), "reason": what}
        if self.pump is not None:
            self.pump.note(f"pid {popen.pid} {what} after {uptime:.0f} s")
        log.warning("agent pid %d %s after %.0f s%s", popen.pid, what, uptime,
                    self._last_words() if popen.returncode != 0 else "")
        self._after_exit(uptime, failed=popen.returncode != 0, what=what)

    def _last_words(self) -> str:
        """A failed agent's last output lines (cut; the daemon's log handler redacts them) and
        where the rest is: without them a restart loop logs only "exited with status 2"."""
        if self.pump is None:
            return ""
        lines = [line if len(line) <= LAST_WORDS_WIDTH else line[:LAST_WORDS_WIDTH - 1] + "…"
                 for line in self.pump.last_lines()]
        said = f"; its output ends: {' | '.join(lines)}" if lines else "; it printed nothing"
        return f"{said} (all of it: {self.pump.file.path})"

    def _after_exit(self, uptime: float, failed: bool, what: str) -> None:
        action, delay = self.policy.on_exit(self.clock(), uptime, failed)
        if action == RESTART and delay is not None:
            self.restarts += 1
            self.next_start = self.clock() + delay
            self._set(STARTING, f"{what}; restarting in {delay:.0f} s", popen=None)
        elif action == ERROR:
            many = len(self.policy.failures) >= MAX_FAILURES
            why = ("5 failures within 10 minutes: waiting for a command (start or restart)" if many
                   else f"not restarted (runtime.restart: {self.policy.mode})")
            self._set(FAILED, f"{what}; {why}", popen=None)
        else:
            self._set(STOPPED, what, popen=None)
        self._record()

    def _record(self) -> None:
        """After an exit or a stop: the agent is gone; its restarts and last exit stay."""
        record = self.store.get(KEY) or {}
        record.update(restarts=self.restarts, last_exit=self.last_exit, pid=None, start_time=None)
        self.store.set(KEY, record)

    def _stop_child(self, why: str) -> None:
        popen = self.popen
        if popen is None:
            return
        proc.stop_group(popen.pid, self.stop_signal, self.stop_timeout, reap=popen.poll, tick=self._tick)
        try:
            popen.wait(timeout=proc.REAP_WAIT)
        except subprocess.TimeoutExpired:  # the stop must end; what the kernel holds is reported
            log.error("agent pid %d still not gone %g s after SIGKILL (uninterruptible sleep?); "
                      "not waiting for it any longer", popen.pid, proc.REAP_WAIT)
        self._set(STOPPED, why, popen=None)
        self._close_unpumped()
        code, sig, what = describe_exit(popen.returncode)
        self.last_exit = {"code": code, "signal": sig, "at": rfc3339(self.wall()), "reason": f"{why}: {what}"}
        if self.pump is not None:
            self.pump.note(f"pid {popen.pid} {why} ({what})")
        log.info("agent pid %d %s (%s)", popen.pid, why, what)
        self._record()

    def _stop_survivor(self) -> None:
        """A runtime killed with -9 left its agent running: stop it before anything starts."""
        record = self.store.get(KEY) or {}
        pid, start_time = record.get("pid"), record.get("start_time")
        if not isinstance(pid, int) or not isinstance(start_time, int):
            return
        if not proc.same_process(pid, start_time, self.proc_root):
            self._record_gone()
            return
        log.warning("the previous runtime left its agent running (pid %d): stopping it", pid)
        def alive() -> bool:
            return proc.same_process(pid, start_time, self.proc_root)

        proc.stop_group(pid, self.stop_signal, self.stop_timeout, reap=lambda: None if alive() else 0,
                        tick=self._tick)
        if alive():
            raise LaunchError(f"the previous agent (pid {pid}) could not be stopped; not starting a second one")
        self.notes.append(f"the previous runtime's agent (pid {pid}) was still running; it was stopped")
        self._record_gone()

    def _record_gone(self) -> None:
        record = self.store.get(KEY) or {}
        record.update(pid=None, start_time=None)
        self.store.set(KEY, record)


def supervise_loop(supervisor: Supervisor, stop: threading.Event) -> None:
    """The supervisor thread: boot, a turn every POLL s, and a graceful stop at the end. A turn
    that raises (a full disk under state.json, a bug) is logged by the guard, once while it
    repeats, and the next comes after a backoff: the agent stays supervised."""
    from caldera.protocol.retry import Backoff  # here: `caldera status` reads through this module (no typing)

    guard = LoopGuard(log, "agent supervisor", Backoff())
    booted = tried = False
    while not stop.is_set() or not tried:  # boot is tried once even when asked to stop at once
        tried, delay = True, POLL
        try:
            if not booted:
                supervisor.boot()
                booted = True
            else:
                supervisor.step()
            guard.ok()
        except LaunchError as exc:  # the previous agent could not be stopped: start none, say why
            supervisor._set(FAILED, str(exc))
            log.error("%s", exc)
            stop.wait()
            return
        except Exception as exc:  # noqa: BLE001 -- a bug or a full disk must not end supervision
            delay = guard.failed(exc)
        stop.wait(delay)
    supervisor.shutdown()
