"""State reports: how one is built (`Reports`), and the loop that sends them.

The loop sends every CALDERA_REPORT_INTERVAL_SECONDS (5 s, never under 2 s) and
at once after a state change, a finished command or an inventory change
(`wake.report_now()`). Every state report (the loop's, collect_system_info's and
health_check's, the final one) goes through one `ReportFloor`: never two within
2 s, and a caller that waited while another report was sent takes that one
instead of sending its own, so a burst yields one report. collect_system_info and
health_check never wait for the floor: within 2 s of a report they answer with
that report (`ReportFloor.recent`), so commands drain at the speed of their work.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.agents import outcomes
from caldera.daemon.live import DROPS_KEY, LiveStatus, ago
from caldera.daemon.wakeups import Wakeups, wait_any
from caldera.host.loopguard import LoopGuard
from caldera.protocol.payloads import Identity, finite, heartbeat_body, state_report_body
from caldera.protocol.retry import Backoff

if TYPE_CHECKING:
    from caldera.agents.current import Current
    from caldera.host.sampler import Sampler
    from caldera.host.statefile import StateFile
    from caldera.protocol.client import ControlPlaneClient
    from caldera.redact import Redactor

log = logging.getLogger("caldera.reporter")
MIN_SPACING = 2.0
REVISION_KEY = "current_config_revision_id"  # state.json


class ReportFloor:
    """The one 2 s floor of every state report; sends are serialised under its lock."""

    def __init__(self, spacing: float = MIN_SPACING, clock: Callable[[], float] = time.monotonic,
                 generation: Callable[[], int] = lambda: 0):
        self.spacing, self._clock, self._generation = spacing, clock, generation
        self._built_generation = -1  # the state's generation when the last report was built
        self._lock = threading.Lock()
        self._last_sent: float | None = None  # when the last report was built and sent
        self._last_done: float | None = None  # when the last delivered report arrived
        self.last_body: dict[str, Any] | None = None  # the last report built (delivered or not)

    def recent(self) -> tuple[dict[str, Any], bool] | None:
        """(the last report, whether it was delivered) when it was built less than the floor's
        spacing ago: a command that asks for a report takes it instead of waiting (the floor
        limits reports, not commands). None when there is none that young, or when the state
        changed since it was built (`Wakeups.report_now` bumps the generation)."""
        body, sent, done = self.last_body, self._last_sent, self._last_done
        if body is None or sent is None or self._clock() - sent >= self.spacing:
            return None
        if self._built_generation != self._generation():
            return None
        return body, done is not None and done >= sent

    def send(self, client: ControlPlaneClient, build: Callable[[], dict[str, Any]], wait: threading.Event,
             lock_timeout: float | None = None, coalesce: bool = False) -> tuple[dict[str, Any] | None, bool]:
        """(the report, whether it was this call that sent it). With `coalesce`, a report
        delivered while this call waited for the floor is returned instead of sending another
        (a burst of collect_system_info yields one); (None, False) when `wait` was set before
        the floor allowed a send, or another send held the floor past `lock_timeout`. The
        send's error is raised."""
        arrived = self._clock()
        if not self._lock.acquire(timeout=-1 if lock_timeout is None else lock_timeout):
            return None, False
        try:
            if coalesce and self._last_done is not None and self._last_done > arrived:
                return self.last_body, False
            if self._last_sent is not None:
                gap = self.spacing - (self._clock() - self._last_sent)
                if gap > 0 and wait.wait(gap):
                    return None, False
            built_at, generation = self._clock(), self._generation()
            self.last_body = body = build()
            self._built_generation = generation
            self._last_sent = built_at
            client.state_report(body)
            self._last_done = self._clock()
            return body, True
        finally:
            self._lock.release()


