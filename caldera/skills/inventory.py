"""The inventory of the skill roots: one record per skill, `content_md5` included.

Roots, in order: `<state-dir>/skills/` (managed: installs go here), every
directory in `CALDERA_SKILL_DIRS` (else ClawManager's `CLAWMANAGER_AGENT_SKILL_DIRS`;
colon-separated absolute paths; inside a ClawManager instance with neither, the
runtime's own: config.skill_dirs_scanned), discovered, then `<state-dir>/skills-disabled/`
(reported with `metadata.status: disabled`). The cheap change check is a stat signature of
each skill's files; only a skill whose signature changed is hashed again.
The cache lives in `<state-dir>/cache/skills-inventory.json`.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from caldera import config
from caldera.host.fsutil import atomic_write_json, ensure_dir
from caldera.host.jsonlimits import loads as bounded_loads
from caldera.host.timefmt import rfc3339
from caldera.skills import md5

if TYPE_CHECKING:
    from _typeshed import StrPath

    from caldera.skills.notify import Notifier

SKILL_DIRS_VAR = config.SKILL_DIRS_VAR
MANAGED, DISCOVERED, DISABLED = "managed", "discovered", "disabled"
INSTALL_RECORD = ".caldera-install.json"
DISABLED_RECORD = ".caldera-disabled.json"
LOCK_NAME = ".caldera-lock"
SOURCE_PLATFORM, SOURCE_DISCOVERED = "injected_by_clawmanager", "discovered_in_instance"
SKILL_TYPE = "agent-skill"
DEFAULT_VERSION = "0.0.0"
CACHE_NAME = "skills-inventory.json"
META_CAP = 64 * 1024
# ClawManager's columns (clawmanager-notes 1.7): over them the whole inventory is a 500.
# identifier -> instance_skills.workspace_dir VARCHAR(120) (migration 039); skill_key VARCHAR(120), which
# APR's collision suffix overflows past a 100-character base (clawmanager-notes section 9).
MAX_IDENTIFIER, MAX_KEY, MAX_PATH, MAX_FIELD = 120, 100, 1024, 255


class Root(NamedTuple):
    path: Path
    kind: str  # managed | discovered | disabled


class Scan:
    __slots__ = ("records", "complete", "problems", "hashed")

    records: list[dict[str, Any]]  # the inventory records, in root order
    complete: bool  # every skill root read without an I/O error
    problems: list[str]  # human sentences
    hashed: int  # skills whose content was hashed in this scan

    def __init__(self, records: list[dict[str, Any]] | None = None, complete: bool = True,
                 problems: list[str] | None = None, hashed: int = 0) -> None:
        self.records = [] if records is None else records
        self.complete = complete
        self.problems = [] if problems is None else problems
        self.hashed = hashed

    @property
    def active(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["metadata"].get("status") == "active"]


def managed_root(state_dir: StrPath) -> Path:
    return Path(state_dir) / "skills"


def disabled_root(state_dir: StrPath) -> Path:
    return Path(state_dir) / "skills-disabled"


def quarantine_root(state_dir: StrPath) -> Path:
    return Path(state_dir) / "quarantine"


def roots(state_dir: StrPath, env: dict[str, str] | None) -> tuple[list[Root], list[str]]:
    """(the roots, problems with the skill dirs' entries)."""
    out = [Root(managed_root(state_dir), MANAGED)]
    dirs, left_out, origin = config.skill_dirs_scanned(env)
    problems = [f"{origin}: {entry!r} is not an absolute path; left out" for entry in left_out]
    for entry in dirs:
        path = Path(entry)
        if all(r.path != path for r in out):
            out.append(Root(path, DISCOVERED))
    out.append(Root(disabled_root(state_dir), DISABLED))
    return out, problems


def skill_key(identifier: str) -> str:
    """ClawManager's sanitised key (its `skill_key` column), as AUG makes it: lower case,
    `-_ .` and space as '-', Unicode letters and digits kept (APR falls back to md5[:16]
    for a name without ASCII; either way such a skill is reported, never left out)."""
    key = re.sub(r"[-_ .]", "-", identifier.lower())
    key = "".join(ch for ch in key if ch == "-" or ch.isalnum())
    return re.sub(r"-+", "-", key).strip("-")


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


SKILL_MD = "skill.md"  # a skill's marker, any case (the control plane checks it so on upload)
CATEGORY_DEPTH = 4  # category folders inside category folders, at most this deep


class Found:
    """What one root holds: its skills, and what stood in the way (sentences); `complete` is
    False when a folder could not be read (skills may be missing: never a full inventory)."""

    __slots__ = ("skills", "problems", "complete")

    skills: list[Path]
    problems: list[str]
    complete: bool

    def __init__(self, skills: list[Path] | None = None, problems: list[str] | None = None,
                 complete: bool = True) -> None:
        self.skills = [] if skills is None else skills
        self.problems = [] if problems is None else problems
        self.complete = complete


def _listing(path: Path, what: str) -> tuple[list[Path], bool, list[str]]:
    """(the non-hidden directories in `path` by name, symlinks not followed; whether it holds a
    SKILL.md, any case, a regular file; the other marker files it holds: skill.json,
    manifest.json). Nothing when it is gone; md5.ScanError when it cannot be read."""
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except FileNotFoundError:
        return [], False, []
    except OSError as exc:
        raise md5.ScanError(exc.errno, f"cannot read {what}: {exc.strerror}", str(path)) from None
    dirs = [Path(e.path) for e in entries if not e.name.startswith(".") and _is_dir(e)]
    files = [e.name for e in entries if _is_file(e)]
    return dirs, any(n.lower() == SKILL_MD for n in files), [n for n in files if n in ("skill.json", "manifest.json")]


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def skill_dirs(root: Root) -> Found:
    """The skills of one root. In a managed or disabled root (caldera's own) every child is a
    skill. In a discovered one a skill is a folder holding SKILL.md, as the control plane
    requires of a skill's package; a folder without one is a *category* (Hermes layout:
    `<root>/<category>/<skill>/SKILL.md`) whose subfolders are looked at in turn, CATEGORY_DEPTH
    categories deep at most; what lies deeper is named, never taken for a skill. A folder that
    cannot be read is named and the rest of the root is still reported (incomplete).
    md5.ScanError when the root itself cannot be read."""
    found = Found()
    children, _, _ = _listing(root.path, "skill root")
    if root.kind != DISCOVERED:
        found.skills = children
        return found
    for child in children:
        _discover(child, 1, found)
    return found


def _discover(path: Path, level: int, found: Found) -> None:
    """`path`, `level` folders below its root: a skill, or a category to look into."""
    try:
        children, is_skill, others = _listing(path, "skill category")
    except md5.ScanError as exc:
        found.complete = False
        found.problems.append(f"{exc.filename}: {exc.strerror}; the skills under it are not reported")
        return
    if is_skill:
        found.skills.append(path)
        return
    if others:
        found.problems.append(f"{path}: {' and '.join(others)} but no SKILL.md, which the control plane requires of "
                              "a skill; not reported")
    if not children:
        return  # an empty folder, or a category's own files (DESCRIPTION.md): no skill here
    if level > CATEGORY_DEPTH:
        found.problems.append(f"{path}: a category folder deeper than {CATEGORY_DEPTH} levels; the folders under it "
                              "are not scanned")
        return
    for child in children:
        _discover(child, level + 1, found)


def _read_small(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(META_CAP).decode("utf-8", "replace")


def front_matter(text: str) -> dict[str, str]:
    """`key: value` lines of a SKILL.md front matter (no YAML parser: a quick CLI verb reads it)."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    out: dict[str, str] = {}
    for line in lines[1:]:
        if line.strip() == "---":
            return out
        match = re.match(r"^([A-Za-z_][\w-]*)\s*:\s*(.*)$", line)
        if match:
            out[match.group(1)] = match.group(2).strip().strip("'\"")
    return {}  # never closed: not front matter


def skill_metadata(path: Path) -> dict[str, str]:
    """id/name/version/description from skill.json, manifest.json or SKILL.md front matter."""
    meta: dict[str, str] = {}
    for name in ("skill.json", "manifest.json"):
        text = _read_small(path / name)
        if text:
            try:
                doc = bounded_loads(text, max_bytes=4 * META_CAP, what=name)  # an agent writes these
            except ValueError:
                continue
            if isinstance(doc, dict):
                meta.update({k: str(doc[k]) for k in ("id", "name", "version", "description")
                             if isinstance(doc.get(k), (str, int, float)) and k not in meta})
    text = _read_small(path / "SKILL.md")
    if text:
        for k, v in front_matter(text).items():
            if k in ("id", "name", "version", "description") and k not in meta and v:
                meta[k] = v
    return meta


def read_record(path: Path, name: str) -> dict[str, Any]:
    text = _read_small(path / name)
    try:
        doc = bounded_loads(text, max_bytes=4 * META_CAP, what=name) if text else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def signature(path: Path, files: list[md5.FileEntry] | None = None) -> str:
    """The skill's stat signature (its files, and caldera's hidden records, which
    carry skill_id/skill_version/disabled_from); from `files` when already collected."""
    sig = md5.files_signature(files) if files is not None else md5.stat_signature(path)
    for extra in (INSTALL_RECORD, DISABLED_RECORD):
        try:
            st = os.lstat(path / extra)
            sig += f"|{extra}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        except FileNotFoundError:
            pass
    return sig


def _cut(value: str, limit: int = MAX_FIELD) -> str:
    return value[:limit]


def build_record(path: Path, root: Root, files: list[md5.FileEntry], content_md5: str,
                 runtime_type: str) -> dict[str, Any]:
    meta = skill_metadata(path)
    installed = read_record(path, INSTALL_RECORD)
    identifier = path.name
    skill_id = str(installed.get("skill_id") or meta.get("id") or meta.get("name") or identifier)
    version = str(installed.get("skill_version") or meta.get("version") or DEFAULT_VERSION)
    source = SOURCE_PLATFORM if re.fullmatch(r"skill_\d+", str(installed.get("skill_id") or "")) else SOURCE_DISCOVERED
    metadata: dict[str, Any] = {"runtime_type": runtime_type, "root": root.kind,
                "status": "disabled" if root.kind == DISABLED else "active"}
    for key in ("name", "description"):
        if meta.get(key):
            metadata[key] = _cut(meta[key], 500)
    if root.kind == DISABLED:
        metadata["disabled_from"] = read_record(path, DISABLED_RECORD).get("origin")
    return {"skill_id": _cut(skill_id), "skill_version": _cut(version), "identifier": identifier,
            "install_path": str(path), "content_md5": content_md5, "source": source, "type": SKILL_TYPE,
            "size_bytes": sum(f.size for f in files), "file_count": len(files),
            "collected_at": rfc3339(), "metadata": metadata}


def _column_problem(path: Path) -> str | None:
    if len(path.name) > MAX_IDENTIFIER or len(skill_key(path.name)) > MAX_KEY:
        return (f"{path}: the name is too long for the control plane (identifiers up to {MAX_IDENTIFIER}, "
                f"keys up to {MAX_KEY} characters); left out")
    if not skill_key(path.name):
        return f"{path}: the name has no letter or digit the control plane can key on; left out"
    if len(str(path)) > MAX_PATH:
        return f"{path}: the path is over {MAX_PATH} characters; left out"
    return None


class Inventory:
    """Scans the roots; remembers each skill's signature and record between scans."""

    FULL_CHECK_EVERY = 10  # with a notifier: every 10th scan still checks every stat signature

    def __init__(self, state_dir: StrPath, env: dict[str, str] | None = None, runtime_type: str = "caldera",
                 *, persist: bool = True, notifier: Notifier | None = None) -> None:
        self.state_dir, self.env, self.runtime_type = Path(state_dir), env or {}, runtime_type
        self.persist, self.notifier, self._scans, self._trust = persist, notifier, 0, False
        self.cache_path = self.state_dir / "cache" / CACHE_NAME
        self._cache = self._load_cache()
        self._hash_buffer: bytearray | None = None

    def _load_cache(self) -> dict[str, Any]:
        try:
            with open(self.cache_path, "rb") as fh:
                doc = json.loads(fh.read())
        except (OSError, ValueError):
            return {}  # no cache, an unreadable one (another user's), or a hand-edited one: rehash
        return doc.get("entries", {}) if isinstance(doc, dict) and doc.get("version") == 1 else {}

    def _save_cache(self, entries: dict[str, Any]) -> None:
        if not self.persist:
            return

        try:
            ensure_dir(self.cache_path.parent)
            # No fsync: a cache lost in a power cut costs one rehash, and the fsyncs cost a
            # small tree's scan more than that risk is worth (docs/performance.md section 4).
            atomic_write_json(self.cache_path, {"version": 1, "entries": entries}, durable=False)
        except OSError:
            pass  # the cache only saves work; a read-only state dir must not fail a scan

    def scan(self) -> Scan:
        result = Scan()
        all_roots, result.problems = roots(self.state_dir, self.env)
        entries: dict[str, Any] = {}  # path -> {sig, root, record}: the cache this scan leaves
        seen: dict[str, str] = {}  # identifier -> the path that has it
        self._scans += 1
        self._trust = False
        if self.notifier is not None:
            self.notifier.drain()
            if self.notifier.overflowed or self._scans % self.FULL_CHECK_EVERY == 1:
                self.notifier.clear()  # this scan checks every signature and watches afresh
            else:
                self._trust = True
        with shared_lock(self.state_dir):
            for root in all_roots:
                try:
                    found = skill_dirs(root)
                except md5.ScanError as exc:
                    result.complete = False
                    result.problems.append(f"{exc.filename}: {exc.strerror}")
                    continue
                result.complete = result.complete and found.complete
                result.problems.extend(found.problems)
                for path in found.skills:
                    self._scan_one(path, root, result, entries, seen)
        self._hash_buffer = None  # the daemon keeps its Inventory: not its buffer too while idle
        if entries != self._cache:  # unchanged: no write (and no fsync) at all
            self._save_cache(entries)
        self._cache = entries
        return result

    def _buffer(self) -> bytearray:
        """One read buffer for the skills a scan hashes (md5.hash_skill says why)."""
        if self._hash_buffer is None:
            self._hash_buffer = bytearray(md5.HASH_BUFFER)
        return self._hash_buffer

    def _scan_one(self, path: Path, root: Root, result: Scan, entries: dict[str, Any],
                  seen: dict[str, str]) -> None:
        problem = _column_problem(path)
        if problem:
            result.problems.append(problem)
            return
        if path.name in seen:
            result.problems.append(f"{path}: shadowed by {seen[path.name]} (same identifier); left out")
            return
        cached = self._cache.get(str(path))
        # the cache entry of this skill in this root, if any
        known = cached if cached and cached.get("root") == root.kind else None
        record = known.get("record") if known is not None else None
        if known is None or not isinstance(record, dict) or not isinstance(record.get("metadata"), dict):
            known = None  # none, or not one of ours (a hand-edited cache): hashed afresh
        elif record["metadata"].get("runtime_type") != self.runtime_type:
            # recorded under another runtime's name (0.1.0's `desktop`): the skill is the same, its record is not
            metadata = {**record["metadata"], "runtime_type": self.runtime_type}
            known = {**known, "record": {**record, "metadata": metadata}}
        notifier = self.notifier
        if self._trust and known is not None and notifier is not None and notifier.unchanged(str(path)):
            seen[path.name] = str(path)
            entries[str(path)] = known
            result.records.append(known["record"])
            return
        if notifier is not None:
            notifier.watch(str(path))  # before the signature: a later change leaves an event
        try:
            sig = signature(path) if known is not None else None
            if known is not None and known.get("sig") == sig:
                record = known["record"]
            else:  # one walk: the signature comes from the same files, as they were hashed
                files, content_md5 = md5.hash_skill(path, self._buffer())
                if content_md5 is None:
                    return  # an empty (or hidden-only) directory is not a skill: nothing to fingerprint
                sig = signature(path, files)
                record = build_record(path, root, files, content_md5, self.runtime_type)
                result.hashed += 1
        except md5.SkillNameError as exc:
            result.problems.append(f"{path}: refused: {exc}; left out")
            return
        except md5.ScanError as exc:
            result.complete = False
            result.problems.append(f"{exc.filename}: {exc.strerror}")
            return
        seen[path.name] = str(path)
        entries[str(path)] = {"sig": sig, "root": root.kind, "record": record}
        result.records.append(record)


def body(agent_id: str, scan: Scan, trigger: str) -> dict[str, Any]:
    """The POST skills/inventory body. `full` only after a complete scan: ClawManager
    removes every skill a full report leaves out. Disabled skills are left out: the server
    ignores `metadata` and upserts every listed skill `active` (docs/skills.md)."""
    return {"agent_id": agent_id, "reported_at": rfc3339(),
            "mode": "full" if scan.complete else "incremental", "trigger": trigger, "skills": scan.active}


def digest_of(records: list[dict[str, Any]]) -> str:
    """What the control plane would see, without the collection times."""
    slim = [{k: v for k, v in r.items() if k != "collected_at"} for r in records]
    return hashlib.sha1(json.dumps(slim, sort_keys=True).encode()).hexdigest()


@contextmanager
def _flock(state_dir: StrPath, kind: int) -> Iterator[None]:
    root = managed_root(state_dir)
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # O_NOFOLLOW: the skills root is a directory an agent can write to.
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield  # another user's state dir (caldera skills as a person): read without the lock
        return
    try:
        fcntl.flock(fd, kind)
        yield
    finally:
        os.close(fd)


def shared_lock(state_dir: StrPath) -> AbstractContextManager[None]:
    """Scans share; a swap/removal excludes them, so a scan never sees a half-moved skill."""
    return _flock(state_dir, fcntl.LOCK_SH)


def exclusive_lock(state_dir: StrPath) -> AbstractContextManager[None]:
    return _flock(state_dir, fcntl.LOCK_EX)

