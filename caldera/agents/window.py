"""Blueprint updates and the 30-minute window (SPEC section 7, an interpretation;
the decisions are in docs/adapter.md, "Blueprint updates", and docs/trust-boundary.md).

An update must pass the trust boundary (`caldera.agents.trust.check_update`
against the installed manifest) or it is refused as a whole. It is stored in
the state dir (`caldera.agents.updates`), never over the installed manifest in
`/etc`, and the effective manifest before it is kept for 30 minutes with the
config revision id that was current then. Every report feeds `observe()`
whether the agent looked bad (status `state.level: bad`, the adapter not
answering, or the health check bad). The window rolls back only what the update
made worse: when the agent was already bad before the update, the update stays.
Three bad reports in a row inside the window restore exactly the previous
effective manifest and its revision id; the record of it stays in
`<state-dir>/blueprint-window.json` and in the report's health for 30 minutes.
The agent's code is never touched: only what it is told changes.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents import trust, updates
from caldera.agents.manifest import load_manifest, parse_text, schema_check
from caldera.errors import ConfigError
from caldera.host.fsutil import atomic_write_json, read_json
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from typing import Any

    from caldera.config import AgentPaths

WINDOW_SECONDS = 30 * 60
BAD_REPORTS = 3
STATE_NAME = "blueprint-window.json"
ENTRY_NAME = "Blueprint update"
REVISION_KEY = "current_config_revision_id"  # in state.json (revisions.STATE_KEY)


class TrustError(ConfigError):
    """A proposed manifest touches what only the operator may change; `problems` names each key."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _state_file(paths: AgentPaths) -> Path:
    return Path(paths.state_dir) / STATE_NAME


def manifest_bytes_for_install(text: str | bytes, config_dir: Path) -> tuple[bytes, dict[str, Any]]:
    """(bytes to install, checked doc) for manifest text; a relative workdir is rebased into
    `<config-dir>/bundle/` when the agent's bundle is installed there (caldera init)."""

    raw = text.encode() if isinstance(text, str) else bytes(text)
    doc = parse_text(raw, "the new manifest")
    bundle = Path(config_dir) / "bundle"
    workdir = str(doc["runtime"].get("workdir") or ".")
    if bundle.is_dir() and not Path(workdir).is_absolute() and not workdir.startswith("bundle/"):
        import yaml  # deferred: `caldera status` imports this module and never dumps YAML

        rel = Path("bundle") / workdir
        doc["runtime"]["workdir"] = rel.as_posix()
        header = b"# Installed by caldera: runtime.workdir rebased into the bundle.\n"
        raw = header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()
    return raw, doc


def proposed_doc(paths: AgentPaths, text: object) -> dict[str, Any]:
    """The checked document of a proposed manifest (YAML text, or a mapping), as installed."""
    if isinstance(text, dict):
        text = json.dumps(text)  # JSON is YAML
    if not isinstance(text, (str, bytes)):
        raise ConfigError("the manifest must be caldera.agent.yaml text")
    _, doc = manifest_bytes_for_install(text, paths.config_dir)
    schema_check(doc, "the new manifest")
    return doc


def check_proposed(paths: AgentPaths, text: object) -> dict[str, Any]:
    """The proposed document when it passes the trust boundary; TrustError naming every key otherwise."""
    installed = load_manifest(paths.manifest_path)
    doc = proposed_doc(paths, text)
    if doc["name"] != installed.name:
        raise TrustError([f"name: the new manifest is for {doc['name']!r}, not {installed.name!r}"])
    problems = trust.check_update(installed.doc, doc)
    if problems:
        raise TrustError(problems)
    return doc


