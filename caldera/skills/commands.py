"""Skill commands (SPEC sections 8 and 9): handler(ctx: SkillCall, payload) -> result.

Each mutating command re-inventories and queues a full inventory itself (when
the scan is complete), so the control plane sees the change even without the
watcher (`caldera report --once`). Every one is idempotent: a skill that is
already gone, disabled or quarantined is a success that says so.
"""
from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from caldera.errors import CommandError
from caldera.host.timefmt import rfc3339
from caldera.protocol.client import ApiError, Unsendable, path_value, transient
from caldera.protocol.handlers import Call
from caldera.protocol.retry import retry_within
from caldera.skills import inventory, package, store
from caldera.skills.inventory import DISABLED, DISCOVERED, MANAGED

if TYPE_CHECKING:
    import threading

    from caldera.protocol.client import ControlPlaneClient, Download
    from caldera.protocol.command import Command
    from caldera.skills.publish import Publisher

log = logging.getLogger("caldera.skills")
T = TypeVar("T")
RISK_ACTIONS = {"disable": "disable", "quarantine": "quarantine", "remove": "remove", "uninstall": "remove"}


class SkillCall(Call):
    """What the skill commands use: the agent's id and state dir, its environment as current
    when the command started (discovery dirs), the client (None when not connected), the
    Publisher (scan and queue an inventory) and the skills watcher's wake-up."""

    __slots__ = ("agent_id", "state_dir", "env", "client", "publisher", "inventory_changed")

    agent_id: str
    state_dir: Path
    env: dict[str, str]
    client: ControlPlaneClient | None
    publisher: Publisher
    inventory_changed: Callable[[], None]

    def __init__(self, command: Command, cancel: threading.Event, deadline: float, agent_id: str, state_dir: Path,
                 env: dict[str, str], client: ControlPlaneClient | None, publisher: Publisher,
                 inventory_changed: Callable[[], None]) -> None:
        super().__init__(command, cancel, deadline)
        self.agent_id = agent_id
        self.state_dir = state_dir
        self.env = env
        self.client = client
        self.publisher = publisher
        self.inventory_changed = inventory_changed


def _state_dir(ctx: SkillCall) -> Path:
    return Path(ctx.state_dir)


def _env(ctx: SkillCall) -> dict[str, str]:
    return ctx.env


def _client(ctx: SkillCall) -> ControlPlaneClient:
    client = ctx.client
    if client is None:
        raise CommandError(f"{ctx.command.type}: the agent is not connected to a control plane")
    return client


def _resync(ctx: SkillCall, trigger: str) -> dict[str, Any]:
    scan, body = ctx.publisher.scan_and_send(trigger)
    return {"inventory_mode": body["mode"], "skill_count": len(scan.active)}


# ------------------------------------------------------------------ inventory

def sync_skill_inventory(ctx: SkillCall, payload: dict[str, Any]) -> dict[str, Any]:
    trigger = payload.get("trigger") or ctx.command.type
    scan, body = ctx.publisher.scan_and_send(str(trigger))
    result = {"mode": body["mode"], "skills": len(body["skills"]), "active": len(scan.active),
              "problems": scan.problems[:20]}
    if not scan.complete:
        raise CommandError("the skill scan was incomplete, so no full inventory was sent (an incremental one "
                           "was): " + "; ".join(scan.problems)[:800], result=result)
    return result


refresh_skill_inventory = sync_skill_inventory


# ------------------------------------------------------------------ package

def _locate_for_package(ctx: SkillCall, payload: dict[str, Any]) -> Path:
    """content_md5 first, then identifier, then skill_id (the platform echoes what we reported)."""
    scan = ctx.publisher.scanner().scan()
    wanted = (payload.get("content_md5") or "").strip().lower()
    records = scan.records
    for key, value in (("content_md5", wanted), ("identifier", payload.get("identifier")),
                       ("skill_id", payload.get("skill_id"))):
        if value:
            for record in records:
                if record.get(key) == value:
                    return Path(record["install_path"])
    named = ", ".join(f"{k}={payload.get(k)!r}" for k in ("content_md5", "identifier", "skill_id") if payload.get(k))
    raise CommandError(f"no skill in the inventory matches {named or 'the payload (it names no skill)'}")


