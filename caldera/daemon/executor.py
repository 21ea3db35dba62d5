"""Running one control-plane command, durably.

The server hands a command out once, so nothing fetched may be lost:
  fetched   -> recorded in the journal (state.json) before anything else
  executing -> marked before `start`; a crash from here on means "interrupted"
  result    -> the finish goes into the durable outbox, then the journal entry goes
A restarted runtime executes what never began, finishes `failed` ("interrupted:
runtime restarted") what began without a recorded result, and leaves recorded
results to the outbox sender. Nothing runs twice.

A write the state dir refuses (a full disk) is never skipped on these three steps: a
command whose `executing` mark cannot be written waits (retrying, in its place) and a
result the outbox cannot take is held and retried, until the runtime stops; what is
left then is settled by the next start, as after a crash. The last-commands list is
best effort.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from caldera.daemon import dispatch
from caldera.errors import AuthBlocked, CalderaError, CommandError, Retryable, unexpected
from caldera.host.timefmt import rfc3339
from caldera.protocol import schemas
from caldera.protocol.client import NotFound, Unsendable
from caldera.protocol.command import Command, MalformedCommand, parse_command
from caldera.protocol.handlers import Bound, Call
from caldera.protocol.payloads import finish_body
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from caldera.backends.registry import ActiveRuns
    from caldera.daemon.wiring import Parts
    from caldera.host.statefile import StateFile
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.outbox import Outbox
    from caldera.redact import Redactor

log = logging.getLogger("caldera.executor")

JOURNAL_KEY = "commands"
RECENT_KEY, RECENT_KEPT = "recent_commands", 10  # what `caldera status` shows as the last commands
CANCEL_GRACE = 5.0  # after the call's cancel is set, how long a handler gets to notice
DEADLINE_GRACE = 1.0  # the same, when the caller's own deadline (report --once) has passed
INTERRUPTED = "interrupted: runtime restarted"
BROKEN = "internal error in the runtime"  # and the exception type and place; a bug to report
# Commands that change nothing: their finish asks for a report without making older ones stale,
# so a queue of them is answered by one recent report (docs/performance.md, the drain).
READ_ONLY = frozenset(("health_check", "collect_system_info", "log_list", "log_get", "settings_get"))


@dataclass(frozen=True, eq=False)
class Executor:
    """Runs fetched commands to their durable finish. `bind(call)` gives the handler of the
    call's command type with its context (daemon/dispatch.py)."""

    agent_id: str
    client: ControlPlaneClient
    state: StateFile  # the journal
    outbox: Outbox
    redactor: Redactor
    report_now: Callable[[], None]  # the state changed: a report now, no older one answers a command
    bind: Callable[[Call], Bound]
    runs: ActiveRuns | None = None  # accepted agent runs, for agent_interrupt
    report_soon: Callable[[], None] = lambda: None  # a report now, the state unchanged
    stop: threading.Event = field(default_factory=threading.Event)  # the runtime's stop: ends a wait for space

    # ------------------------------------------------------------ journal

    def journal_fetched(self, command: Command) -> None:
        """Journal the command as the plane sent it (`raw`), and what the fetch found
        (`too_large`) beside it: recovery parses it again."""
        entry = {"phase": "fetched", "command": command.raw, "fetched_at": rfc3339()}
        if command.too_large is not None:
            entry["too_large"] = command.too_large
        self.state.update(JOURNAL_KEY, lambda j: {**(j or {}), command.key: entry})
        self._announce(command)

    def _announce(self, command: Command) -> None:
        """An accepted agent_run is known from now on: an interrupt that arrives before its turn
        starts (queued behind another run, or just after its start) reaches it then."""
        if self.runs is not None and command.type == "agent_run" and command.run_id is not None:
            self.runs.queue(command.run_id)

    def _journal_phase(self, key: str, phase: str) -> None:
        def mark(journal: dict[str, Any] | None) -> dict[str, Any]:
            journal = journal or {}
            if key in journal:
                journal[key] = {**journal[key], "phase": phase}
            return journal

        self.state.update(JOURNAL_KEY, mark)

    def _journal_remove(self, key: str) -> None:
        self.state.update(JOURNAL_KEY, lambda j: {k: v for k, v in (j or {}).items() if k != key})

    def recover(self) -> list[Command]:
        """After a restart: the commands to execute now (they never began); the rest is settled."""
        to_run = []
        for key, entry in sorted((self.state.get(JOURNAL_KEY) or {}).items(), key=_fetch_order):
            command = _journaled(key, entry)
            if isinstance(entry, dict) and entry.get("phase") == "fetched":
                self._announce(command)
                to_run.append(command)
                continue
            if not self.outbox.has_finish(command.id):
                log.warning("command %s (%s) was interrupted by a restart; finishing it failed", key, command.type)
                try:
                    self._put_finish(command, "failed", {}, INTERRUPTED)
                except OSError as exc:
                    # A full disk at the start: heartbeats must begin, so a lane finishes it (waiting
                    # for space); refused with INTERRUPTED, it never runs and that is its one finish.
                    log.error("command %s: its finish cannot be recorded now (%s); a lane records it when it can",
                              key, exc.strerror or exc)
                    to_run.append(replace(command, refusal=INTERRUPTED))
                    continue
            try:
                self._journal_remove(key)
            except OSError as exc:  # its finish is recorded: the next start removes the entry
                log.warning("command %s: its journal entry stays until there is space (%s)", key, exc.strerror or exc)
        return to_run

    # ------------------------------------------------------------ execution

    def execute(self, command: Command, cancel: threading.Event | None = None, deadline: float | None = None) -> str:
        """Run one fetched (journaled) command to its recorded finish; returns the status.
        `deadline` (report --once's) bounds the handler's time and its cancel grace. "deferred":
        the runtime stopped while the state dir refused its `executing` mark (it never began:
        the next start runs it)."""
        if not self._until_written(lambda: self._journal_phase(command.key, "executing"), command,
                                   "its executing mark (it waits in its place)", cancel):
            log.warning("command %s (%s) kept for the next start: the state dir took no writes", command.id,
                        command.type)
            return "deferred"
        result: dict[str, Any] = {}
        refused = self._send_start(command)
        if refused is not None:
            status, error = "failed", refused
        else:
            status, result, error = self.run_handler(command, cancel, deadline)
        if not self._until_written(lambda: self._put_finish(command, status, result, error), command,
                                   f"its result ({status})", cancel):
            log.error("command %s (%s) %s but its result could not be recorded before the stop; the next start "
                      "finishes it failed (%s)", command.id, command.type, status, INTERRUPTED)
            return status
        if self.runs is not None and command.type == "agent_run":
            self.runs.forget(command.run_id)
        try:
            self._remember(command, status, error)
        except OSError as exc:  # only `caldera status`'s list: never in the way of the journal
            log.warning("command %s: not added to the last commands (%s)", command.id, exc.strerror or exc)
        # The finish is recorded; the entry goes so that no restart settles the command again
        # (on a stop first, the outbox's copy or its delivered record settles it then).
        self._until_written(lambda: self._journal_remove(command.key), command, "its journal entry's removal", cancel)
        log.info("command %s (%s) %s%s", command.id, command.type, status, f": {error}" if error else "")
        if command.type in READ_ONLY:
            self.report_soon()  # nothing changed: a recent report may still answer the next
        else:
            self.report_now()
        return status

    def settle_broken(self, command: Command, exc: BaseException) -> None:
        """A command whose execution raised (a bug): finished failed now, not at the next start
        (under systemd that may be weeks), unless its finish is already recorded; its journal
        entry goes. Raises when the state dir refuses: the entry stays for the next start."""
        if not self.outbox.has_finish(command.id):
            self._put_finish(command, "failed", {}, f"{BROKEN}: {unexpected(exc)}")
            log.warning("command %s (%s) finished failed: its execution raised %s", command.id, command.type,
                        type(exc).__name__)
        self._journal_remove(command.key)

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

    def _remember(self, command: Command, status: str, error: str) -> None:
        """The last few finished commands, newest first, for `caldera status` (state.json, bounded)."""
        entry = {"id": command.id, "command_type": command.type, "status": status, "finished_at": rfc3339(),
                 "error": self.redactor(error or "")[:300]}

        def prepend(items: list[Any] | None) -> list[Any]:
            kept = [i for i in (items or []) if isinstance(i, dict) and i.get("id") != command.id]
            return ([entry] + kept)[:RECENT_KEPT]

        self.state.update(RECENT_KEY, prepend)

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

    def run_handler(self, command: Command, cancel: threading.Event | None = None,
                    deadline: float | None = None) -> tuple[str, dict[str, Any], str]:
        """(status, result, error_message); the handler runs in its own thread under the timeout
        (and by the caller's `deadline`, when one is given)."""
        if command.refusal is not None:
            return "failed", {}, command.refusal
        timeout, grace = command.timeout_seconds, CANCEL_GRACE
        if deadline is not None:  # report --once: the run ends by its deadline, handler or not
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
            grace = min(grace, DEADLINE_GRACE)
        call = Call(command, cancel or threading.Event(), time.monotonic() + timeout)
        try:
            handler = self.bind(call)
            _validate(command)
        except CommandError as exc:
            return "failed", {}, str(exc)
        outcome = Outcome()
        worker = threading.Thread(target=_call, args=(handler, call, self.client, outcome), name=f"cmd-{command.id}",
                                  daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            call.cancel.set()
            worker.join(grace)
            if worker.is_alive():
                log.error("command %s (%s) ignored its cancel; abandoned", command.id, command.type)
            return "failed", {}, f"timed out after {timeout:g} s"
        if cancel is not None and cancel.is_set() and outcome.error is None:
            return "failed", outcome.result or {}, "cancelled: runtime stopping"
        if outcome.error is not None:
            return "failed", outcome.result or {}, outcome.error
        result = outcome.result
        return "succeeded", result if isinstance(result, dict) else {"value": result}, ""

    def _put_finish(self, command: Command, status: str, result: dict[str, Any], error: str) -> None:
        body = finish_body(self.agent_id, status, self.redactor(result or {}), self.redactor(error or ""))
        self.outbox.put("finish", {"command_id": command.id, "command_type": command.type, "body": body})


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


@dataclass
class Outcome:
    """What a command's thread left: the handler's result, or its error (then the result
    is the one a CommandError carries, if any)."""

    result: Any = None
    error: str | None = None


def _call(handler: Bound, call: Call, client: ControlPlaneClient, outcome: Outcome) -> None:
    """The body of a command's thread: the handler's result or error into `outcome`."""
    try:
        with client.within(call.deadline):  # every call the handler makes ends by the command's deadline
            outcome.result = handler(call.command.payload)
    except CommandError as exc:
        outcome.error, outcome.result = str(exc), exc.result
    except CalderaError as exc:  # the plane failed a call the handler needed
        outcome.error = f"control plane: {exc}"
    except Exception as exc:  # a bug in a handler must still finish the command
        log.exception("command %s (%s) crashed", call.command.id, call.command.type)
        outcome.error = f"internal error: {type(exc).__name__}: {exc}"


def _validate(command: Command) -> None:
    name = dispatch.schema_name(command.type)
    if not schemas.schema_exists(name):
        return
    try:
        schemas.validate(name, command.payload)
    except schemas.SchemaError as exc:
        raise CommandError(f"invalid payload for {command.type}: {exc}") from None


def executor_for(parts: Parts) -> Executor:
    """The executor of a connected runtime's parts: each handler is given its domain's context
    of them (daemon/dispatch.py)."""
    client, _ = parts.connection()
    return Executor(agent_id=parts.identity.agent_id, client=client, state=parts.state, outbox=parts.outbox,
                    redactor=parts.redactor, report_now=parts.wake.report_now, runs=parts.runs,
                    bind=dispatch.binder(parts), report_soon=parts.wake.report_soon, stop=parts.wake.stop)
