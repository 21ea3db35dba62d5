"""Blueprint updates as stored in the state dir, over the installed manifest.

The manifest an operator installed (`/etc/caldera/agents/NAME/caldera.agent.yaml`,
read-only under the packaged unit) is never written by the runtime. An update
(a config revision's `manifest`) is kept in `<state>/manifest-update.json`:
`{"revision_id", "doc", "version", "applied_at"}` — the checked document as
JSON, so a local verb reads it without PyYAML — written atomically. During the
30-minute window the effective manifest before the update is kept in
`<state>/manifest-update.previous.json` (the same shape; `doc: null` means "the
installed manifest"), with the config revision id that was current then.

The effective manifest is `trust.overlay(installed, update)`, and the trust
rule is checked again on every load: an operator who installs a new blueprint
under a stored update gets the installed manifest whenever the update no longer
fits it (logged), never a mix that widens it.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents.manifest import build, check_document, load_manifest
from caldera.errors import ConfigError
from caldera.host.fsutil import atomic_write_json
from caldera.host.jsonlimits import loads

if TYPE_CHECKING:
    from typing import Any

    from caldera.agents.manifest import Manifest
    from caldera.config import AgentPaths

UPDATE_NAME = "manifest-update.json"
PREVIOUS_NAME = "manifest-update.previous.json"
RECORD_MAX_BYTES = 1024 * 1024


def _warn(message: str, *args: object) -> None:
    import logging  # deferred: a local verb (caldera pause) loads this module (docs/performance.md, section 1)

    logging.getLogger("caldera.agents.updates").warning(message, *args)


def update_file(paths: AgentPaths) -> Path:
    return Path(paths.state_dir) / UPDATE_NAME


def previous_file(paths: AgentPaths) -> Path:
    return Path(paths.state_dir) / PREVIOUS_NAME


def read_record(file: Path) -> dict[str, Any] | None:
    """A stored record, or None when absent; a damaged one is logged and ignored."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # never a planted symlink
        with os.fdopen(fd, "rb") as fh:
            record = loads(fh.read(RECORD_MAX_BYTES + 1), max_bytes=RECORD_MAX_BYTES, what=str(file))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _warn("%s ignored: %s", file, exc)
        return None
    if not isinstance(record, dict) or not (record.get("doc") is None or isinstance(record["doc"], dict)):
        _warn("%s ignored: not an update record", file)
        return None
    return record


def current(paths: AgentPaths) -> dict[str, Any] | None:
    return read_record(update_file(paths))


def write(paths: AgentPaths, record: dict[str, Any] | None, file: Path | None = None) -> None:
    """Store `record` as the update in effect (None: the installed manifest is in effect)."""
    file = file or update_file(paths)
    Path(paths.state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    if record is None or record.get("doc") is None:
        file.unlink(missing_ok=True)
        return
    atomic_write_json(file, record, mode=0o600)


def record_for(doc: dict[str, Any] | None, revision_id: int | None, *,
               now: float | None = None) -> dict[str, Any]:
    try:
        json.dumps(doc)
    except (TypeError, ValueError):
        raise ConfigError("the manifest holds values that are not plain data (quote dates and times)") from None
    return {"revision_id": revision_id, "doc": doc, "version": (doc or {}).get("version"),
            "applied_at": time.time() if now is None else now}


def load_effective(paths: AgentPaths, *, cache_dir: str | Path | None = None,
                   validate_schema: bool = False) -> Manifest:
    """The manifest in effect: the installed one with the stored update over it (if it fits)."""
    installed = load_manifest(paths.manifest_path, cache_dir=cache_dir, validate_schema=validate_schema)
    record = current(paths)
    if record is None or record.get("doc") is None:
        return installed
    from caldera.agents import trust  # deferred: only a stored update needs it (local verbs skip it)

    problems = trust.check_update(installed.doc, record["doc"])
    if problems:
        _warn("the stored update (revision %s) does not fit the installed manifest; using the "
              "installed one: %s", record.get("revision_id"), problems[0])
        return installed
    doc = trust.overlay(installed.doc, record["doc"])
    try:
        check_document(doc, installed.path)
    except ConfigError as exc:
        _warn("the stored update (revision %s) is ignored: %s", record.get("revision_id"), exc)
        return installed
    manifest = build(doc, installed.path)
    manifest.update = {"revision_id": record.get("revision_id"), "version": record.get("version"),
                       "applied_at": record.get("applied_at")}
    return manifest
