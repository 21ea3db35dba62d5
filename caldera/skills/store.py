"""Install, update, remove, disable and quarantine skills (SPEC section 9).

Nothing is written outside the skill roots, `<state>/skills-disabled/` and
`<state>/quarantine/`. An install is staged in a hidden directory inside the
target root (same filesystem), checked, fingerprinted, and swapped in with
one rename (RENAME_EXCHANGE when the kernel has it); any failure before the
swap leaves the previous version exactly as it was.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caldera.errors import CommandError
from caldera.host.fsutil import atomic_write_json, ensure_dir
from caldera.skills import inventory, md5

if TYPE_CHECKING:
    from _typeshed import StrPath

STAGING_PREFIX = ".caldera-staging-"
OLD_PREFIX = ".caldera-old-"
DOWNLOAD_CAP = 128 * 1024 * 1024
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def check_name(name: object, what: str = "target_name") -> str:
    """A skill directory name: one path segment, not hidden, hashable."""
    if not isinstance(name, str) or not name.strip():
        raise CommandError(f"{what} is empty")
    if name != name.strip():
        raise CommandError(f"{what} {name!r} starts or ends with whitespace")
    if "/" in name or "\\" in name or "\x00" in name:
        raise CommandError(f"{what} {name!r} must be a single name, without '/', '\\' or NUL")
    if name.startswith("."):
        raise CommandError(f"{what} {name!r} must not start with '.' (hidden names are not skills)")
    if len(name.encode("utf-8", "surrogateescape")) > 255:
        raise CommandError(f"{what} is longer than 255 bytes")
    return name


def payload_name(payload: dict[str, Any]) -> str | None:
    for key in ("target_name", "identifier", "skill_name"):
        if payload.get(key) not in (None, ""):
            return check_name(payload[key], key)
    return None


def platform_id(value: object) -> str | None:
    """`skill_<n>` for a skill id given as skill_<n>, <n> or an integer."""
    if isinstance(value, bool) or value in (None, ""):
        return None
    text = str(value).strip()
    return f"skill_{text}" if text.isdigit() else text


def find(state_dir: StrPath, env: dict[str, str] | None, payload: dict[str, Any],
         kinds: Collection[str] = (inventory.MANAGED, inventory.DISCOVERED, inventory.DISABLED),
         ) -> tuple[Path, inventory.Root] | None:
    """The skill a payload names, as (path, root) or None; CommandError if it names nothing."""
    name = payload_name(payload)
    wanted_id = platform_id(payload.get("skill_id"))
    if name is None and wanted_id is None:
        raise CommandError("the payload names no skill: give target_name (or identifier, skill_name) or skill_id")
    all_roots, _ = inventory.roots(state_dir, env)
    for root in (r for r in all_roots if r.kind in kinds):
        for path in inventory.skill_dirs(root).skills:
            if name is not None and path.name == name:
                return path, root
            if name is None and wanted_id is not None and _has_id(path, wanted_id):
                return path, root
    return None


def _has_id(path: Path, wanted: str) -> bool:
    record = inventory.read_record(path, inventory.INSTALL_RECORD)
    if record.get("skill_id") == wanted:
        return True
    meta = inventory.skill_metadata(path)
    return wanted in (meta.get("id"), path.name)


# ------------------------------------------------------------------ moves

def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes  # here: an idle daemon swaps nothing in (its PSS: docs/performance.md, section 10)

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_in(staged: Path, target: Path) -> bool:
    """Put `staged` at `target`; the previous `target` is removed. True if one was replaced."""
    if not target.exists() and not target.is_symlink():
        os.rename(staged, target)
        return False
    if _exchange(staged, target):
        _remove_tree(staged)  # now holds the previous version
        return True
    old = target.with_name(f"{OLD_PREFIX}{target.name}")
    _remove_tree(old)
    os.rename(target, old)  # a crash here leaves OLD_PREFIX<name>; recover() puts it back
    os.rename(staged, target)
    _remove_tree(old)
    return True


def recover(root: Path) -> list[str]:
    """After a crash: put back a previous version whose swap was cut, drop stale staging."""
    notes: list[str] = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return notes
    for name in names:
        path = root / name
        if name.startswith(OLD_PREFIX):
            target = root / name[len(OLD_PREFIX):]
            if not target.exists():
                os.rename(path, target)
                notes.append(f"restored {target} after an interrupted update")
            else:
                _remove_tree(path)
        elif name.startswith(STAGING_PREFIX):
            _remove_tree(path)
    return notes


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        import shutil  # here: with bz2 and lzma, 0.3 MiB of an idle daemon's PSS (docs/performance.md, section 10)

        shutil.rmtree(path)


def move(src: Path, dest: Path) -> None:
    """Rename, or copy (no links followed) then remove across filesystems."""
    ensure_dir(dest.parent)
    try:
        os.rename(src, dest)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    import shutil  # here: with bz2 and lzma, 0.3 MiB of an idle daemon's PSS (docs/performance.md, section 10)
    import tempfile  # here too: an idle daemon never moves across filesystems (its PSS: section 10)

    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=STAGING_PREFIX))
    try:
        shutil.copytree(src, tmp / "x", symlinks=True)
        os.rename(tmp / "x", dest)
    finally:
        _remove_tree(tmp)
    _remove_tree(src)


def defang(path: Path) -> None:
    """Quarantine: nothing executable, nothing writable by others; links left as links."""
    for base, dirs, files in os.walk(path):
        for d in dirs:
            p = os.path.join(base, d)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
        for f in files:
            p = os.path.join(base, f)
            if not os.path.islink(p) and stat.S_ISREG(os.lstat(p).st_mode):
                os.chmod(p, 0o600)
    os.chmod(path, 0o700)


# ------------------------------------------------------------------ install

def stage(root: Path) -> Path:
    ensure_dir(root)
    import tempfile  # here: an idle daemon never stages (its PSS: docs/performance.md, section 10)

    return Path(tempfile.mkdtemp(dir=root, prefix=STAGING_PREFIX))


def unpack(zip_path: Path, staging: Path, expected_md5: str | None) -> tuple[Path, str]:
    """Check and extract; (the skill's staged directory, its content_md5)."""
    # deferred: the daemon's skills watcher imports this module for recover() at start; the
    # archive checks wait for the first install (their weight: docs/performance.md section 2)
    from caldera.skills import archive

    try:
        (staging / "tree").mkdir(mode=0o700)
        skill = archive.extract(zip_path, staging / "tree")
    except archive.ArchiveError as exc:
        raise CommandError(f"the skill archive is refused: {exc}") from None
    try:
        content_md5 = md5.content_md5_dir(skill)
    except md5.SkillNameError as exc:
        raise CommandError(f"the skill archive is refused: {exc}") from None
    if expected_md5 and content_md5 != expected_md5.strip().lower():
        raise CommandError(f"content_md5 mismatch: the payload says {expected_md5}, the archive's content is "
                           f"{content_md5}; nothing was installed")
    return skill, content_md5


def write_install_record(skill: Path, record: dict[str, Any]) -> None:
    atomic_write_json(skill / inventory.INSTALL_RECORD, record, mode=0o644)


def valid_md5(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{32}", value.strip()) is not None