def apply_manifest_update(paths: AgentPaths, text: object, *, revision_id: int | None = None,
                          previous_revision_id: int | None = None, level_before: str | None = None,
                          now: float | None = None) -> dict[str, Any]:
    """Store a blueprint update over the installed manifest and open the window; the finish result.

    The installed manifest is never written. A proposed manifest that breaks the
    trust boundary raises TrustError; one that fails the plain checks or the
    schema, ConfigError; in both cases nothing is changed.
    level_before: the agent's level in the last report before the update (the
    window rolls back only what the update made worse).
    """
    now = time.time() if now is None else now
    doc = check_proposed(paths, text)
    old = current(paths) or {}
    rolled_back = [r for r in old.get("rolled_back_ids") or [] if r is not None]
    if revision_id is not None and revision_id in rolled_back:
        # The control plane keeps naming it as desired: applying it again would loop
        # (apply, bad, roll back, apply …). A new revision is a new decision.
        raise ConfigError(f"config revision {revision_id} was rolled back by the 30-minute window "
                          "(the agent was bad after it); publish a new revision instead")
    effective = updates.load_effective(paths)
    if trust.overlay(load_manifest(paths.manifest_path).doc, doc) == effective.doc:
        return {"changed": False, "version": effective.version}
    before = updates.current(paths)
    previous = before if before is not None else updates.record_for(None, None, now=now)
    previous = dict(previous, revision_id=previous_revision_id)
    record = updates.record_for(doc, revision_id, now=now)
    Path(paths.state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_json(updates.previous_file(paths), previous)
    updates.write(paths, record)
    window: dict[str, Any] = {
        "status": "open", "opened_at": now, "until": now + WINDOW_SECONDS, "previous_version": effective.version,
        "version": doc.get("version"), "bad_streak": 0, "level_before": level_before, "revision_id": revision_id,
        "previous_revision_id": previous_revision_id, "rolled_back_ids": rolled_back[-20:]}
    atomic_write_json(_state_file(paths), window)
    return {"changed": True, "version": doc.get("version"), "previous_version": effective.version,
            "stored_in": str(updates.update_file(paths)), "window_until": rfc3339(window["until"])}


def current(paths: AgentPaths) -> dict[str, Any] | None:
    try:
        return read_json(_state_file(paths))
    except ValueError:
        return None  # a torn record can't be, but a hand-edited one must not stop reports


def observe(paths: AgentPaths, bad: bool, *, now: float | None = None) -> dict[str, Any] | None:
    """Feed one report's verdict; returns the record when it changed (rolled back, closed).

    A bad report counts only when the agent was not already bad before the update:
    the window rolls back what the update made worse, not an agent's own trouble
    (a spent quota). A rollback restores exactly the previous effective manifest;
    the caller puts the record's `previous_revision_id` back as the current one.
    """
    record = current(paths)
    if not record or record.get("status") != "open":
        return None
    now = time.time() if now is None else now
    if now >= record["until"]:
        record["status"] = "closed"
        updates.previous_file(paths).unlink(missing_ok=True)
        atomic_write_json(_state_file(paths), record)
        return record
    worse = bad and record.get("level_before") != "bad"
    streak = record.get("bad_streak", 0) + 1 if worse else 0
    if streak == record.get("bad_streak", 0):
        return None
    record["bad_streak"] = streak
    if streak >= BAD_REPORTS:
        previous = updates.read_record(updates.previous_file(paths))
        updates.write(paths, previous)  # doc None: the installed manifest is in effect again
        updates.previous_file(paths).unlink(missing_ok=True)
        record["rolled_back_ids"] = [*(record.get("rolled_back_ids") or []), record.get("revision_id")][-20:]
        record.update(status="rolled_back", rolled_back_at=now,
                      reason=f"the agent was bad in {streak} reports in a row after the update "
                             f"(it was {record.get('level_before') or 'not reported'} before)")
    atomic_write_json(_state_file(paths), record)
    return record


def health_entries(paths: AgentPaths, *, now: float | None = None) -> list[dict[str, Any]]:
    """The window's health entry while it is open, and for 30 minutes after a rollback."""
    record = current(paths)
    if not record:
        return []
    now = time.time() if now is None else now
    if record.get("status") == "open":
        return [{"name": ENTRY_NAME, "level": "ok",
                 "reason": f"version {record.get('version')} on trial until {rfc3339(record['until'])} "
                           f"({record.get('bad_streak', 0)} bad reports in a row)"}]
    if record.get("status") == "rolled_back" and now - record.get("rolled_back_at", 0) < WINDOW_SECONDS:
        return [{"name": ENTRY_NAME, "level": "bad",
                 "reason": f"version {record.get('version')} (revision {record.get('revision_id')}) rolled back "
                           f"to {record.get('previous_version')} (revision {record.get('previous_revision_id')}) "
                           f"at {rfc3339(record['rolled_back_at'])}: {record.get('reason')}"}]
    return []
