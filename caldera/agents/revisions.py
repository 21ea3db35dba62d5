"""Config revisions and `reload_config` (seed 004; SPEC sections 5 and 8).

`apply_config_revision` fetches `config/revisions/{id}`, checks `checksum`
(`sha256:` over the raw bytes of `data.revision.content` exactly as sent: the
byte span is cut out of the raw body by a small span-aware scanner, never
re-serialised), stores the revision atomically under
`<state>/config-revisions/`, applies what it carries and only then records
`current_config_revision_id`. A revision that touches what the host runs
(SPEC section 11, `caldera.agents.trust`) is refused as a whole before anything
is stored or applied, its finish naming the key. What a revision carries (docs/skills.md):
ClawManager's bootstrap manifest (`schemaVersion`, `mode`, `resources`,
`payloads`) is recorded (its payloads reach an instance only as env vars at
pod creation); caldera's keys `settings` (values, through the adapter's
settings path) and `manifest` (caldera.agent.yaml text, through the
blueprint-update path with its 30-minute window) are applied.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents import outcomes, trust, window
from caldera.agents.updates import load_effective
from caldera.config import load_settings
from caldera.errors import CommandError, ConfigError
from caldera.host.fsutil import atomic_write_bytes, atomic_write_json, ensure_dir
from caldera.host.jsonlimits import loads
from caldera.protocol.client import ApiError, NotFound, transient
from caldera.protocol.handlers import Call
from caldera.protocol.retry import retry_within

if TYPE_CHECKING:
    import threading
    from typing import Any

    from caldera.agents.current import Current
    from caldera.config import AgentPaths, Settings
    from caldera.host.statefile import StateFile
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.command import Command
    from caldera.redact import Redactor

    Path_ = tuple[str, ...]  # object keys from the top of a JSON document

log = logging.getLogger("caldera.agents.revisions")
STATE_KEY = "current_config_revision_id"
KEEP = 10
BODY_MAX_BYTES = 1024 * 1024  # the client's response cap
_WS = b" \t\r\n"


class SpanError(ValueError):
    pass


# ------------------------------------------------------------------ the span scanner

def _skip_ws(raw: bytes, i: int) -> int:
    while i < len(raw) and raw[i] in _WS:
        i += 1
    return i


def _string_end(raw: bytes, i: int) -> int:
    i += 1
    while i < len(raw):
        c = raw[i]
        if c == 0x5C:  # backslash: skip the escaped byte
            i += 2
            continue
        if c == 0x22:
            return i + 1
        i += 1
    raise SpanError("unterminated string")


def _value_end(raw: bytes, i: int, path: Path_, found: dict[str, tuple[int, int]]) -> int:
    """End index of the JSON value starting at i; records the span at `path` in found."""
    i = _skip_ws(raw, i)
    if i >= len(raw):
        raise SpanError("unexpected end of input")
    c = raw[i]
    if c == 0x22:
        return _string_end(raw, i)
    if c == 0x7B:
        return _object_end(raw, i, path, found)
    if c == 0x5B:
        i = _skip_ws(raw, i + 1)
        if raw[i:i + 1] == b"]":
            return i + 1
        while True:
            i = _skip_ws(raw, _value_end(raw, i, (), found))
            if raw[i:i + 1] == b"]":
                return i + 1
            if raw[i:i + 1] != b",":
                raise SpanError(f"expected , or ] at byte {i}")
            i += 1
    j = i
    while j < len(raw) and raw[j] not in b",]}" and raw[j] not in _WS:
        j += 1
    if j == i:
        raise SpanError(f"unexpected byte at {i}")
    return j


def _object_end(raw: bytes, i: int, path: Path_, found: dict[str, tuple[int, int]]) -> int:
    """End of the object at i; when `path` leads through it, the target's span goes in found."""
    i = _skip_ws(raw, i + 1)
    if raw[i:i + 1] == b"}":
        return i + 1
    while True:
        if raw[i:i + 1] != b'"':
            raise SpanError(f"expected a key at byte {i}")
        key_end = _string_end(raw, i)
        key = json.loads(raw[i:key_end])
        i = _skip_ws(raw, key_end)
        if raw[i:i + 1] != b":":
            raise SpanError(f"expected : at byte {i}")
        start = _skip_ws(raw, i + 1)
        on_path = bool(path) and path[0] == key
        end = _value_end(raw, start, path[1:] if on_path else (), found)
        if on_path and len(path) == 1:
            found["span"] = (start, end)  # a repeated key: the last one wins, as json.loads does
        i = _skip_ws(raw, end)
        if raw[i:i + 1] == b"}":
            return i + 1
        if raw[i:i + 1] != b",":
            raise SpanError(f"expected , or }} at byte {i}")
        i = _skip_ws(raw, i + 1)