def collect_skill_package(ctx: SkillCall, payload: dict[str, Any]) -> dict[str, Any]:
    client = _client(ctx)
    skill = _locate_for_package(ctx, payload)
    cache = _state_dir(ctx) / "cache"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    _check_uploadable(skill)
    try:
        zip_path, content_md5, count = package.build(skill, cache)
    except (package.PackageError, inventory.md5.SkillNameError) as exc:
        raise CommandError(f"cannot package {skill.name}: {exc}") from None
    try:
        wanted = (payload.get("content_md5") or "").strip().lower()
        if wanted and wanted != content_md5:
            ctx.inventory_changed()
            raise CommandError(f"{skill.name} changed since it was reported: its content_md5 is now {content_md5}, "
                               f"not {wanted}; a fresh inventory is on its way")
        # skill_id only as skill_<n>: the server reads leading digits ("2fa-helper" -> skill 2)
        fields = {"agent_id": ctx.agent_id, "skill_id": upload_skill_id(payload.get("skill_id")),
                  "skill_version": payload.get("skill_version") or "", "identifier": skill.name,
                  "content_md5": content_md5, "source": payload.get("source") or inventory.SOURCE_DISCOVERED}
        size = zip_path.stat().st_size
        answer = _retrying(ctx, "uploading", lambda: client.upload_skill(
            {k: str(v) for k, v in fields.items() if v is not None}, zip_path, filename=f"{skill.name}.zip"))
    finally:
        zip_path.unlink(missing_ok=True)
    keep = ("id", "external_skill_id", "skill_key", "status", "scan_status", "risk_level", "content_md5")
    uploaded = {k: answer.get(k) for k in keep if k in answer} if isinstance(answer, dict) else {}
    return {"identifier": skill.name, "install_path": str(skill), "content_md5": content_md5,
            "file_count": count, "zip_bytes": size, "uploaded": uploaded}


def upload_skill_id(value: object) -> str | None:
    """The upload's skill_id: only a platform id (skill_<n>, <n>); anything else is left out."""
    text = store.platform_id(value)
    return text if text and re.fullmatch(r"skill_[0-9]+", text) else None


def _check_uploadable(skill: Path) -> None:
    """What the server refuses with a 500 (clawmanager-notes section 9), said clearly first."""
    if not any(p.name.lower() == "skill.md" and p.is_file() and not p.is_symlink() for p in skill.iterdir()):
        raise CommandError(f"cannot upload {skill.name}: it has no SKILL.md at its top level (the control plane "
                           "refuses a skill package without one)")
    key = inventory.skill_key(skill.name)
    if len(skill.name) > inventory.MAX_IDENTIFIER or len(key) > inventory.MAX_KEY:
        raise CommandError(f"cannot upload {skill.name}: the control plane keeps identifiers to "
                           f"{inventory.MAX_IDENTIFIER} and keys to {inventory.MAX_KEY} characters")


def _retrying(ctx: SkillCall, what: str, call: Callable[[], T]) -> T:
    """`call()`, with transient failures (no answer, 429, 5xx) retried within the command's own
    deadline: the plane issues these commands once (idempotency keys)."""
    def note(exc: BaseException, delay: float) -> None:
        log.warning("%s %s: %s; retrying in %.0f s", ctx.command.type, what, exc, delay)

    return retry_within(call, transient=transient, cancel=ctx.cancel, deadline=ctx.deadline, on_retry=note)


# ------------------------------------------------------------------ install / update

def _download(ctx: SkillCall, version: str, dest: Path) -> Download:
    client = _client(ctx)
    try:
        return _retrying(ctx, "downloading", lambda: client.download_skill(version, dest, cap=store.DOWNLOAD_CAP))
    except ApiError as exc:
        raise CommandError(f"downloading skill version {version} failed: {exc}") from None


