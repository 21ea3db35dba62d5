"""Skill package uploads: the multipart form, the archive's shape and its content_md5.

The archive rules are ClawManager's newest (clawmanager-notes 1.4, skills/upload)
narrowed to what every version accepts: metadata entries (`__MACOSX/`,
`.DS_Store`, `Thumbs.db`, `._*`) are ignored, and what is left must be exactly
one top-level directory holding `SKILL.md`. content_md5 is SPEC section 9's
directory fingerprint over that directory's files.
"""
from __future__ import annotations

import hashlib
import io
import posixpath
import re
import zipfile

MAX_MEMBERS = 10_000
MAX_UNPACKED = 512 * 1024 * 1024  # SPEC section 9, across all members
MAX_RATIO = 100  # across all members: 300 members of 1 MiB each are judged together
RATIO_FLOOR = 1024 * 1024  # under this in all, no archive is a bomb worth refusing


class UploadError(ValueError):
    pass


def _boundary(content_type: str) -> bytes:
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise UploadError(f"request Content-Type isn't multipart/form-data (got {kind.strip() or 'none'!r})")
    found = re.search(r'boundary="?([^";]+)"?', params)
    if not found:
        raise UploadError("no multipart boundary in Content-Type")
    return found.group(1).encode()


def parse_multipart(content_type: str, body: bytes) -> tuple[dict, dict]:
    """({field: str}, {field: (filename, bytes)}) of a multipart/form-data body."""
    delimiter = b"--" + _boundary(content_type)
    chunks = body.split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise UploadError("multipart: NextPart: EOF (body is not a complete multipart form)")
    fields, files = {}, {}
    for chunk in chunks[1:-1]:
        if not chunk.startswith(b"\r\n") or not chunk.endswith(b"\r\n"):
            raise UploadError("multipart: malformed part")
        head, sep, content = chunk[2:-2].partition(b"\r\n\r\n")
        if not sep:
            raise UploadError("multipart: part without headers")
        disposition = _header(head, "content-disposition")
        name = _param(disposition, "name")
        if name is None:
            raise UploadError("multipart: part without a name")
        filename = _param(disposition, "filename")
        if filename is not None:
            files[name] = (filename, content)
        else:
            fields[name] = content.decode("utf-8", "replace").strip()
    return fields, files


def _header(head: bytes, wanted: str) -> str:
    for line in head.decode("utf-8", "replace").split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() == wanted:
            return value.strip()
    return ""


def _param(disposition: str, key: str) -> str | None:
    found = re.search(rf'(?:^|;)\s*{key}="([^"]*)"', disposition) or \
        re.search(rf'(?:^|;)\s*{key}=([^;\s]+)', disposition)
    return found.group(1) if found else None


def _is_metadata(path: str) -> bool:
    parts = path.split("/")
    base = parts[-1]
    return parts[0] == "__MACOSX" or base in (".DS_Store", "Thumbs.db") or base.startswith("._")


def check_totals(infos: list, archive_size: int) -> None:
    """Total declared size and ratio across every member, from the central directory,
    before one member is decompressed (zipfile stops each member at its declared size)."""
    unpacked = sum(i.file_size for i in infos)
    packed = sum(i.compress_size for i in infos)
    if unpacked > MAX_UNPACKED:
        raise UploadError(f"archive unpacks to {unpacked} bytes (at most {MAX_UNPACKED})")
    if unpacked >= RATIO_FLOOR and unpacked > MAX_RATIO * max(min(packed, archive_size), 1):
        raise UploadError(f"archive's compression ratio across its members is "
                          f"{unpacked / max(min(packed, archive_size), 1):.0f} (at most {MAX_RATIO})")


def _members(archive: zipfile.ZipFile, archive_size: int) -> dict[str, bytes]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise UploadError(f"archive has {len(infos)} entries (at most {MAX_MEMBERS})")
    check_totals(infos, archive_size)
    files = {}
    for info in infos:
        name = info.filename.replace("\\", "/")
        if info.is_dir():
            continue
        if name.startswith("/") or ".." in name.split("/"):
            raise UploadError(f"archive entry {info.filename!r} escapes the package")
        name = posixpath.normpath(name)
        if _is_metadata(name):
            continue
        files[name] = archive.read(info)
    return files


def check_package(data: bytes) -> tuple[str, str]:
    """(top-level directory, content_md5) of a skill package, or UploadError naming the problem."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            files = _members(archive, len(data))
    except zipfile.BadZipFile as exc:
        raise UploadError(f"zip: not a valid zip file ({exc})") from None
    groups: dict[str, dict[str, bytes]] = {}
    for name, content in files.items():
        top, sep, rest = name.partition("/")
        if not sep:
            raise UploadError(f"archive must contain one or more top-level directories; found loose file {name}")
        groups.setdefault(top, {})[rest] = content
    if len(groups) != 1:
        raise UploadError("agent skill package must contain exactly one skill directory")
    (top, inner), = groups.items()
    if not any(name.lower() == "skill.md" for name in inner):
        raise UploadError(f"skill directory {top} must contain SKILL.md")
    return top, content_md5(inner)


def content_md5(files: dict[str, bytes]) -> str:
    """SPEC section 9: hidden segments skipped, directories from the files' parents, one sort."""
    kept = {p: b for p, b in files.items() if not any(seg.startswith(".") for seg in p.split("/"))}
    dirs = set()
    for path in kept:
        parent = posixpath.dirname(path)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    digest = hashlib.md5()
    for path in sorted(set(kept) | dirs):
        if path in kept:
            digest.update(f"{path}\nfile\n".encode() + kept[path] + b"\n")
        else:
            digest.update(f"{path}\ndir\n".encode())
    return digest.hexdigest()
