"""Zip one skill for `collect_skill_package`: exactly the files `content_md5` is
computed from (regular, non-hidden, no link followed, nothing outside the
skill's root), under one top-level directory, streamed to a temp file."""
from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

from caldera.skills import archive, md5


class PackageError(ValueError):
    pass


def build(skill: Path, dest_dir: Path, top: str | None = None) -> tuple[Path, str, int]:
    """(zip path, content_md5 of what went in, file count). The caller removes the zip."""
    top = top or skill.name
    files = md5.collect_files(skill)
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


def _add(zf: zipfile.ZipFile, arcname: str, entry: md5.FileEntry, digest) -> None:
    info = zipfile.ZipInfo(arcname)
    info.compress_type = zipfile.ZIP_DEFLATED
    mode = os.lstat(entry.path).st_mode
    info.external_attr = ((0o755 if mode & 0o111 else 0o644) | 0o100000) << 16
    with zf.open(info, "w", force_zip64=entry.size > 2**31) as out:
        for chunk in md5.read_chunks(entry.path):
            digest.update(chunk)
            out.write(chunk)