def _install(ctx: SkillCall, payload: dict[str, Any], update: bool) -> dict[str, Any]:
    version = payload.get("skill_version") or payload.get("skill_version_id")
    if version in (None, ""):
        raise CommandError(f"{ctx.command.type}: the payload needs skill_version (e.g. ver_12)")
    try:
        version = path_value(version, "skill version")  # it goes into the download URL
    except Unsendable as exc:
        raise CommandError(f"{ctx.command.type}: {exc.message}") from None
    expected = payload.get("content_md5") or payload.get("content_hash") or payload.get("md5")
    if expected and not store.valid_md5(expected):
        raise CommandError(f"content_md5 {expected!r} is not 32 hex digits")
    state_dir, name = _state_dir(ctx), store.payload_name(payload)
    found = store.find(state_dir, _env(ctx), payload, kinds=(MANAGED, DISCOVERED)) if (update and name) else None
    root = found[0].parent if found else inventory.managed_root(state_dir)
    staging = store.stage(root)
    try:
        download = _download(ctx, version, staging / "download.zip")
        if not expected and not download.same_origin:  # never the case today: only same-origin redirects
            raise CommandError(f"{ctx.command.type}: the archive came from {download.url}, not the control plane, "
                               "and the payload has no content_md5 to check it against; refused")
        skill, content_md5 = store.unpack(staging / "download.zip", staging, expected)
        name = name or store.check_name(skill.name, "the archive's top-level directory")
        skill_id = store.platform_id(payload.get("skill_id")) or name
        store.write_install_record(skill, {"skill_id": skill_id, "skill_version": version, "target_name": name,
                                           "content_md5": content_md5, "installed_at": rfc3339()})
        target = root / name
        with inventory.exclusive_lock(state_dir):
            replaced = store.swap_in(skill, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("skill %s %s (%s, %s)", name, "updated" if replaced else "installed", version, content_md5)
    result = {"install_path": str(target), "skill_id": skill_id, "skill_version": version,
              "content_md5": content_md5, "target_name": name, "replaced": replaced}
    result.update(_resync(ctx, ctx.command.type))
    return result


def install_skill(ctx: SkillCall, payload: dict[str, Any]) -> dict[str, Any]:
    return _install(ctx, payload, update=False)


def update_skill(ctx: SkillCall, payload: dict[str, Any]) -> dict[str, Any]:
    return _install(ctx, payload, update=True)


# ------------------------------------------------------------------ remove / disable / quarantine

def _target(ctx: SkillCall, payload: dict[str, Any],
            kinds: Collection[str] = (MANAGED, DISCOVERED, DISABLED)) -> tuple[Path, inventory.Root] | None:
    return store.find(_state_dir(ctx), _env(ctx), payload, kinds=kinds)


def _named(payload: dict[str, Any]) -> str:
    return store.payload_name(payload) or store.platform_id(payload.get("skill_id")) or "?"


def remove_skill(ctx: SkillCall, payload: dict[str, Any]) -> dict[str, Any]:
    found = _target(ctx, payload)
    if found is None:
        result = {"target_name": _named(payload), "removed": False, "already_absent": True}
    else:
        path, _ = found
        trash = path.with_name(f"{store.STAGING_PREFIX}rm-{path.name}")
        with inventory.exclusive_lock(_state_dir(ctx)):
            store.move(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        result = {"target_name": path.name, "install_path": str(path), "removed": True}
    result.update(_resync(ctx, ctx.command.type))
    return result


uninstall_skill = remove_skill


def disable_skill(ctx: SkillCall, payload: dict[str, Any]) -> dict[str, Any]:
    state_dir = _state_dir(ctx)
    found = _target(ctx, payload)
    if found is None:
        raise CommandError(f"there is no skill {_named(payload)!r} to disable")
    path, root = found
    if root.kind == DISABLED:
        result = {"target_name": path.name, "install_path": str(path), "disabled": True, "already_disabled": True}
    else:
        dest = inventory.disabled_root(state_dir) / path.name
        if dest.exists():
            raise CommandError(f"{dest} exists already (an older disabled copy); remove it first")
        with inventory.exclusive_lock(state_dir):
            store.move(path, dest)
        store.atomic_write_json(dest / inventory.DISABLED_RECORD,
                                {"origin": str(path), "disabled_at": rfc3339()}, mode=0o644)
        result = {"target_name": path.name, "install_path": str(dest), "disabled": True, "disabled_from": str(path)}
    result.update(_resync(ctx, ctx.command.type))
    return result


def quarantine_skill(ctx: SkillCall, payload: dict[str, Any]) -> dict[str, Any]:
    state_dir = _state_dir(ctx)
    found = _target(ctx, payload)
    if found is None:
        name = _named(payload)
        held = sorted(p.name for p in inventory.quarantine_root(state_dir).glob(f"{name}-*")) \
            if inventory.quarantine_root(state_dir).is_dir() else []
        if not held:
            raise CommandError(f"there is no skill {name!r} to quarantine")
        result = {"target_name": name, "quarantined": True, "already_quarantined": True,
                  "quarantine_path": str(inventory.quarantine_root(state_dir) / held[-1])}
    else:
        path, _ = found
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        dest = inventory.quarantine_root(state_dir) / f"{path.name}-{stamp}"
        store.ensure_dir(dest.parent)
        with inventory.exclusive_lock(state_dir):
            store.move(path, dest)
        store.defang(dest)
        result = {"target_name": path.name, "quarantined": True, "quarantine_path": str(dest), "from": str(path)}
    result.update(_resync(ctx, ctx.command.type))
    return result


def handle_skill_risk(ctx: SkillCall, payload: dict[str, Any]) -> dict[str, Any]:
    action = payload.get("action") or payload.get("risk_action")
    if action not in RISK_ACTIONS:
        raise CommandError(f"handle_skill_risk: action must be one of disable, quarantine, remove (got {action!r})")
    handler = {"disable": disable_skill, "quarantine": quarantine_skill, "remove": remove_skill}[RISK_ACTIONS[action]]
    result = handler(ctx, payload)
    result["action"] = RISK_ACTIONS[action]
    return result
