"""Blueprint updates and the 30-minute window (SPEC section 7, an interpretation;
the decisions are in docs/adapter.md, "Blueprint updates").

An update replaces the manifest atomically and keeps the previous one as
`<config-dir>/caldera.agent.yaml.previous` for 30 minutes. Every report feeds
`observe()` whether the agent looked bad (status `state.level: bad`, the
adapter not answering, or the health check bad). Three bad reports in a row
inside the window restore the previous manifest; the record of it stays in
`<state-dir>/blueprint-window.json` and in the report's health for 30 minutes.
The agent's code is never touched: only the manifest (and its bounds) change.
"""
from __future__ import annotations

import time
from pathlib import Path

from caldera.agents.manifest import load_manifest, parse_text, schema_check
from caldera.errors import ConfigError
from caldera.host.fsutil import atomic_write_bytes, atomic_write_json, read_json
from caldera.host.timefmt import rfc3339

WINDOW_SECONDS = 30 * 60
BAD_REPORTS = 3
STATE_NAME = "blueprint-window.json"
PREVIOUS_SUFFIX = ".previous"
ENTRY_NAME = "Blueprint update"


def _state_file(paths) -> Path:
    return Path(paths.state_dir) / STATE_NAME


def _previous(paths) -> Path:
    return Path(str(paths.manifest_path) + PREVIOUS_SUFFIX)


def manifest_bytes_for_install(text, config_dir: Path) -> tuple[bytes, dict]:
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


def apply_manifest_update(paths, text, *, now: float | None = None) -> dict:
    """Install a new manifest (a blueprint update) and open the window; the finish result.

    The new manifest must check (plain rules and the schema), be adapter mode
    and keep the agent's name; otherwise ConfigError and nothing is changed.
    """

    now = time.time() if now is None else now
    current = load_manifest(paths.manifest_path)
    data, doc = manifest_bytes_for_install(text, paths.config_dir)
    schema_check(doc, "the new manifest")
    if doc["runtime"]["type"] != current.runtime_type:
        raise ConfigError(f"the new manifest changes runtime.type from {current.runtime_type} "
                          f"to {doc['runtime']['type']}; install it with caldera init instead")
    if doc["name"] != current.name:
        raise ConfigError(f"the new manifest is for {doc['name']!r}, not {current.name!r}")
    old = Path(paths.manifest_path).read_bytes()
    if old == data:
        return {"changed": False, "version": current.version}
    Path(paths.state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_bytes(_previous(paths), old, mode=0o644)
    atomic_write_bytes(paths.manifest_path, data, mode=0o644)
    record = {"status": "open", "opened_at": now, "until": now + WINDOW_SECONDS,
              "previous_version": current.version, "version": doc.get("version"), "bad_streak": 0}
    atomic_write_json(_state_file(paths), record)
    return {"changed": True, "version": doc.get("version"), "previous_version": current.version,
            "window_until": rfc3339(record["until"])}


def current(paths) -> dict | None:
    try:
        return read_json(_state_file(paths))
    except ValueError:
        return None  # a torn record can't be, but a hand-edited one must not stop reports


def observe(paths, bad: bool, *, now: float | None = None) -> dict | None:
    """Feed one report's verdict; returns the record when it changed (opened, rolled back, closed)."""
    record = current(paths)
    if not record or record.get("status") != "open":
        return None
    now = time.time() if now is None else now
    if now >= record["until"]:
        record["status"] = "closed"
        _previous(paths).unlink(missing_ok=True)
        atomic_write_json(_state_file(paths), record)
        return record
    streak = record.get("bad_streak", 0) + 1 if bad else 0
    if streak == record.get("bad_streak", 0):
        return None
    record["bad_streak"] = streak
    if streak >= BAD_REPORTS:
        previous = _previous(paths)
        atomic_write_bytes(paths.manifest_path, previous.read_bytes(), mode=0o644)
        previous.unlink()
        record.update(status="rolled_back", rolled_back_at=now,
                      reason=f"the agent was bad in {streak} reports in a row after the update")
    atomic_write_json(_state_file(paths), record)
    return record


def health_entries(paths, *, now: float | None = None) -> list:
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
                 "reason": f"version {record.get('version')} rolled back to {record.get('previous_version')} "
                           f"at {rfc3339(record['rolled_back_at'])}: {record.get('reason')}"}]
    return []
