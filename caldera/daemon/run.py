"""`caldera run`: the daemon. Starts the loops as threads and handles signals.

Signals (SPEC section 4): the 1st SIGTERM/SIGINT drains (no new commands, the
running one finishes within DRAIN_GRACE); then everything else fits in
STOP_BUDGET (8.5 s; 10 s with the process's exit) even while the server hangs:
requests in flight get ANSWER_GRACE to be answered, then are interrupted, the loops end, the outbox is flushed and a
final report says `stopping`, each call bounded by what is left. The 2nd signal
cancels the running command; the 3rd exits at once. SIGHUP (`systemctl reload`)
re-reads agent.env and secrets.env (caldera.daemon.reload): unchanged, it lifts
a blocked auth path; changed, the daemon stops as on SIGTERM and `run` returns
REEXEC, on which `caldera run` restarts itself in place. The handlers only count
(caldera.daemon.signals); the main thread acts. An intended stop exits 0 so that
systemd does not fight it.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from caldera.agents.narrow import as_process_driver
from caldera.backends.leftovers import sweep as sweep_leftovers
from caldera.daemon.heartbeat import ConnectionStatus, heartbeat_loop
from caldera.daemon.lanes import Lanes
from caldera.daemon.life import Life, life_for
from caldera.daemon.poller import poll_loop
from caldera.daemon.reload import reread
from caldera.daemon.reporter import report_loop
from caldera.daemon.sender import flush, sender_loop
from caldera.daemon.signals import Signals
from caldera.daemon.snapshot import write_snapshot
from caldera.daemon.startnotes import start_warnings
from caldera.daemon.wiring import Parts, close_servers
from caldera.host import proc, sdnotify
from caldera.host.fsutil import StateLock
from caldera.skills.watcher import skills_loop

if TYPE_CHECKING:
    from pathlib import Path

    from caldera.agents.process.control import ControlServer

log = logging.getLogger("caldera.daemon")

DRAIN_GRACE = 30.0
STOP_BUDGET = 8.5  # after the running command's grace: loops, final flush, final report (10 s with the exit)
LOOPS_END = 2.0  # of it, for the loops to see the stop (their requests are interrupted)
ANSWER_GRACE = 1.0  # of LOOPS_END: a request being answered finishes before the rest are interrupted
FINAL_REPORT = 3.0  # of it, kept for the final report
LIVENESS = 90.0  # a loop silent for longer than this stops the watchdog pings
REEXEC = -1  # run()'s answer after a reload that changed the configuration
EXIT_GUARD = 10.0  # after run() returned: the longest the interpreter's exit may take
# The first watchdog ping goes with READY=1: after a restart in place systemd's watchdog kept
# running through the reload, and the next ping would come only a watchdog period later.
READY = "READY=1\nWATCHDOG=1"
# A process agent's graceful stop may take stop_timeout_seconds (up to 300 s), more than the
# unit's TimeoutStopSec=90s: while it stops, systemd is asked for EXTEND_BY more every
# EXTEND_EVERY, then once for what the rest of the stop may take (drain, lanes, budget, exit).
EXTEND_EVERY = 10.0
EXTEND_BY = 30.0
REST_OF_STOP = DRAIN_GRACE + 10.0 + STOP_BUDGET + EXIT_GUARD + 5.0


def agent_stop_limit(stop_timeout: float) -> float:
    """How long the agent's stop may take before the daemon stops asking for time, says which
    thread is stuck and goes on (systemd then kills the unit at the last extension): a stop
    verb's stop may hold the supervisor, then comes the runtime's own, each the signal's
    timeout, the KILL wait and the reap wait; 10 s for the log pump's flush."""
    return 2 * (stop_timeout + proc.STOP_KILL_WAIT + proc.REAP_WAIT) + 10.0


