"""Checks on a downloaded skill archive and its safe extraction (SPEC section 9).

Every rule is checked on the central directory before one byte is written,
and again while writing (a member may lie about its size). A refusal names
the member. Extraction writes only regular files and directories, under a
fresh staging directory, with O_EXCL|O_NOFOLLOW, so nothing outside the
staging directory can be created, followed or overwritten.
"""
from __future__ import annotations

import itertools
import os
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from caldera.skills import md5

if TYPE_CHECKING:
    from _typeshed import StrPath

MAX_MEMBERS = 10_000
MAX_UNPACKED = 512 * 1024 * 1024
MAX_RATIO = 100
RATIO_FLOOR = 1024 * 1024  # a member smaller than this cannot be a bomb worth refusing
CHUNK = 1024 * 1024
ALLOWED_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what ClawManager's normalised zips use
_TYPE_NAMES = {stat.S_IFLNK: "a symlink", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


class ArchiveError(ValueError):
    """The archive is refused; the message says why and names the member."""


@dataclass
class Checked:
    top: str  # the single top-level directory
    members: list  # ZipInfo of the files to write (directories are derived)
    unpacked: int  # declared bytes


def _member_path(info: zipfile.ZipInfo) -> list[str]:
    name = info.filename
    shown = repr(name)
    if "\x00" in name:
        raise ArchiveError(f"member {shown}: the name holds a NUL byte")
    if "\\" in name:
        raise ArchiveError(f"member {shown}: the name holds a backslash")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"member {shown}: absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"member {shown}: a '..' path segment (zip slip)")
    if not parts:
        raise ArchiveError(f"member {shown}: an empty path")
    return parts


def _member_type(info: zipfile.ZipInfo) -> None:
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if info.create_system == 3 and kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
        what = _TYPE_NAMES.get(kind, f"file type {oct(kind)}")
        raise ArchiveError(f"member {info.filename!r}: {what}; only regular files and directories are accepted")
    if info.flag_bits & 0x1:
        raise ArchiveError(f"member {info.filename!r}: encrypted")
    if info.compress_type not in ALLOWED_METHODS:
        raise ArchiveError(f"member {info.filename!r}: compression method {info.compress_type} is not accepted")


def _ratio(info: zipfile.ZipInfo) -> None:
    if info.file_size < RATIO_FLOOR:
        return
    if info.compress_size == 0 or info.file_size / info.compress_size > MAX_RATIO:
        ratio = info.file_size / max(info.compress_size, 1)
        raise ArchiveError(f"member {info.filename!r}: compression ratio {ratio:.0f} is over {MAX_RATIO} "
                           f"({info.file_size} bytes from {info.compress_size})")


def total_ratio(members: list) -> None:
    """The ratio across all members: 300 members of 1 MiB each under the per-member floor
    are still a bomb when together they unpack to over 100 times their compressed size."""
    unpacked = sum(i.file_size for i in members)
    packed = sum(i.compress_size for i in members)
    if unpacked >= RATIO_FLOOR and unpacked > MAX_RATIO * max(packed, 1):
        raise ArchiveError(f"the archive's compression ratio across its members is {unpacked / max(packed, 1):.0f}, "
                           f"over {MAX_RATIO} ({unpacked} bytes from {packed})")


def _overlaps(members: list) -> None:
    """Two entries whose data share bytes are the zip form of a hard link (and of
    the overlapping-file bomb): refused."""
    spans = sorted(((i.header_offset, n), i) for n, i in enumerate(members))
    for ((start, _), a), ((next_start, _), b) in itertools.pairwise(spans):
        # 30 + name + data is a lower bound of a local entry's size: never a false alarm.
        if next_start < start + 30 + _name_len(a) + a.compress_size:
            raise ArchiveError(f"member {b.filename!r} shares its data with {a.filename!r} "
                               "(a hard link or overlapping entries)")


def _name_len(info: zipfile.ZipInfo) -> int:
    encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
    try:
        return len(info.filename.encode(encoding))
    except UnicodeEncodeError:
        return len(info.filename.encode("utf-8"))


def check(zf: zipfile.ZipFile) -> Checked:
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ArchiveError(f"the archive has {len(infos)} members, more than {MAX_MEMBERS}")
    tops, seen, files, unpacked = set(), set(), [], 0
    for info in infos:
        parts = _member_path(info)
        key = "/".join(parts)
        if md5.is_archive_metadata(key):
            continue  # Thumbs.db, __MACOSX/, ._*, .DS_Store: dropped, as the server drops them
        _member_type(info)
        if key in seen:
            raise ArchiveError(f"member {info.filename!r}: the path appears twice (a second entry would "
                               "replace or link the first)")
        seen.add(key)
        tops.add(parts[0])
        if len(tops) > 1:
            raise ArchiveError(f"member {info.filename!r}: a second top-level entry ({sorted(tops)}); "
                               "a skill archive holds exactly one top-level directory")
        if info.is_dir():
            continue
        if len(parts) == 1:
            raise ArchiveError(f"member {info.filename!r}: a loose file at the top; a skill archive holds "
                               "exactly one top-level directory")
        _ratio(info)
        unpacked += info.file_size
        if unpacked > MAX_UNPACKED:
            raise ArchiveError(f"member {info.filename!r}: the archive unpacks to more than {MAX_UNPACKED} bytes")
        files.append(info)
    if not tops:
        raise ArchiveError("the archive is empty")
    total_ratio(files)
    _overlaps(files)
    return Checked(top=tops.pop(), members=files, unpacked=unpacked)


def open_archive(path: StrPath) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise ArchiveError(f"not a readable zip archive: {exc}") from None


def extract(path: StrPath, dest: StrPath) -> Path:
    """Check the archive at `path` and extract it into the empty directory `dest`;
    returns the skill's directory (`dest/<top>`). Raises ArchiveError."""
    dest = Path(dest)
    with open_archive(path) as zf:
        checked = check(zf)
        os.mkdir(dest / checked.top, 0o755)
        written = 0
        for info in checked.members:
            written += _write_member(zf, info, dest, written)
    return dest / checked.top


def _write_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path, written: int) -> int:
    parts = [p for p in info.filename.split("/") if p not in ("", ".")]
    parent = dest
    for part in parts[:-1]:
        parent = parent / part
        try:
            os.mkdir(parent, 0o755)
        except FileExistsError:
            if parent.is_symlink() or not parent.is_dir():
                raise ArchiveError(f"member {info.filename!r}: {part!r} is not a directory") from None
    mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644  # never setuid/setgid/sticky
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    size = 0
    try:
        fd = os.open(parent / parts[-1], flags, mode)
        with os.fdopen(fd, "wb") as out, zf.open(info) as src:
            while chunk := src.read(CHUNK):
                size += len(chunk)
                if size > info.file_size or written + size > MAX_UNPACKED:
                    raise ArchiveError(f"member {info.filename!r}: more bytes than it declares")
                out.write(chunk)
    except FileExistsError:
        raise ArchiveError(f"member {info.filename!r}: the path exists already") from None
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise ArchiveError(f"member {info.filename!r}: corrupt data ({exc})") from None
    return size

