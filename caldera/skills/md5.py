"""ClawManager's `content_md5`: the directory-content fingerprint of a skill
(SPEC section 9, clawmanager-notes section 3), never a zip's MD5.

Every regular file under the skill root, by its relative POSIX path; any path
segment starting with `.` is left out; symlinks and other non-regular entries
are skipped, never followed; directory entries come only from the surviving
files' parents; files and directories are sorted together by full path
(`utils` < `utils.py` < `utils/a.py`); a directory feeds `path\\n dir\\n`, a
file `path\\n file\\n <bytes> \\n`. The upload zip is built from exactly the
same `collect_files()` list, so the inventory and the package always agree.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from _typeshed import StrPath

    Update = Callable[[bytes | memoryview], None]  # an MD5's update

# What ClawManager drops from an upload before hashing (`isArchiveMetadataEntry`, skill_service.go:1613),
# besides hidden names (`._*`, `.DS_Store`): left out of the fingerprint and of the package alike.
METADATA_NAMES = frozenset({"Thumbs.db", "__MACOSX"})
# The inventory hashes through one reused buffer: a fresh bytes per read costs page faults
# and an allocation per small file (what that cost: docs/performance.md section 4).
HASH_BUFFER = 256 * 1024
# Up to this size a file's bytes are joined with its header and fed to MD5 in one update
# (an update per piece cost more than the copy); above it each piece is fed as it is:
# copying a mid-size file once more, into a fresh bytes, slowed such trees (section 4 too).
SMALL_FILE = 16 * 1024


class SkillNameError(ValueError):
    """A name the fingerprint cannot carry faithfully (not UTF-8, a backslash, edge whitespace)."""


class ScanError(OSError):
    """A file or directory of a skill could not be read: the scan is incomplete."""


class FileEntry(NamedTuple):
    """One file (a tuple: ten thousand of them are built per scan of a big skill tree)."""

    rel: str  # relative POSIX path, as hashed
    path: str  # absolute path on disk
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    nlink: int = 1  # > 1: a hard link (collect_skill_package refuses it)


def name_problem(name: str) -> str | None:
    """Why a single path segment cannot be hashed, or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if "\\" in name:
        return "holds a backslash"
    if name != name.strip():
        return "starts or ends with whitespace"
    if "\n" in name or "\x00" in name:
        return "holds a newline or NUL"
    return None


def collect_files(root: StrPath, specials: list[str] | None = None) -> list[FileEntry]:
    """The regular, non-hidden files under `root`, sorted by relative path.

    Raises SkillNameError for a name that cannot be hashed, ScanError when a
    directory or file cannot be read (the caller must not treat it as empty).
    specials: when given, the relative paths of non-hidden fifos, sockets and
    devices are appended to it (skipped for the fingerprint; a package refuses them).
    """
    out: list[FileEntry] = []
    _walk(os.fspath(root), "", out, specials)
    out.sort(key=lambda e: e.rel)
    return out


def _walk(directory: str, prefix: str, out: list[Any], specials: list[str] | None = None,
          with_stat: bool = True) -> None:
    """FileEntry for each regular file under directory; (rel, path) pairs without with_stat
    (hence `out: list[Any]`: one walk for both, no call per file)."""
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError as exc:
        raise ScanError(exc.errno, f"cannot read directory: {exc.strerror}", directory) from None
    for entry in entries:
        name = entry.name
        if name[0] == "." or name in METADATA_NAMES:
            continue  # hidden or archive metadata: never part of the fingerprint (nor of the package)
        rel = f"{prefix}{name}"
        if not name.isascii() or not name.isprintable() or name != name.strip() or "\\" in name:
            problem = name_problem(name)  # the full check only for the names that can fail it
            if problem:
                shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                raise SkillNameError(f"{shown!r}: the name {problem}")
        try:
            # d_type from the directory read: only regular files cost a stat
            if entry.is_dir(follow_symlinks=False):
                _walk(entry.path, rel + "/", out, specials, with_stat)
            elif entry.is_file(follow_symlinks=False):
                if not with_stat:
                    out.append((rel, entry.path))
                    continue
                st = entry.stat(follow_symlinks=False)
                out.append(FileEntry(rel, entry.path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                                     st.st_nlink))
            elif specials is not None and not entry.is_symlink():
                specials.append(rel)
        except OSError as exc:
            raise ScanError(exc.errno, f"cannot stat: {exc.strerror}", entry.path) from None
        # symlinks, fifos, sockets, devices: skipped, never followed


def hash_skill(root: StrPath, buffer: bytearray | None = None) -> tuple[list[FileEntry], str | None]:
    """collect_files() and content_md5_files() in one pass, for the inventory: the walk
    reads names and d_types only, each file is opened once and its figures come from
    fstat on the open descriptor (so the signature describes the bytes hashed).
    ([], None) for a skill with no file. Raises like collect_files().
    buffer: a HASH_BUFFER-sized bytearray to read through, shared by a scan's skills
    (a fresh one per skill is a fresh mapping whose pages fault in again: docs/performance.md
    section 4)."""
    found: list[tuple[str, str]] = []
    _walk(os.fspath(root), "", found, with_stat=False)
    if not found:
        return [], None
    paths = dict(found)
    md5 = hashlib.md5()
    update = md5.update
    buffer = bytearray(HASH_BUFFER) if buffer is None else buffer
    files: list[FileEntry] = []
    for rel, is_file in ordered(paths):
        if not is_file:
            update(rel.encode("utf-8") + b"\ndir\n")
            continue
        files.append(_hash_file(update, rel.encode("utf-8") + b"\nfile\n", paths[rel], rel, buffer))
    return files, md5.hexdigest()