class Reports:
    """Builds the heartbeat and state-report bodies from what the runtime knows now."""

    __slots__ = ("identity", "current", "state", "sampler", "live", "redactor", "floor", "health_extra", "llm")

    identity: Identity
    current: Current  # the settings and the driver, as they are now
    state: StateFile  # the current config revision
    sampler: Sampler
    live: LiveStatus
    redactor: Redactor
    floor: ReportFloor
    health_extra: Callable[[], dict[str, Any]]  # more health entries (the outbox's held-back items)
    llm: Callable[[], dict[str, Any]]  # runtime.llm_config_* (daemon/governance.LLMFields)

    def __init__(self, identity: Identity, current: Current, state: StateFile, sampler: Sampler, live: LiveStatus,
                 redactor: Redactor, floor: ReportFloor | None = None,
                 health_extra: Callable[[], dict[str, Any]] = dict, llm: Callable[[], dict[str, Any]] = dict) -> None:
        self.identity = identity
        self.current = current
        self.state = state
        self.sampler = sampler
        self.live = live
        self.redactor = redactor
        self.floor = ReportFloor() if floor is None else floor
        self.health_extra = health_extra
        self.llm = llm

    def send(self, client: ControlPlaneClient, wait: threading.Event, section: dict[str, Any] | None = None,
             lock_timeout: float | None = None, coalesce: bool = False) -> tuple[dict[str, Any] | None, bool]:
        """Build and send one state report through the floor (see `ReportFloor.send`)."""
        return self.floor.send(client, lambda: self.state_report(section), wait, lock_timeout, coalesce)

    def section(self) -> dict[str, Any]:
        """The agent's part of a report (its driver's answer), kept in `live` for heartbeats."""
        driver = self.current.driver
        if driver is not None:
            self.live.last_section = driver.report_section()
        return self.live.last_section

    def state_report(self, section: dict[str, Any] | None = None) -> dict[str, Any]:
        """A full state report, redacted; `section` when the caller already has the agent's part."""
        section = section or self.section()
        self.live.last_sample = self.sampler.sample()
        body = state_report_body(self.identity.agent_id, self.current.settings, self.state.get(REVISION_KEY),
                                 section, self.live.last_sample)
        body["runtime"].update(self.llm())
        body["health"]["dropped"] = self._drops()
        body["health"].update(self.health_extra())
        body["health"].update(outcomes.health(self.state))  # what became of the last config revisions
        return self.redactor(finite(body))

    def _drops(self) -> dict[str, int]:
        """The drop counters (outbox, events, lanes), mirrored into state.json for `caldera status`."""
        drops = self.live.drops()
        if drops != self.state.get(DROPS_KEY):
            try:
                self.state.set(DROPS_KEY, drops)
            except OSError as exc:
                # Only `caldera status`'s copy: the report goes out all the same, and its health
                # says the disk is full (the state file recorded the failed write).
                log.debug("drop counters not mirrored into state.json: %s", exc.strerror or exc)
        return drops

    def heartbeat(self) -> dict[str, Any]:
        """A heartbeat from the last section and sample (a heartbeat never calls the agent)."""
        return finite(heartbeat_body(self.identity.agent_id, self.current.settings, self.state.get(REVISION_KEY),
                                     self.live.last_section, self.live.last_sample, self.live.skill_count))


def report_loop(client: ControlPlaneClient, reports: Reports, wake: Wakeups, live: LiveStatus,
                interval: Callable[[], float], redactor: Redactor,
                after_report: Callable[[], None] = lambda: None) -> None:
    """`after_report`: the daemon's status.json snapshot (caldera.daemon.snapshot)."""
    backoff, last_ok, failing = Backoff(), None, False
    snapshot = LoopGuard(log, "status snapshot (after a report)", redact=redactor)
    while not wake.stop.is_set():
        live.tick("reporter")
        try:
            body, _ = reports.send(client, wake.stop)  # waits out the 2 s floor
            if body is None:
                break  # stopped while waiting
            backoff.reset()
            if failing:
                log.info("state reports delivered again")
            failing, last_ok = False, time.monotonic()
            delay = interval()
        except Exception as exc:  # noqa: BLE001 -- logged, retried with backoff
            if not failing:
                log.warning("state report failed: %s (last successful was %s)", redactor(str(exc)), ago(last_ok))
            failing = True
            delay = max(interval(), backoff.after(exc))
        try:  # the snapshot is status.json: a full disk must not end the reports with it
            after_report()
            snapshot.ok()
        except Exception as exc:  # noqa: BLE001 -- logged by the guard; the next report writes it again
            snapshot.failed(exc)
        wait_any(wake.stop, wake.report, delay)