def start_threads(parts: Parts, lanes: Lanes, life: Life) -> list[threading.Thread]:
    """One thread per loop, each given the few parts it uses."""
    client, auth = parts.connection()
    wake, live, redactor = parts.wake, parts.live, parts.redactor
    status = ConnectionStatus(parts.state, redactor, auth, on_recovery=wake.outbox.set)
    bodies: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = [
        ("heartbeat", heartbeat_loop, (client, auth, parts.reports, status, wake, live, lanes.desired_revision)),
        ("reporter", report_loop, (client, parts.reports, wake, live, lambda: parts.settings.report_interval,
                                   redactor, lambda: write_snapshot(parts))),
        ("poller", poll_loop, (client, auth, life, lanes, wake, live)),
        ("sender", sender_loop, (client, parts.outbox, wake, live, redactor)),
        ("skills", skills_loop, (parts.publisher, wake, live)),
    ]
    threads = []
    for name, body, args in bodies:
        # daemon: a loop still inside a hung adapter call cannot hold the process past its stop budget
        thread = threading.Thread(target=body, name=name, args=args, daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def run(parts: Parts, signals: Signals) -> int:
    """0 after a stop, 1 when another daemon runs this agent, REEXEC after a changing reload
    (the signals are then held: see caldera.daemon.signals). `signals` were installed by the
    caller before it built the parts, so that a SIGTERM during start-up is a graceful stop."""
    lock = StateLock(parts.paths.state_dir, "daemon")
    if not lock.acquire():
        print(f"caldera run: {already_run(parts.paths.name, parts.paths.state_dir, lock.holder())}", file=sys.stderr)
        return 1
    with lock:
        sweep_leftovers(parts.paths.state_dir / "runs")  # what a runtime killed mid-run left (docs/backends.md)
        if signals.count:  # asked to stop during start-up (or held across a restart): start nothing
            log.info("stopped before starting: a stop was asked during start-up")
            sdnotify.notify("STOPPING=1")
            return 0
        if not parts.settings.enabled or parts.client is None:
            return _run_local(parts, signals)
        return _run_connected(parts, signals)


def already_run(name: str, state_dir: Path, holder: str | None) -> str:
    """Why a second `caldera run` of one agent does not start, and what to do: the state
    dir's lock holder ("PID ROLE") as a person reads it, and how to stop it (its unit's
    stop when systemd runs it, else its pid's SIGTERM), or that a one-shot report ends soon."""
    pid, _, role = (holder or "").partition(" ")
    if role == "report" and pid.isdigit():
        return (f"agent {name} is busy: pid {pid} (caldera report --once) holds its state dir {state_dir}; it ends "
                "within its deadline: start caldera run then")
    if not pid.isdigit():
        return f"agent {name} already runs: another process holds its state dir {state_dir} ({holder})"
    unit = f"caldera@{name}.service"
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            by_unit = unit in fh.read()
    except OSError:
        by_unit = False
    stop = f"sudo systemctl stop caldera@{name}" if by_unit else f"kill -TERM {pid}"
    return (f"agent {name} already runs: pid {pid} (caldera run) holds its state dir {state_dir}, and an agent has "
            f"one runtime; `caldera status` with the same flags shows it; to start it here, stop that one first "
            f"({stop})")


def _reread(parts: Parts) -> bool:
    """SIGHUP's re-read; a bug in it keeps the running configuration rather than ending the
    main thread (and with it the daemon) on an operator's `systemctl reload`."""
    try:
        return reread(parts)
    except Exception:  # noqa: BLE001 -- logged; the next reload tries again
        log.exception("reload failed; keeping the running configuration")
        return False


def _restart_or_stop(signals: Signals) -> int:
    """After a changing reload's stop sequence: REEXEC, unless a SIGTERM/SIGINT came
    meanwhile: the operator's stop wins over the reload (`systemctl reload` then `stop`)."""
    if signals.hold():
        return REEXEC
    log.info("a stop was asked during the reload: stopping, not restarting")
    sdnotify.notify("STOPPING=1")
    return 0


def _run_local(parts: Parts, signals: Signals) -> int:
    """CALDERA_AGENT_ENABLED is not true: no control plane; the CLI verbs still work."""
    log.info("control plane disabled (CALDERA_AGENT_ENABLED is not true); staying local; %s", _to_connect(parts))
    start_warnings(parts)  # after the first line, which says how to connect
    write_snapshot(parts)
    agent = start_agent_supervisor(parts)
    sdnotify.notify(READY)
    while signals.count == 0:
        signals.wait(_watchdog_period())
        if signals.take_hup() and _reread(parts):
            sdnotify.notify("RELOADING=1")  # not STOPPING=1: systemd would wait for an exit
            stop_agent_supervisor(agent)  # the restarted runtime starts it again, with the new env
            return _restart_or_stop(signals)
        sdnotify.notify("WATCHDOG=1")
    sdnotify.notify("STOPPING=1")
    stop_agent_supervisor(agent)
    return 0


def _to_connect(parts: Parts) -> str:
    """What connects this daemon to its plane, from where it runs: systemd's reload, or a
    SIGHUP to this process (started by hand); agent.env may not exist yet (a checkout)."""
    env = parts.paths.agent_env
    where = f"{env} (not there yet: create it)" if not env.exists() else str(env)
    then = (f"systemctl reload caldera@{parts.paths.name}" if sdnotify.by_systemd()
            else f"kill -HUP {os.getpid()} (this process)")
    return (f"to connect, set CALDERA_AGENT_ENABLED=true, CALDERA_BASE_URL and CALDERA_INSTANCE_ID in {where} "
            f"and CALDERA_TOKEN in {parts.paths.secrets_env}, then {then}")


class Supervision(NamedTuple):
    """A process-mode agent's supervision while the daemon runs."""

    stop: threading.Event  # set: the supervisor stops the agent and returns
    thread: threading.Thread
    server: ControlServer  # the host CLI's verbs
    limit: Callable[[], float]  # how long the agent's stop may take (agent_stop_limit)


def start_agent_supervisor(parts: Parts) -> Supervision | None:
    """Process mode: the supervisor thread and the CLI's control socket; None otherwise."""
    driver = as_process_driver(parts.current.driver)
    if driver is None:
        return None
    from caldera.agents.process.control import ControlServer  # deferred: only process mode has a socket

    stop = threading.Event()
    thread = threading.Thread(target=driver.supervise, args=(stop,), name="supervisor")
    thread.start()
    server = ControlServer(driver, parts.paths.state_dir, parts.redactor)
    server.start()
    return Supervision(stop, thread, server, lambda: agent_stop_limit(driver.spec.stop_timeout))


def stop_agent_supervisor(agent: Supervision | None) -> None:
    """The agent first (SIGTERM to the runtime stops it gracefully), then the control socket.
    While it stops, systemd is asked for more time (EXTEND_TIMEOUT_USEC), up to a bound."""
    if agent is None:
        return
    stop, thread, server, limit = agent
    log.info("stopping the agent")
    stop.set()
    give_up = time.monotonic() + limit()
    while thread.is_alive() and time.monotonic() < give_up:
        sdnotify.notify(_extend(EXTEND_BY))  # a no-op outside systemd
        thread.join(min(EXTEND_EVERY, max(0.0, give_up - time.monotonic())))
    if thread.is_alive():
        log.error("the agent's stop did not end within %.0f s (thread %s still busy); going on without it",
                  limit(), thread.name)
    sdnotify.notify(_extend(REST_OF_STOP))
    server.close()


def _extend(seconds: float) -> str:
    """systemd lets a stopping unit run past TimeoutStopSec while it keeps asking for more."""
    return f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}"