def value_span(raw: bytes, path: Path_) -> bytes | None:
    """The raw bytes of the value at `path` (object keys), or None when absent."""
    found: dict[str, tuple[int, int]] = {}
    start = _skip_ws(raw, 0)
    if raw[start:start + 1] != b"{":
        return None
    _object_end(raw, start, path, found)
    if "span" not in found:
        return None
    a, b = found["span"]
    return raw[a:b]


# ------------------------------------------------------------------ fetching and checking

def revision_path(doc: Any) -> Path_:
    """Where `revision` sits: data.revision (ClawManager), revision, or data / bare."""
    if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
        data = doc["data"]
        return ("data", "revision") if isinstance(data.get("revision"), dict) else ("data",)
    if isinstance(doc, dict) and isinstance(doc.get("revision"), dict):
        return ("revision",)
    return ()


def fetch(client: ControlPlaneClient, revision_id: int, cancel: threading.Event | None = None,
          deadline: float | None = None) -> tuple[dict[str, Any], bytes]:
    """(the revision object, the raw bytes of its content), checksum verified. With a cancel
    event and deadline (a command's), transient failures are retried until the deadline."""
    try:
        if cancel is None or deadline is None:
            raw = client.config_revision_raw(revision_id)
        else:
            raw = retry_within(lambda: client.config_revision_raw(revision_id), transient=transient,
                               cancel=cancel, deadline=deadline)
    except NotFound:
        raise CommandError(f"config revision {revision_id} not found on the control plane") from None
    except ApiError as exc:
        raise CommandError(f"fetching config revision {revision_id} failed: {exc}") from None
    try:
        doc = loads(raw, max_bytes=BODY_MAX_BYTES, what="the answer")
    except ValueError as exc:
        raise CommandError(f"config revision {revision_id}: the answer is not usable JSON ({exc})") from None
    if isinstance(doc, dict) and doc.get("success") is False:
        raise CommandError(f"config revision {revision_id}: {doc.get('error') or 'success: false'}")
    where = revision_path(doc)
    revision = doc
    for key in where:
        revision = revision[key]
    if not isinstance(revision, dict) or "content" not in revision:
        raise CommandError(f"config revision {revision_id}: the answer has no revision content")
    try:
        content = value_span(raw, where + ("content",))
    except SpanError as exc:
        raise CommandError(f"config revision {revision_id}: the answer is not valid JSON ({exc})") from None
    if content is None:  # the parsed revision has it: the scanner found it too
        raise CommandError(f"config revision {revision_id}: the answer has no revision content")
    verify(revision_id, revision.get("checksum"), content)
    return revision, content


def verify(revision_id: int, checksum: Any, content: bytes) -> None:
    if not isinstance(checksum, str) or not checksum.startswith("sha256:"):
        raise CommandError(f"config revision {revision_id} has no sha256 checksum ({checksum!r}); not applied")
    actual = hashlib.sha256(content).hexdigest()
    if checksum[len("sha256:"):].strip().lower() != actual:
        raise CommandError(f"config revision {revision_id}: checksum mismatch (says {checksum}, content is "
                           f"sha256:{actual}); nothing applied")


def store(state_dir: str | Path, revision_id: int, revision: dict[str, Any], content: bytes) -> Path:
    directory = ensure_dir(Path(state_dir) / "config-revisions")
    atomic_write_bytes(directory / f"{revision_id}.content.json", content)
    meta = {k: revision.get(k) for k in ("id", "instance_id", "revision_no", "checksum", "status", "published_at")}
    atomic_write_json(directory / f"{revision_id}.json", meta)
    _prune(directory)
    return directory


def _prune(directory: Path) -> None:
    ids = sorted({int(p.name.split(".")[0]) for p in directory.glob("*.json") if p.name.split(".")[0].isdigit()})
    for old in ids[:-KEEP]:
        for suffix in (".json", ".content.json"):
            (directory / f"{old}{suffix}").unlink(missing_ok=True)


# ------------------------------------------------------------------ applying

