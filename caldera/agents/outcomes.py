"""What became of each config revision the runtime was given, for the plane to see.

A revision comes as an `apply_config_revision` command (its finish says what happened) or
as a heartbeat's `desired_config_revision_id` hint, which the runtime applies by itself and
finishes nowhere. So every outcome (applied, refused, failed, rolled back by the 30-minute
window) is kept in state.json (`config_revisions`, the newest KEPT) and every state report
carries them in `health.config_revisions`: the last one's level decides `level`, and the
agent's page at the plane lists them beside the revisions it published.
"""
from __future__ import annotations

from caldera import TYPE_CHECKING
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from typing import Any

    from caldera.host.statefile import StateFile

KEY = "config_revisions"
KEPT = 10
REASON_CAP = 600
BAD = ("refused", "failed", "rolled_back")


def record(state: StateFile, revision_id: Any, outcome: str, reason: str = "", via: str = "command") -> None:
    """Keep one outcome (the newest first; a revision's newer outcome replaces its older)."""
    entry = {"revision_id": revision_id, "outcome": outcome, "reason": reason[:REASON_CAP], "via": via,
             "at": rfc3339()}

    def prepend(items: list[Any] | None) -> list[Any]:
        kept = [i for i in (items or []) if isinstance(i, dict) and i.get("revision_id") != revision_id]
        return ([entry] + kept)[:KEPT]

    state.update(KEY, prepend)


def health(state: StateFile) -> dict[str, Any]:
    """`{"config_revisions": {"level", "last", "recent"}}` for the state report, {} when none."""
    items = [i for i in (state.get(KEY) or []) if isinstance(i, dict)]
    if not items:
        return {}
    last = items[0]
    return {KEY: {"level": "bad" if last.get("outcome") in BAD else "ok", "last": last, "recent": items[:5]}}
