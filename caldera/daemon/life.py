"""A fetched command's life, in one place: its states, the one legal way between them, what
each step persists, what a restart finds there and what it sends to the control plane.

The server hands a command out once, so nothing fetched may be lost and nothing may run or
finish twice. The poller, the lanes, the executor and the outbox sender each hand the
command on to `Life` and decide no state themselves: the poller gives it the command it
fetched and parsed (`take`; and `fault`, when handing it to a lane raised), a lane the
command to run (`run`, which settles a step that raises), the sender a finish the plane took
(`delivered`); the executor only runs a handler under its timeout and says how it ended. As
in `asyncio.Future`, the states are named (`State`), each step is one method, and every
step goes through `Life._move`, which raises `IllegalTransition` for one `STEPS` lacks.

  step                       by         persists                      a restart finds            sends to the plane
  fetched -> journaled       take       state.json commands.<id>:     phase fetched: runs it     -
                                        the plane's object, `fetched`
  fetched -> refused         take       nothing (the journal          nothing: the plane keeps   finish failed "not run:
                                        refused the write)            it dispatched              ..." (straight)
  journaled -> started       run        phase `executing`             executing, no finish:      start (queued in the
                                                                      settled "interrupted"      outbox if it is away)
  started -> running         run        -                             as started                 (the handler's calls)
  started -> finished        run        - (the start was refused)     as started                 -
  running -> finished        run        - (the result, in memory)     as started                 -
  finished -> finish queued  run        outbox NNN-finish.json, then  the finish: the sender     - (the sender does)
                                        the journal entry removed     delivers it
  any live -> settled        fault,     a failed finish (unless one   the finish: the sender     - (the sender does)
                             recover    is recorded), the entry gone  delivers it
  finish queued -> delivered delivered  .finishes-delivered gets the  the id delivered: done     finish (POST, once)
                                        id, then the item goes

"Any live" is fetched, journaled, started, running, finished, and finish queued (a fault
after the finish was recorded keeps that finish: `states` knows it was, for a command this
process holds; for one found in the journal the outbox is asked). A settled or refused
finish waits in the outbox as a queued one does: the sender delivers it the same way.

A write the state dir refuses (a full disk) is never skipped on the run's three writes: a
command whose `executing` mark cannot be written waits (retrying, in its place) and a result
the outbox cannot take is held and retried, until the runtime stops; what is left then is
settled by the next start, as after a kill -9. The last-commands list is best effort.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.daemon.executor import Executor, executor_for
from caldera.errors import AuthBlocked, CalderaError, Retryable, unexpected
from caldera.host.storage import describe
from caldera.host.timefmt import rfc3339
from caldera.protocol.client import NotFound, Unsendable
from caldera.protocol.command import Command, MalformedCommand, parse_command
from caldera.protocol.payloads import finish_body
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from caldera.backends.registry import ActiveRuns
    from caldera.daemon.wiring import Parts
    from caldera.host.statefile import StateFile
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.outbox import Outbox
    from caldera.redact import Redactor

log = logging.getLogger("caldera.life")

JOURNAL_KEY = "commands"
RECENT_KEY, RECENT_KEPT = "recent_commands", 10  # what `caldera status` shows as the last commands
INTERRUPTED = "interrupted: runtime restarted"
BROKEN = "internal error in the runtime"  # and the exception type and place; a bug to report
# Commands that change nothing: their finish asks for a report without making older ones stale,
# so a queue of them is answered by one recent report (docs/performance.md, the drain).
READ_ONLY = frozenset(("health_check", "collect_system_info", "log_list", "log_get", "settings_get"))


class State(enum.Enum):
    FETCHED = "fetched"
    JOURNALED = "journaled"
    STARTED = "started"
    RUNNING = "running"
    FINISHED = "finished"
    FINISH_QUEUED = "finish queued"
    DELIVERED = "delivered"
    SETTLED = "settled after a fault"
    REFUSED = "refused"


LIVE = (State.FETCHED, State.JOURNALED, State.STARTED, State.RUNNING, State.FINISHED, State.FINISH_QUEUED)
# The one table of legal steps (the docstring's, row for row; tests/daemon/test_daemon_life.py
# takes each of them once and an illegal one).
STEPS: frozenset[tuple[State, State]] = frozenset({
    (State.FETCHED, State.JOURNALED), (State.FETCHED, State.REFUSED),
    (State.JOURNALED, State.STARTED), (State.STARTED, State.RUNNING), (State.STARTED, State.FINISHED),
    (State.RUNNING, State.FINISHED), (State.FINISHED, State.FINISH_QUEUED),
    (State.FINISH_QUEUED, State.DELIVERED), *((s, State.SETTLED) for s in LIVE)})
ENDS = (State.SETTLED, State.REFUSED)  # from here on, the outbox or the plane holds it (and after `run`)


class IllegalTransition(RuntimeError):
    """A step `STEPS` does not have: a bug in whoever asked for it."""


def step(command_id: object, source: State, target: State) -> None:
    """The check of every step: IllegalTransition unless `STEPS` has it."""
    if (source, target) not in STEPS:
        raise IllegalTransition(f"command {command_id}: {source.value} -> {target.value}")


class Life:
    """Takes fetched commands to their durable finish; `states` holds the commands alive in
    this process (one a lane or the poller holds), by key. A command this process did not
    fetch (a test's, or one `recover` returned to another `Life`) is where its journal says:
    journaled."""

    __slots__ = ("agent_id", "client", "state", "outbox", "redactor", "executor", "report_now", "runs", "report_soon",
                 "stop", "states", "_lock")

    agent_id: str
    client: ControlPlaneClient
    state: StateFile  # the journal
    outbox: Outbox
    redactor: Redactor
    executor: Executor  # runs a handler under its timeout
    report_now: Callable[[], None]  # the state changed: a report now, no older one answers a command
    runs: ActiveRuns | None  # accepted agent runs, for agent_interrupt
    report_soon: Callable[[], None]  # a report now, the state unchanged
    stop: threading.Event  # the runtime's stop: ends a wait for space
    states: dict[str, State]
    _lock: threading.Lock

    def __init__(self, agent_id: str, client: ControlPlaneClient, state: StateFile, outbox: Outbox,
                 redactor: Redactor, executor: Executor, report_now: Callable[[], None],
                 runs: ActiveRuns | None = None, report_soon: Callable[[], None] = lambda: None,
                 stop: threading.Event | None = None) -> None:
        self.agent_id = agent_id
        self.client = client
        self.state = state
        self.outbox = outbox
        self.redactor = redactor
        self.executor = executor
        self.report_now = report_now
        self.runs = runs
        self.report_soon = report_soon
        self.stop = threading.Event() if stop is None else stop
        self.states = {}
        self._lock = threading.Lock()

    def _move(self, command: Command, target: State) -> None:
        """Every step of a command this process holds: legal by `STEPS`, else IllegalTransition.
        A command that reaches an end leaves `states` (the outbox or the plane holds it then)."""
        with self._lock:
            step(command.id, self.states.get(command.key, State.JOURNALED), target)
            if target in ENDS:
                self.states.pop(command.key, None)
            else:
                self.states[command.key] = target

    # ------------------------------------------------------------ fetched -> journaled | refused

    def take(self, command: Command, stop: threading.Event | None = None, deadline: float | None = None,
             tick: Callable[[], None] = lambda: None) -> bool:
        """A command the poller fetched: True when it is journaled, to be handed to a lane; False
        when the journal refused it (finished failed, not run: `_refuse`, which tries until `stop`
        is set or `deadline` (time.monotonic()) passes, calling `tick` on each try) or when it is
        alive here already (the plane handed it out again: its one life goes on)."""
        with self._lock:
            if command.key in self.states:
                log.warning("command %s fetched again while it is %s here; ignored", command.id,
                            self.states[command.key].value)
                return False
            self.states[command.key] = State.FETCHED
        try:
            self.journal(command)
        except OSError as exc:
            self._refuse(command, exc, stop or threading.Event(), deadline, tick)
            return False
        except Exception as exc:  # a bug in (or after) the journal's write: finished now, not at the next start
            self.fault(command, exc)
            raise
        return True

    def journal(self, command: Command) -> None:
        """fetched -> journaled: the plane's object verbatim (`raw`), and what the fetch found
        (`too_large`) beside it: recovery parses it again. An accepted agent_run is announced
        from now on: an interrupt that arrives before its turn starts reaches it then."""
        with self._lock:
            self.states.setdefault(command.key, State.FETCHED)
        entry = {"phase": "fetched", "command": command.raw, "fetched_at": rfc3339()}
        if command.too_large is not None:
            entry["too_large"] = command.too_large
        self.state.update(JOURNAL_KEY, lambda j: {**(j or {}), command.key: entry})
        self._move(command, State.JOURNALED)
        log.info("command %s (%s) received", command.id, command.type)
        self._announce(command)

    def _announce(self, command: Command) -> None:
        if self.runs is not None and command.type == "agent_run" and command.run_id is not None:
            self.runs.queue(command.run_id)

    def _refuse(self, command: Command, exc: OSError, stop: threading.Event, deadline: float | None,
                tick: Callable[[], None]) -> bool:
        """fetched -> refused: finished `failed` (never run) straight through the client,
        retried with backoff until the plane takes it, the outbox takes it (the sender then
        delivers it), `stop` is set or `deadline` passes. True when settled."""
        self._move(command, State.REFUSED)
        reason = unjournaled_reason(exc, self.state.path)
        log.error("command %s (%s) %s", command.id, command.type, reason)
        body = finish_body(self.agent_id, "failed", {}, reason)
        backoff = Backoff()
        while True:
            tick()  # a plane away as well may keep this up for minutes: the watchdog must not take it for a hang
            try:
                self.client.finish_command(command.id, body)
                log.warning("command %s finished failed (not run: it could not be recorded)", command.id)
                return True
            except (NotFound, Unsendable) as refused:
                if isinstance(refused, Unsendable) or refused.from_server:  # the plane never takes it
                    log.error("command %s: its failed finish is refused for good (%s)", command.id, refused)
                    return True
                failure: Exception = refused
            except Exception as other:  # noqa: BLE001 -- the plane is away or failed: retried
                failure = other
            if self._outbox_takes(command, body):
                return True
            delay = backoff.after(failure)
            if deadline is not None and time.monotonic() + delay > deadline or stop.wait(delay):
                log.error("command %s: its failed finish did not reach the plane before the stop (%s); the plane "
                          "keeps it dispatched", command.id, self.redactor(str(failure)))
                return False

    def _outbox_takes(self, command: Command, body: dict[str, Any]) -> bool:
        """The refused finish into the outbox, if space came back meanwhile: the sender delivers it."""
        try:
            self.outbox.put("finish", {"command_id": command.id, "command_type": command.type, "body": body})
        except OSError:
            return False
        log.warning("command %s: its failed finish (not run) is in the outbox", command.id)
        return True

    # ------------------------------------------------------------ journaled -> ... -> finish queued

    def run(self, command: Command, cancel: threading.Event | None = None, deadline: float | None = None) -> str:
        """A journaled command to its recorded finish; returns the status. `deadline` (report
        --once's) bounds the handler's time and its cancel grace. "deferred": the runtime
        stopped while the state dir refused its `executing` mark (it stays journaled: the next
        start runs it). A step that raises (a bug) settles the command here (`fault`), then the
        exception goes on to the lane's guard."""
        try:
            return self._run(command, cancel, deadline)
        except Exception as exc:
            self.fault(command, exc)
            raise
        finally:
            with self._lock:
                self.states.pop(command.key, None)  # the lane is done with it: the journal or the outbox holds it

    def _run(self, command: Command, cancel: threading.Event | None, deadline: float | None) -> str:
        if not self._until_written(lambda: self._journal_phase(command.key, "executing"), command,
                                   "its executing mark (it waits in its place)", cancel):
            log.warning("command %s (%s) kept for the next start: the state dir took no writes", command.id,
                        command.type)
            return "deferred"
        self._move(command, State.STARTED)
        refused = self._send_start(command)
        result: dict[str, Any] = {}
        if refused is not None:
            status, error = "failed", refused
        else:
            self._move(command, State.RUNNING)
            status, result, error = self.executor.run_handler(command, cancel, deadline)
        self._move(command, State.FINISHED)
        if not self._until_written(lambda: self._put_finish(command, status, result, error), command,
                                   f"its result ({status})", cancel):
            log.error("command %s (%s) %s but its result could not be recorded before the stop; the next start "
                      "finishes it failed (%s)", command.id, command.type, status, INTERRUPTED)
            return status
        self._move(command, State.FINISH_QUEUED)
        self._after_finish(command, status, error, cancel)
        return status

    def _after_finish(self, command: Command, status: str, error: str, cancel: threading.Event | None) -> None:
        """The finish is recorded: the run is forgotten, the entry goes (so that no restart
        settles the command again; on a stop first, the outbox's copy or its delivered record
        settles it then), and a report is asked for."""
        if self.runs is not None and command.type == "agent_run":
            self.runs.forget(command.run_id)
        try:
            self._remember(command, status, error)
        except OSError as exc:  # only `caldera status`'s list: never in the way of the journal
            log.warning("command %s: not added to the last commands (%s)", command.id, exc.strerror or exc)
        self._until_written(lambda: self._journal_remove(command.key), command, "its journal entry's removal", cancel)
        log.info("command %s (%s) %s%s", command.id, command.type, status, f": {error}" if error else "")
        if command.type in READ_ONLY:
            self.report_soon()  # nothing changed: a recent report may still answer the next
        else:
            self.report_now()

    def _send_start(self, command: Command) -> str | None:
        """None when execution may go on; else the reason to finish failed."""
        body = {"agent_id": self.agent_id, "started_at": rfc3339()}
        try:
            self.client.start_command(command.id, body)
        except NotFound as exc:
            if exc.from_server:
                return f"the control plane does not know this command: {exc.message}"
            self._queue_start(command, body)  # a proxy's 404: try later
        except Unsendable as exc:
            return str(exc)  # an id that cannot go into a URL: not executed (its finish is refused too)
        except (Retryable, AuthBlocked):
            # The agent keeps working: the start goes out later, before the finish.
            self._queue_start(command, body)
        except CalderaError as exc:
            log.warning("start of command %s refused (%s); executing it anyway", command.id, exc)
        return None

    def _queue_start(self, command: Command, body: dict[str, Any]) -> None:
        try:
            self.outbox.put("start", {"command_id": command.id, "body": body})
        except OSError as exc:  # the plane takes a finish without a start: only the `running` state is missed
            log.warning("command %s: its start could not be queued (%s); executing it anyway",
                        command.id, exc.strerror or exc)

    # ------------------------------------------------------------ any live -> settled

    def fault(self, command: Command, exc: BaseException) -> None:
        """A command whose way raised (a bug): finished failed now, not at the next start (under
        systemd that may be weeks), unless its finish is already recorded; its journal entry
        goes. When the state dir refuses (or the same bug again) it stays in the journal, which
        the next start settles."""
        try:
            self._settle(command, f"{BROKEN}: {unexpected(exc)}")
        except Exception as again:  # noqa: BLE001 -- a full disk or the same bug: the next start settles it
            log.error("command %s could not be settled (%s); it stays in the journal for the next start",
                      command.id, type(again).__name__)
            return
        log.warning("command %s (%s) settled: its way raised %s", command.id, command.type, type(exc).__name__)

    def _settle(self, command: Command, error: str, recorded: bool | None = None) -> None:
        """any live -> settled: a failed finish unless one is `recorded`, then the entry goes.
        Whether it is: known here for a command this process holds (its finish queued), else
        asked of the outbox (a command found in the journal)."""
        with self._lock:
            held = self.states.get(command.key)
            self.states.setdefault(command.key, State.JOURNALED)
        if recorded is None:
            recorded = held is State.FINISH_QUEUED if held is not None else self.outbox.has_finish(command.id)
        if not recorded:
            self._put_finish(command, "failed", {}, error)
        self._move(command, State.SETTLED)
        self._journal_remove(command.key)

    def recover(self) -> list[Command]:
        """After a restart: the journaled commands to run now (they never began and have no
        finish); those that began without a recorded finish are settled INTERRUPTED, and those
        with one (a kill after their finish or a fault's) leave the journal."""
        to_run, finished = [], self.outbox.finish_ids()
        for key, entry in sorted((self.state.get(JOURNAL_KEY) or {}).items(), key=_fetch_order):
            command = _journaled(key, entry)
            if isinstance(entry, dict) and entry.get("phase") == "fetched" and key not in finished:
                self._announce(command)
                to_run.append(command)
                continue
            if key not in finished:
                log.warning("command %s (%s) was interrupted by a restart; finishing it failed", key, command.type)
            try:
                self._settle(command, INTERRUPTED, key in finished)
            except OSError as exc:
                if key in finished:  # recorded: the next start removes the entry
                    log.warning("command %s: its journal entry stays until there is space (%s)", key,
                                exc.strerror or exc)
                    continue
                # A full disk at the start: heartbeats must begin, so a lane finishes it (waiting for
                # space); refused with INTERRUPTED, it never runs and that is its one finish.
                log.error("command %s: its finish cannot be recorded now (%s); a lane records it when it can",
                          key, exc.strerror or exc)
                to_run.append(command._replace(refusal=INTERRUPTED))
        return to_run

    # ------------------------------------------------------------ the writes

    def _journal_phase(self, key: str, phase: str) -> None:
        def mark(journal: dict[str, Any] | None) -> dict[str, Any]:
            journal = journal or {}
            if key in journal:
                journal[key] = {**journal[key], "phase": phase}
            return journal

        self.state.update(JOURNAL_KEY, mark)

    def _journal_remove(self, key: str) -> None:
        self.state.update(JOURNAL_KEY, lambda j: {k: v for k, v in (j or {}).items() if k != key})

    def _put_finish(self, command: Command, status: str, result: dict[str, Any], error: str) -> None:
        body = finish_body(self.agent_id, status, self.redactor(result or {}), self.redactor(error or ""))
        self.outbox.put("finish", {"command_id": command.id, "command_type": command.type, "body": body})

    def _remember(self, command: Command, status: str, error: str) -> None:
        """The last few finished commands, newest first, for `caldera status` (state.json, bounded)."""
        entry = {"id": command.id, "command_type": command.type, "status": status, "finished_at": rfc3339(),
                 "error": self.redactor(error or "")[:300]}

        def prepend(items: list[Any] | None) -> list[Any]:
            kept = [i for i in (items or []) if isinstance(i, dict) and i.get("id") != command.id]
            return ([entry] + kept)[:RECENT_KEPT]

        self.state.update(RECENT_KEY, prepend)

    def _until_written(self, write: Callable[[], None], command: Command, what: str,
                       cancel: threading.Event | None) -> bool:
        """`write()` until the state dir takes it; False when the runtime stops (or the command is
        cancelled) first. A write refused is logged once, then retried with backoff."""
        backoff, refused = Backoff(), False
        while True:
            try:
                write()
            except OSError as exc:
                if not refused:
                    log.error("command %s (%s): cannot record %s: %s; retrying until the state dir takes it",
                              command.id, command.type, what, exc.strerror or exc)
                refused = True
                if self._pause(backoff.after(exc), cancel):
                    return False
                continue
            if refused:
                log.warning("command %s (%s): %s recorded", command.id, command.type, what)
            return True

    def _pause(self, delay: float, cancel: threading.Event | None) -> bool:
        """Wait `delay` seconds; True as soon as the runtime stops or `cancel` is set."""
        events = [e for e in (cancel, self.stop) if e is not None]
        end = time.monotonic() + delay
        while not any(e.is_set() for e in events):
            left = end - time.monotonic()
            if left <= 0:
                return False
            events[0].wait(min(left, 0.5))  # both are watched: the lanes' cancel, the daemon's stop
        return True


# ------------------------------------------------------------ finish queued -> delivered

def delivered(outbox: Outbox, name: str, item: dict[str, Any]) -> None:
    """The plane took an outbox item (the sender's hand-off). For a finish, finish queued ->
    delivered: its command id is recorded before the item goes, so that a restart between the
    delivery and the journal's last write knows the command is settled (`Life.recover`) and
    never finishes it a second time; a record the full disk refuses keeps the item (not sent
    again) until it can be written. Any other item just goes."""
    if item.get("kind") != "finish":
        outbox.done(name)
        return
    command_id = item.get("command_id")
    step(command_id, State.FINISH_QUEUED, State.DELIVERED)  # a finish in the outbox is one queued, whoever put it
    if outbox.record_delivered(name, str(command_id)):
        outbox.done(name)


def unjournaled_reason(exc: OSError, path: object) -> str:
    return (f"not run: the runtime could not record the command before running it ({describe(exc)}: {path}); "
            "the control plane hands a command out once, so it is finished failed rather than lost")


def _fetch_order(item: tuple[str, Any]) -> tuple[int, int, str]:
    """Journal entries in the order they were fetched: the plane's ids are integers handed out
    in order, so they sort as numbers ("9" before "10", by length then digits: no int() of a
    huge string); other ids after them, as text."""
    key = item[0]
    if key.isascii() and key.isdigit():
        digits = key.lstrip("0")
        return 0, len(digits), digits
    return 1, 0, key


def _journaled(key: str, entry: Any) -> Command:
    """A journal entry's command, parsed again; one that no longer parses (an entry this
    version did not write) is still named by its key, so that it is settled, never lost."""
    raw = entry.get("command") if isinstance(entry, dict) else None
    too_large = entry.get("too_large") if isinstance(entry, dict) else None
    try:
        return parse_command(raw or {"id": key}, too_large=str(too_large) if too_large is not None else None)
    except MalformedCommand:
        return parse_command({"id": key})


def life_for(parts: Parts) -> Life:
    """The life of a connected runtime's commands, with the executor of its parts."""
    client, _ = parts.connection()
    return Life(agent_id=parts.identity.agent_id, client=client, state=parts.state, outbox=parts.outbox,
                redactor=parts.redactor, executor=executor_for(parts), report_now=parts.wake.report_now,
                runs=parts.runs, report_soon=parts.wake.report_soon, stop=parts.wake.stop)
