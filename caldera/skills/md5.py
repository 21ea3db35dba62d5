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

import hashlib
import os
import posixpath
import stat
import zipfile
from dataclasses import dataclass

CHUNK = 1024 * 1024


class SkillNameError(ValueError):
    """A name the fingerprint cannot carry faithfully (not UTF-8, a backslash, edge whitespace)."""


class ScanError(OSError):
    """A file or directory of a skill could not be read: the scan is incomplete."""


@dataclass(frozen=True)
class FileEntry:
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


def collect_files(root, specials: list | None = None) -> list[FileEntry]:
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


def _walk(directory: str, prefix: str, out: list, specials: list | None = None) -> None:
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError as exc:
        raise ScanError(exc.errno, f"cannot read directory: {exc.strerror}", directory) from None
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue  # hidden: never part of the fingerprint (nor of the package)
        problem = name_problem(name)
        rel = f"{prefix}{name}"
        if problem:
            shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            raise SkillNameError(f"{shown!r}: the name {problem}")
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            raise ScanError(exc.errno, f"cannot stat: {exc.strerror}", entry.path) from None
        if stat.S_ISDIR(st.st_mode):
            _walk(entry.path, rel + "/", out, specials)
        elif stat.S_ISREG(st.st_mode):
            out.append(FileEntry(rel, entry.path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                                 st.st_nlink))
        elif specials is not None and not stat.S_ISLNK(st.st_mode):
            specials.append(rel)
        # symlinks, fifos, sockets, devices: skipped, never followed


def stat_signature(root) -> str:
    """The cheap change check: sha1 over (path, size, mtime, ctime, inode) of the same
    files collect_files() would list, without building them or checking names.
    Any content change moves mtime/ctime; any add, remove or rename moves the list."""
    lines = []
    stack = [(os.fspath(root), "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    name = entry.name
                    if name[0] == ".":
                        continue
                    st = entry.stat(follow_symlinks=False)
                    mode = st.st_mode
                    if stat.S_ISDIR(mode):
                        stack.append((entry.path, f"{prefix}{name}/"))
                    elif stat.S_ISREG(mode):
                        lines.append(f"{prefix}{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\n")
        except OSError as exc:
            raise ScanError(exc.errno, f"cannot read: {exc.strerror}", exc.filename or directory) from None
    return _lines_digest(lines)


def files_signature(files: list) -> str:
    """stat_signature() of an already collected file list (the same digest, no second walk)."""
    return _lines_digest([f"{f.rel}\0{f.size}\0{f.mtime_ns}\0{f.ctime_ns}\0{f.ino}\n" for f in files])


def _lines_digest(lines: list) -> str:
    lines.sort()
    return hashlib.sha1("".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def parent_dirs(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def ordered(rels) -> list[tuple[str, bool]]:
    """(path, is_file) for the files and their derived directories, globally sorted."""
    files = set(rels)
    dirs = {d for rel in files for d in parent_dirs(rel)}
    return sorted([(d, False) for d in dirs] + [(f, True) for f in files], key=lambda p: p[0])


def digest(items, read) -> str:
    """items: relative file paths; read(rel) yields that file's bytes in chunks."""
    md5 = hashlib.md5()
    for path, is_file in ordered(items):
        md5.update(path.encode("utf-8") + b"\n")
        if not is_file:
            md5.update(b"dir\n")
            continue
        md5.update(b"file\n")
        for chunk in read(path):
            md5.update(chunk)
        md5.update(b"\n")
    return md5.hexdigest()


def read_chunks(path: str):
    # O_NOFOLLOW: a file swapped for a symlink between the walk and the read is not followed.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ScanError(exc.errno, f"cannot read: {exc.strerror}", path) from None
    try:
        while chunk := os.read(fd, CHUNK):  # no buffered file object: many small files
            yield chunk
    finally:
        os.close(fd)


def content_md5_files(files: list[FileEntry]) -> str:
    by_rel = {f.rel: f.path for f in files}
    return digest(by_rel, lambda rel: read_chunks(by_rel[rel]))


def content_md5_dir(root) -> str:
    """The fingerprint of a skill directory on disk."""
    return content_md5_files(collect_files(root))


def content_md5_mapping(files: dict) -> str:
    """The fingerprint of {relative path: bytes} (hidden paths left out, as on disk)."""
    kept = {rel: data for rel, data in files.items() if not is_hidden(rel)}
    return digest(kept, lambda rel: [kept[rel]])


def is_hidden(rel: str) -> bool:
    return any(seg.startswith(".") for seg in rel.split("/"))


def clean_archive_path(name: str) -> str | None:
    """An archive member's path the way ClawManager's server cleans it; None to drop it."""
    value = name.strip().replace("\\", "/")
    while value.startswith("./"):
        value = value[2:]
    value = posixpath.normpath(value) if value else ""
    if value in ("", ".") or value.startswith("..") or value.startswith("/"):
        return None
    return value


def content_md5_zip(zip_path) -> str:
    """The fingerprint of a skill zip: its single top-level directory is stripped
    exactly once, directory entries are ignored (what the server computes)."""

    with zipfile.ZipFile(zip_path) as zf:
        members = {}
        for info in zf.infolist():
            if info.is_dir():
                continue
            cleaned = clean_archive_path(info.filename)
            if cleaned is None:
                continue
            members[cleaned] = info
        tops = {rel.split("/", 1)[0] for rel in members}
        strip = len(tops) == 1 and all("/" in rel for rel in members)
        files = {}
        for rel, info in members.items():
            inner = rel.split("/", 1)[1] if strip else rel
            if not is_hidden(inner):
                files[inner] = info

        def read(rel):
            with zf.open(files[rel]) as fh:
                while chunk := fh.read(CHUNK):
                    yield chunk

        return digest(files, read)