def _watchdog_period() -> float:
    interval = sdnotify.watchdog_interval()
    return interval / 2 if interval else 3600.0


def _run_connected(parts: Parts, signals: Signals) -> int:
    start_warnings(parts)
    client, _ = parts.connection()
    life = life_for(parts)
    lanes = Lanes(life, on_idle=parts.wake.poll.set)
    parts.live.count_drops("lanes", lambda: lanes.refused)
    lanes.start()
    try:
        for command in life.recover():
            lanes.submit(command)
    except BaseException:
        lanes.close(timeout=10.0)  # the lanes' threads would hold a failed start forever (exit, not hang)
        raise
    agent = start_agent_supervisor(parts)
    threads = start_threads(parts, lanes, life)
    log.info("caldera run: agent %s as %s against %s", parts.paths.name, parts.identity.agent_id,
             parts.settings.base_url)
    write_snapshot(parts)  # `caldera status` works from the moment systemd says started
    sdnotify.notify(READY)
    names = [t.name for t in threads]
    outcome = 0
    while signals.count == 0:
        signals.wait(_watchdog_period())
        if signals.take_hup() and _reread(parts):
            outcome = REEXEC
            break
        if signals.count == 0 and parts.live.alive(names, LIVENESS):
            sdnotify.notify("WATCHDOG=1")
    # RELOADING=1 keeps the unit `reloading` until the restarted daemon's READY=1;
    # STOPPING=1 would make systemd wait for an exit that a reload never does.
    sdnotify.notify("STOPPING=1" if outcome == 0 else "RELOADING=1")
    parts.wake.draining.set()  # the poller fetches no more commands (the agent's stop may take minutes)
    parts.wake.poll.set()
    stop_agent_supervisor(agent)  # the agent first: SIGTERM stops it gracefully (a reload restarts it)
    log.info("stopping: draining (a second signal cancels the running command)")
    _drain(lanes, signals, client.transport.abort)
    # No run is left to use the backends' servers (OpenCode's): they stop while the loops do,
    # within the same budget, and are gone before a restart in place (exec keeps the pid).
    closing = threading.Thread(target=close_servers, args=(parts,), name="servers-stop", daemon=True)
    closing.start()
    stop_by = time.monotonic() + STOP_BUDGET
    _stop(parts, threads, stop_by)
    closing.join(max(0.0, stop_by - time.monotonic()))
    if closing.is_alive():
        log.error("the backends' servers did not stop within the stop budget; going on without them")
    parts.pool.shutdown(wait=False, cancel_futures=True)
    if outcome == REEXEC:
        outcome = _restart_or_stop(signals)
    log.info("stopped" if outcome == 0 else "stopped; restarting with the new configuration")
    return outcome


