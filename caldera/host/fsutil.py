"""Durable files: atomic writes, JSON state, and the agent's exclusive lock.

A crash leaves the old file or the new one, never a torn one: write a temp file
in the same directory, fsync it, os.replace() it, fsync the directory.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from _typeshed import StrPath

# Every file the runtime opens by name in its state dir is opened without following a
# symlink: an agent's process (in adapter mode it runs as the same user) could plant one.
# Writes go through a new temp file (O_CREAT|O_EXCL) + os.replace, which never follow one either.
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def atomic_write_bytes(path: StrPath, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """durable=False: still atomic (old file or new one), but no fsync: for caches, whose
    loss after a power cut only costs the work of rebuilding them."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def _temp_beside(path: Path) -> tuple[int, str]:
    """tempfile.mkstemp's guarantees without importing tempfile (it pulls in shutil, bz2,
    lzma and random, which a quick verb would pay for: docs/performance.md section 1):
    a new file (O_EXCL: never an existing file nor a link), 0600, a random name beside `path`.
    The name is joined as a string: pathlib interns every part of a path it parses, and a
    random part per write churns the interned strings' table (docs/performance.md, section 10)."""
    for _ in range(100):
        tmp = os.path.join(path.parent, f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def atomic_write_json(path: StrPath, obj: Any, mode: int = 0o600, *, durable: bool = True) -> None:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    atomic_write_bytes(path, data, mode, durable=durable)


def read_json(path: StrPath, default: Any = None) -> Any:
    """The parsed file, or `default` when it does not exist. A corrupt file raises ValueError."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except FileNotFoundError:
        return default
    with os.fdopen(fd, "rb") as fh:
        return json.loads(fh.read())


def read_capped(fd: int, cap: int) -> bytes:
    """At most `cap + 1` bytes of an open file: more than `cap` tells the caller it is too
    large, without reading a file of any size (a status file, a marker: anyone may grow them)."""
    chunks: list[bytes] = []
    size = 0
    while size <= cap:
        chunk = os.read(fd, cap + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def fsync_dir(path: StrPath) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: StrPath, mode: int = 0o700) -> Path:
    path = Path(path)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    return path


class StateLock:
    """An exclusive flock on `<state-dir>/lock`, naming its holder (pid and role).

    ClawManager keeps one session per instance: a second process registering
    for the same agent would log the first one out, so only the holder talks
    to the control plane. The kernel drops the lock when the holder dies.
    """

    def __init__(self, state_dir: StrPath, role: str) -> None:
        self.path = Path(state_dir) / "lock"
        self.role = role
        self._fd: int | None = None

    def acquire(self, blocking: bool = False) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)  # never truncate a link's target
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {self.role}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str | None:
        """'<pid> <role>' of whoever holds the lock, or None when it is free."""
        try:
            fd = os.open(self.path, os.O_RDONLY | NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return os.read(fd, 200).decode(errors="replace").strip() or "another process"
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StateLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def which(program: str, path: str) -> str | None:
    """`program` on `path` (shutil.which's answer, without importing shutil: with bz2 and lzma it
    is 0.3 MiB of an idle daemon's PSS, docs/performance.md, section 10)."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory, program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
