"""State reports: how one is built (`Reports`), and the loop that sends them.

The loop sends every CALDERA_REPORT_INTERVAL_SECONDS (5 s, never under 2 s) and
at once after a state change, a finished command or an inventory change
(`wake.report_now()`), but never two within 2 s: a burst yields one report.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from caldera.daemon.live import DROPS_KEY, LiveStatus, ago
from caldera.daemon.wakeups import Wakeups, wait_any
from caldera.protocol.payloads import Identity, heartbeat_body, state_report_body
from caldera.protocol.retry import Backoff

log = logging.getLogger("caldera.reporter")
MIN_SPACING = 2.0
REVISION_KEY = "current_config_revision_id"  # state.json


@dataclass(frozen=True, eq=False)
class Reports:
    """Builds the heartbeat and state-report bodies from what the runtime knows now."""

    identity: Identity
    current: object  # caldera.daemon.wiring.Current: the settings and the driver, as they are now
    state: object  # StateFile: the current config revision
    sampler: object
    live: LiveStatus
    redactor: Callable

    def section(self) -> dict:
        """The agent's part of a report (its driver's answer), kept in `live` for heartbeats."""
        driver = self.current.driver
        if driver is not None:
            self.live.last_section = driver.report_section()
        return self.live.last_section

    def state_report(self, section: dict | None = None) -> dict:
        """A full state report, redacted; `section` when the caller already has the agent's part."""
        section = section or self.section()
        self.live.last_sample = self.sampler.sample()
        body = state_report_body(self.identity.agent_id, self.current.settings, self.state.get(REVISION_KEY),
                                 section, self.live.last_sample)
        body["health"]["dropped"] = self._drops()
        return self.redactor(body)

    def _drops(self) -> dict:
        """The drop counters (outbox, events, lanes), mirrored into state.json for `caldera status`."""
        drops = self.live.drops()
        if drops != self.state.get(DROPS_KEY):
            self.state.set(DROPS_KEY, drops)
        return drops

    def heartbeat(self) -> dict:
        """A heartbeat from the last section and sample (a heartbeat never calls the agent)."""
        return heartbeat_body(self.identity.agent_id, self.current.settings, self.state.get(REVISION_KEY),
                              self.live.last_section, self.live.last_sample, self.live.skill_count)


def report_loop(client, reports: Reports, wake: Wakeups, live: LiveStatus, interval: Callable[[], float],
                redactor, after_report: Callable[[], None] = lambda: None) -> None:
    """`after_report`: the daemon's status.json snapshot (caldera.daemon.snapshot)."""
    backoff, last_ok, failing = Backoff(), None, False
    last_sent = 0.0
    while not wake.stop.is_set():
        live.tick("reporter")
        spacing = MIN_SPACING - (time.monotonic() - last_sent)
        if spacing > 0:  # a burst of report_now() calls yields one report
            wake.stop.wait(spacing)
            continue
        last_sent = time.monotonic()
        try:
            client.state_report(reports.state_report())
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
        after_report()
        wait_any(wake.stop, wake.report, delay)