def _stop(parts: Parts, threads: list[threading.Thread], stop_by: float) -> None:
    client, _ = parts.connection()
    parts.wake.shutdown()
    loops_by = time.monotonic() + LOOPS_END
    # A request being answered ends first: a finish the plane took whose answer the abort cut
    # off stayed in the outbox, and the final flush delivered it a second time. What is still
    # in flight after ANSWER_GRACE is interrupted: a hanging server holds no loop.
    _join(threads, time.monotonic() + ANSWER_GRACE)
    interrupted = client.transport.abort("stopping")
    _join(threads, loops_by)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck or interrupted:
        log.info("stopping: %d request(s) interrupted; %s", interrupted,
                 f"loops still busy: {', '.join(stuck)}" if stuck else "every loop ended")
    _final_flush(parts, stop_by)
    write_snapshot(parts)  # `caldera status` after the stop shows what it left (the outbox after the flush)


def _join(threads: list[threading.Thread], by: float) -> None:
    for thread in threads:
        thread.join(max(0.0, by - time.monotonic()))


def _drain(lanes: Lanes, signals: Signals, abort: Callable[[str], int]) -> None:
    deadline = time.monotonic() + DRAIN_GRACE
    while not lanes.idle() and time.monotonic() < deadline and signals.count < 2:
        signals.wait(0.2)
    if not lanes.idle():
        lanes.cancel.set()
        abort("cancelled: runtime stopping")  # a command waiting on a hanging server sees its cancel now
        log.warning("cancelling the running command")
    lanes.close(timeout=10.0)


def _final_flush(parts: Parts, stop_by: float) -> None:
    """Flush the outbox, then the final report (`stopping`), each call bounded by `stop_by`."""
    client, _ = parts.connection()
    flush_by = stop_by - FINAL_REPORT
    try:
        with client.within(flush_by):
            flush(client, parts.outbox, parts.wake.stop, deadline=flush_by)
    except Exception as exc:  # noqa: BLE001 -- kept in the outbox for next time
        log.warning("outbox not flushed before stop (%d kept): %s", parts.outbox.depth(), parts.redactor(str(exc)))
    try:
        if as_process_driver(parts.current.driver) is not None:
            # Process mode: the agent was stopped first, so the final report says so (stopped, no
            # pid) rather than repeating its last running section. (Adapter mode keeps the cached
            # section: its status verb is a subprocess, and the stop does not wait for one.)
            parts.reports.section()
        parts.live.mark_stopping()
        with client.within(stop_by):  # through the 2 s floor; never waits past stop_by for it
            body, _ = parts.reports.send(client, threading.Event(), parts.live.last_section,
                                         lock_timeout=max(0.0, stop_by - time.monotonic()))
        if body is None:
            log.warning("final state report not sent: no time left")
    except Exception as exc:  # noqa: BLE001
        log.warning("final state report not delivered: %s", parts.redactor(str(exc)))


def arm_exit_guard(seconds: float = EXIT_GUARD) -> threading.Timer:
    """After the stop sequence: if the interpreter's exit is still held `seconds` later
    (a non-daemon thread that does not end: a pool worker, a lane), say where every thread
    is and exit 0. Every result is durable by now (journal, outbox), and a daemon asked to
    stop must stop: systemd would otherwise wait for TimeoutStopSec and kill it."""
    def fire() -> None:
        log.error("still running %g s after stopping; every thread's stack follows; exiting", seconds)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(0)

    timer = threading.Timer(seconds, fire)
    timer.daemon, timer.name = True, "exit-guard"
    timer.start()
    return timer

