"""The state-report loop: every CALDERA_REPORT_INTERVAL_SECONDS (5 s, never
under 2 s), and at once after a state change, a finished command or an
inventory change (`runtime.report_now()`), but never two within 2 s."""
from __future__ import annotations

import logging
import time

from caldera.protocol.retry import Backoff
from caldera.daemon.snapshot import write_snapshot
from caldera.daemon.wakeups import ago, wait_any
from caldera.protocol.payloads import state_report_body

log = logging.getLogger("caldera.reporter")
MIN_SPACING = 2.0


def build_report(runtime, section: dict | None = None) -> dict:
    """A full state report; `section` is the agent's part when the caller already has it."""
    section = section or runtime.agent_section()
    runtime.last_sample = runtime.sample()
    return state_report_body(runtime, section, runtime.last_sample)


def send_report(runtime, section: dict | None = None) -> None:
    runtime.client.state_report(build_report(runtime, section))


def report_loop(runtime) -> None:
    backoff, last_ok, failing = Backoff(), None, False
    last_sent = 0.0
    while not runtime.stop.is_set():
        runtime.tick("reporter")
        spacing = MIN_SPACING - (time.monotonic() - last_sent)
        if spacing > 0:  # a burst of report_now() calls yields one report
            runtime.stop.wait(spacing)
            continue
        last_sent = time.monotonic()
        try:
            send_report(runtime)
            backoff.reset()
            if failing:
                log.info("state reports delivered again")
            failing, last_ok = False, time.monotonic()
            delay = runtime.settings.report_interval
        except Exception as exc:  # noqa: BLE001 -- logged, retried with backoff
            if not failing:
                log.warning("state report failed: %s (last successful was %s)",
                            runtime.redactor(str(exc)), ago(last_ok))
            failing = True
            delay = max(runtime.settings.report_interval,
                        backoff.next_delay(getattr(exc, "retry_after", None)))
        write_snapshot(runtime)  # `caldera status` for users without access to the state dir
        wait_any(runtime.stop, runtime.report_wakeup, delay)