class RevisionCall(Call):
    """What apply_config_revision and reload_config use. The driver is read from `current`
    each time: a blueprint update or a reload_config may have replaced it since the command
    started, and these handlers replace the settings and the manifest themselves."""

    __slots__ = ("paths", "current", "state", "client", "redactor", "report_now")

    paths: AgentPaths
    current: Current
    state: StateFile
    client: ControlPlaneClient | None  # None when the agent is not connected
    redactor: Redactor
    report_now: Callable[[], None]

    def __init__(self, command: Command, cancel: threading.Event, deadline: float, paths: AgentPaths,
                 current: Current, state: StateFile, client: ControlPlaneClient | None, redactor: Redactor,
                 report_now: Callable[[], None]) -> None:
        super().__init__(command, cancel, deadline)
        self.paths = paths
        self.current = current
        self.state = state
        self.client = client
        self.redactor = redactor
        self.report_now = report_now


def _refusal(revision_id: int, problems: list[str]) -> str:
    return (f"config revision {revision_id} refused as a whole, nothing applied: " + "; ".join(problems)
            + " (a revision may change only what the agent is told: docs/trust-boundary.md)")


def _check_manifest(ctx: RevisionCall, revision_id: int, text: object) -> None:
    try:
        window.check_proposed(ctx.paths, text)
    except window.TrustError as exc:
        raise CommandError(_refusal(revision_id, exc.problems)) from None
    except ConfigError as exc:
        raise CommandError(f"config revision {revision_id}: the manifest is refused, nothing applied: {exc}") from None


def _apply_manifest(ctx: RevisionCall, revision_id: int, text: object) -> dict[str, Any]:
    driver = ctx.current.driver
    try:
        outcome = window.apply_manifest_update(
            ctx.paths, text, revision_id=revision_id, previous_revision_id=ctx.state.get(STATE_KEY),
            level_before=None if driver is None else driver.last_level)
    except window.TrustError as exc:
        raise CommandError(_refusal(revision_id, exc.problems)) from None
    except ConfigError as exc:
        raise CommandError(f"the revision's manifest is refused: {exc}") from None
    if driver is not None:
        driver.refresh_manifest()
    return {"applied": True, **outcome}


def _apply_settings(ctx: RevisionCall, values: object) -> dict[str, Any]:
    if not isinstance(values, dict) or not values:
        raise CommandError("the revision's settings must be an object of values")
    driver = ctx.current.driver
    if driver is None:
        raise CommandError("the revision carries settings, but this agent has no adapter to apply them")
    answer = driver.settings_set(values, cancel=ctx.cancel, deadline=ctx.deadline or None)
    if not answer.ok:
        raise CommandError(f"the revision's settings were not applied: {answer.message or answer.reason}")
    return {"applied": True, "keys": sorted(values)}


TOLD = ("instructions", "mcp")  # what a revision may tell a process agent (SPEC 7b)


def _told(ctx: RevisionCall, revision_id: int,
          content: dict[str, Any]) -> Callable[[], dict[str, Any]] | None:
    """`instructions` and `mcp`: the driver checks them (the process driver: agents/process/told.py,
    on top of trust.check_content) before anything of the revision is stored or applied; returns
    the function that applies them (its part of the finish result), or None."""
    if not any(key in content for key in TOLD):
        return None
    driver = ctx.current.driver
    if driver is None:  # no manifest, no driver: told to nobody, as in adapter mode
        return lambda: trust.not_told(content)
    problems = driver.check_told(content)
    if problems:
        raise CommandError(_refusal(revision_id, problems))
    return lambda: driver.apply_told(content)


def apply_revision(ctx: RevisionCall, revision_id: object) -> dict[str, Any]:
    """Fetch, verify, check against the trust boundary, store and apply one revision; the finish result."""
    revision_id = _revision_id(revision_id)
    if ctx.client is None:
        raise CommandError("apply_config_revision: the agent is not connected to a control plane")
    revision, raw_content = fetch(ctx.client, revision_id, ctx.cancel, ctx.deadline)
    try:
        content = loads(raw_content, max_bytes=BODY_MAX_BYTES, what="the revision's content")
    except ValueError as exc:
        raise CommandError(f"config revision {revision_id}: the content is not usable JSON ({exc})") from None
    if isinstance(content, dict):
        # Every check before anything is stored or applied: refused means nothing of it happened.
        problems = trust.check_content(content)
        if problems:
            raise CommandError(_refusal(revision_id, problems))
        if "manifest" in content:
            _check_manifest(ctx, revision_id, content["manifest"])
    told = _told(ctx, revision_id, content) if isinstance(content, dict) else None
    store(ctx.paths.state_dir, revision_id, revision, raw_content)
    result = {"revision_id": revision_id, "revision_no": revision.get("revision_no"),
              "checksum": revision.get("checksum"), "stored": True}
    if isinstance(content, dict):
        if "schemaVersion" in content or "resources" in content:
            result["bootstrap_manifest"] = {"mode": content.get("mode"),
                                            "resources": len(content.get("resources") or []), "recorded": True}
        if "manifest" in content:
            result["manifest"] = _apply_manifest(ctx, revision_id, content["manifest"])
        if "settings" in content:
            result["settings"] = _apply_settings(ctx, content["settings"])
        if told is not None:
            result.update(told())
    ctx.state.set(STATE_KEY, revision_id)
    result["current_config_revision_id"] = revision_id
    ctx.report_now()
    return result