def _hash_file(update: Update, header: bytes, path: str, rel: str, buffer: bytearray) -> FileEntry:
    """Feed `header`, the file's bytes and the closing newline; the file's FileEntry."""
    try:
        # O_NONBLOCK: a file swapped for a fifo since the walk must not block the scan on open
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ScanError(exc.errno, f"cannot read: {exc.strerror}", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScanError(errno.EINVAL, "no longer a regular file", path)
        if st.st_size <= SMALL_FILE:  # most skill files: one read into the buffer, one update
            n = os.readv(fd, [buffer])
            if n <= st.st_size:
                update(b"".join((header, memoryview(buffer)[:n], b"\n")))
            else:  # grew since the fstat: read the rest as a big file
                update(header)
                update(memoryview(buffer)[:n])
                _update_rest(update, fd, buffer)
        else:
            update(header)
            _update_rest(update, fd, buffer)
    except OSError as exc:
        raise ScanError(exc.errno, f"cannot read: {exc.strerror}", path) from None
    finally:
        os.close(fd)
    return FileEntry(rel, path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_nlink)


def _update_rest(update: Update, fd: int, buffer: bytearray) -> None:
    for chunk in _chunks(fd, buffer):
        update(chunk)
    update(b"\n")


def _chunks(fd: int, buffer: bytearray) -> Iterator[memoryview]:
    """The rest of fd through one reused buffer: each chunk is a view the next read
    overwrites (HASH_BUFFER says why)."""
    view = memoryview(buffer)
    while True:
        n = os.readv(fd, [buffer])
        if n == 0:
            return
        yield view[:n]
        if n < len(buffer):
            return  # a short read of a regular file is its end: no read to learn it


def stat_signature(root: StrPath) -> str:
    """The cheap change check: sha1 over (path, size, mtime, ctime, inode) of the same
    files collect_files() would list, without building them or checking names.
    Any content change moves mtime/ctime; any add, remove or rename moves the list.
    (Tuples hashed through repr: the per-file work stays in C; docs/performance.md.)"""
    rows: list[tuple[str, int, int, int, int]] = []
    stack = [(os.fspath(root), "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    name = entry.name
                    if name[0] == "." or name in METADATA_NAMES:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((entry.path, f"{prefix}{name}/"))
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        rows.append((prefix + name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        except OSError as exc:
            raise ScanError(exc.errno, f"cannot read: {exc.strerror}", exc.filename or directory) from None
    return _rows_digest(rows)


def files_signature(files: list[FileEntry]) -> str:
    """stat_signature() of an already collected file list (the same digest, no second walk)."""
    return _rows_digest([(f.rel, f.size, f.mtime_ns, f.ctime_ns, f.ino) for f in files])


def _rows_digest(rows: list[tuple[str, int, int, int, int]]) -> str:
    rows.sort()
    return "2:" + hashlib.sha1(repr(rows).encode("ascii", "backslashreplace")).hexdigest()


def ordered(rels: Iterable[str]) -> list[tuple[str, bool]]:
    """(path, is_file) for the files and their derived directories, globally sorted."""
    files = set(rels)
    dirs: set[str] = set()
    for rel in files:
        parent = rel.rpartition("/")[0]
        while parent and parent not in dirs:  # a parent already seen has its own parents too
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    # A path is a file or a directory, never both: sorting the pairs sorts by path.
    return sorted([(d, False) for d in dirs] + [(f, True) for f in files])


def digest(items: Iterable[str], read: Callable[[str], Iterable[bytes | memoryview]]) -> str:
    """items: relative file paths; read(rel) yields that file's bytes in chunks."""
    md5 = hashlib.md5()
    update = md5.update
    for path, is_file in ordered(items):
        if not is_file:
            update(path.encode("utf-8") + b"\ndir\n")
            continue
        update(path.encode("utf-8") + b"\nfile\n")
        for chunk in read(path):
            update(chunk)
        update(b"\n")
    return md5.hexdigest()


def content_md5_files(files: list[FileEntry]) -> str:
    by_rel = {f.rel: f.path for f in files}
    buffer = bytearray(HASH_BUFFER)

    def read(rel: str) -> Iterator[memoryview]:
        fd = os.open(by_rel[rel], os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            yield from _chunks(fd, buffer)
        finally:
            os.close(fd)

    try:
        return digest(by_rel, read)
    except OSError as exc:
        if isinstance(exc, ScanError):
            raise
        raise ScanError(exc.errno, f"cannot read: {exc.strerror}", exc.filename) from None


def content_md5_dir(root: StrPath) -> str:
    """The fingerprint of a skill directory on disk."""
    return content_md5_files(collect_files(root))


def is_archive_metadata(rel: str) -> bool:
    """The server's `isArchiveMetadataEntry`: anything under `__MACOSX/`, and `Thumbs.db`,
    `.DS_Store`, `._*` files."""
    segments = rel.split("/")
    base = segments[-1]
    return "__MACOSX" in segments or base in ("Thumbs.db", ".DS_Store") or base.startswith("._")
