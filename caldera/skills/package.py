"""Zip one skill for `collect_skill_package`: exactly the files `content_md5` is
computed from (regular, non-hidden, no link followed, nothing outside the
skill's root), under one top-level directory, streamed to a temp file.

An agent can write to its skill directories, so a package refuses what would
carry anything but the skill's own files out of the host: a hard link (a
second name for a file elsewhere, e.g. a credential the runtime can read) and a
special file (a FIFO would hang the read, a device would read the host). Each
file is opened with O_NOFOLLOW|O_NONBLOCK and checked again on the open file
descriptor (still regular, one link, the inode the walk saw), so a swap
between the walk and the read is refused too. Symlinks are skipped, as for
content_md5."""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from caldera.skills import archive, md5

if TYPE_CHECKING:
    from _hashlib import HASH

CHUNK = 1024 * 1024  # read and write size when packing a file

class PackageError(ValueError):
    pass


def build(skill: Path, dest_dir: Path, top: str | None = None) -> tuple[Path, str, int]:
    """(zip path, content_md5 of what went in, file count). The caller removes the zip."""
    top = top or skill.name
    specials: list[str] = []
    files = md5.collect_files(skill, specials)
    if specials:
        raise PackageError(f"{specials[0]!r} is a special file (FIFO, socket or device); a skill package "
                           "holds regular files only")
    linked = [f.rel for f in files if f.nlink > 1]
    if linked:
        raise PackageError(f"{linked[0]!r} is a hard link (it has another name, maybe outside the skill); "
                           "a skill package holds only the skill's own files")
    total = sum(f.size for f in files)
    if total > archive.MAX_UNPACKED:
        raise PackageError(f"the skill holds {total} bytes, over the {archive.MAX_UNPACKED}-byte cap")
    if len(files) >= archive.MAX_MEMBERS:
        raise PackageError(f"the skill holds {len(files)} files, over the {archive.MAX_MEMBERS - 1} cap")
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=".skill-package-", suffix=".zip")
    os.close(fd)
    by_rel = {f.rel: f for f in files}
    digest = hashlib.md5()
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for path, is_file in md5.ordered(by_rel):
                digest.update(path.encode("utf-8") + b"\n")
                if not is_file:
                    digest.update(b"dir\n")
                    continue
                digest.update(b"file\n")
                _add(zf, f"{top}/{path}", by_rel[path], digest)
                digest.update(b"\n")
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp), digest.hexdigest(), len(files)


def _add(zf: zipfile.ZipFile, arcname: str, entry: md5.FileEntry, digest: HASH) -> None:
    info = zipfile.ZipInfo(arcname)
    info.compress_type = zipfile.ZIP_DEFLATED
    fd = _open_checked(entry)
    try:
        mode = os.fstat(fd).st_mode
        info.external_attr = ((0o755 if mode & 0o111 else 0o644) | 0o100000) << 16
        with zf.open(info, "w", force_zip64=entry.size > 2**31) as out:
            while chunk := os.read(fd, CHUNK):
                digest.update(chunk)
                out.write(chunk)
    finally:
        os.close(fd)


def _open_checked(entry: md5.FileEntry) -> int:
    """The file, opened without following a link or blocking on a FIFO, and still what the walk saw."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(entry.path, flags)
    except OSError as exc:
        raise PackageError(f"{entry.rel!r}: cannot open it as a regular file ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_ino != entry.ino:
        os.close(fd)
        raise PackageError(f"{entry.rel!r} changed while it was packed (now not a single regular file)")
    return fd