def _revision_id(value: object) -> int:
    if isinstance(value, bool):
        raise CommandError("revision_id must be a whole number")
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        raise CommandError(f"revision_id {value!r} is not a whole number") from None
    if number < 1:
        raise CommandError("revision_id must be 1 or more")
    return number


def _recorded_id(value: object) -> int | str | None:
    """The revision id as state.json keeps it: the whole number when it is one, else a short
    text of what came (a payload's id can be any JSON value, a megabyte string)."""
    try:
        return _revision_id(value)
    except CommandError:
        return None if value is None else str(value)[:40]


def apply_config_revision(ctx: RevisionCall, payload: dict[str, Any]) -> dict[str, Any]:
    """The command, or the runtime's own apply of a heartbeat's desired revision (a local
    command: no finish). Either way the outcome is kept for the state reports (outcomes)."""
    revision_id = _recorded_id(payload.get("revision_id"))
    via = "heartbeat" if ctx.command.local else "command"
    try:
        result = apply_revision(ctx, revision_id)
    except CommandError as exc:
        message = ctx.redactor(str(exc))
        outcomes.record(ctx.state, revision_id, "refused" if "refused" in message else "failed", message, via)
        raise
    except Exception as exc:  # a transient error, a timeout: the plane sees it failed, why, and how
        message = ctx.redactor(f"{type(exc).__name__}: {exc}")
        outcomes.record(ctx.state, revision_id, "failed", message, via)
        raise
    applied = [key for key in ("manifest", "settings", "bootstrap_manifest") if key in result]
    manifest = result.get("manifest") or {}
    detail = f"version {manifest.get('version')}, on trial until {manifest.get('window_until')}" \
        if manifest.get("changed") else ""
    outcomes.record(ctx.state, revision_id, "applied", "; ".join(filter(None, [", ".join(applied), detail])), via)
    return result


# ------------------------------------------------------------------ reload_config

# never changed by a command (the agent id, and the runtime type it is made of, are the session's)
FIXED = ("enabled", "base_url", "instance_id", "bootstrap_token", "runtime_type", "agent_id_given")


def reload_config(ctx: RevisionCall, payload: dict[str, Any]) -> dict[str, Any]:
    try:
        fresh = load_settings(ctx.paths)
    except ConfigError as exc:
        raise CommandError(f"agent.env not reloaded (the running settings are kept): {exc}") from None
    old = ctx.current.settings
    kept = [name for name in FIXED if getattr(fresh, name) != getattr(old, name)]
    fresh = _with(fresh, {name: getattr(old, name) for name in FIXED})
    changed = sorted(k for k in set(old.env) | set(fresh.env) if old.env.get(k) != fresh.env.get(k))
    ctx.current.replace(settings=fresh)
    for value in fresh.secret_values:
        ctx.redactor.add(value)
    result: dict[str, Any] = {"agent_env": "reloaded", "changed_keys": changed[:100]}
    if kept:
        result["not_applied"] = [f"{n}: needs a restart (a command never moves the control-plane connection)"
                                 for n in kept]
    result["manifest"] = _reload_manifest(ctx)
    ctx.report_now()
    return result


def _with(settings: Settings, values: dict[str, Any]) -> Settings:
    """A copy of a read-only Settings with some fields replaced."""
    current = {name: getattr(settings, name) for name in settings.FIELDS}
    current.update(values)
    return type(settings)(**current)


def _reload_manifest(ctx: RevisionCall) -> dict[str, Any]:
    if not Path(ctx.paths.manifest_path).is_file():
        return {"present": False}
    try:
        manifest = load_effective(ctx.paths)
    except ConfigError as exc:
        raise CommandError(f"the manifest was not reloaded (the running one is kept): {exc}") from None
    ctx.current.replace(manifest=manifest)
    driver = ctx.current.driver
    if driver is not None:
        driver.refresh_manifest()
    return {"present": True, "name": manifest.name, "version": manifest.version}
