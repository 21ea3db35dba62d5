"""Replay a run's events from the plane's database in seq order, and follow it while it runs
(`caldera plane run|turn --follow`).

Events are handed on only in order, seq 1, 2, 3…: one that arrived after a later one (it
never does from caldera's runtime, which posts in order) is waited for. The run ends when
its terminal_status event has been handed on, or when its command finished and every event
its finish counted (`events_total`, else the highest seq stored) is here; events still missing
GRACE_SECONDS after the run ended are said to be missing (`Gap`) and the follow goes on past
them (a replay without --follow says them at once). A terminal event stored before the events
it follows waits for them the same way.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from caldera.plane import runs

if TYPE_CHECKING:
    from caldera.plane.store import Store

POLL_SECONDS = 0.2
GRACE_SECONDS = 30.0
BATCH = 1000


@dataclass(frozen=True)
class Gap:
    """Events `first`..`last` never reached the plane (the run log on the host has them)."""

    first: int
    last: int


@dataclass(frozen=True)
class End:
    """The run's row as it ended (or as it is, for a replay without --follow of a live run)."""

    run: dict[str, Any]


class Stored:
    """One event as the plane keeps it: its seq, its JSON text (printed as it is by --json) and,
    parsed when asked, the event."""

    __slots__ = ("seq", "text", "_event")

    def __init__(self, seq: int, text: str) -> None:
        self.seq, self.text = seq, text
        self._event: dict[str, Any] | None = None

    @property
    def event(self) -> dict[str, Any]:
        if self._event is None:
            self._event = json.loads(self.text)
        return self._event

    @property
    def terminal(self) -> bool:
        # stored compact: a terminal event's text holds this (and most texts are never parsed)
        return '"type":"terminal_status"' in self.text and self.event.get("type") == "terminal_status"


Item = Stored | Gap | End | None  # None: nothing more for now (a printer flushes what it holds)


def replay(store: Store, instance: int, run_id: str, stop: threading.Event, follow: bool = True) -> Iterator[Item]:
    """The run's events in order, then its End (without `follow`: once what is here is given);
    None each time what the plane holds was given and a wait may follow."""
    poll, grace = POLL_SECONDS, GRACE_SECONDS
    last = 0
    ended_at: float | None = None
    while True:
        batch = store.run_event_texts(instance, run_id, after=last, limit=BATCH)
        for seq, text in batch:
            if seq != last + 1:
                break
            last = seq
            item = Stored(seq, text)
            yield item
            if item.terminal:
                yield End(_row(store, instance, run_id))
                return
        if len(batch) == BATCH and batch[-1][0] == last:
            continue  # more are here already
        yield None
        run = _row(store, instance, run_id)
        live = run["status"] in runs.LIVE
        # what should be here: the finish's count, else the highest seq stored (a terminal event
        # that came before the ones it follows leaves a gap to wait for, not an early end)
        total: int | None = run["events_total"] if run["events_total"] is not None else run.get("last_seq") or None
        if not live and (total is None or last >= total):
            yield End(run)
            return
        if not live:
            ended_at = ended_at if ended_at is not None else time.monotonic()
            if not follow or time.monotonic() - ended_at >= grace:  # a replay says the gap at once
                following = store.run_event_texts(instance, run_id, after=last, limit=1)
                upto = following[0][0] - 1 if following else int(total or last)
                yield Gap(last + 1, upto)
                last = upto
                continue
        if not follow:
            yield End(run)
            return
        if stop.wait(poll):
            yield End(run)
            return


def _row(store: Store, instance: int, run_id: str) -> dict[str, Any]:
    run = store.run(run_id, instance)
    if run is None:  # pruned while followed: the plane's retention (docs/plane.md, "Runs")
        raise LookupError(f"run {run_id} is no longer in the plane's database")
    return run
