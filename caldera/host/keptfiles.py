"""Files read again and again (procfs, sysfs, cgroupfs), each read with one syscall.

Opening a file costs more than reading it: Python's open+read+close of /proc/loadavg
is five syscalls (open, fstat, read, read, close), and a sample reads ~20 such
files every 5 s. These files are generated afresh at every read from offset 0, so
a kept descriptor read with `os.pread(fd, size, 0)` gives the current text in one
syscall (bench/bench_sampler.py; docs/performance.md).

Only for pseudo-files: a regular file replaced by rename would leave a kept
descriptor on the old inode, so the Sampler keeps descriptors only when its roots
are the real /proc and /sys (a fixture tree is read the plain way). A descriptor
that fails (a removed cgroup or interface: ENODEV, ESTALE) is closed and the path
opened again once. At most `limit` descriptors are kept; beyond that, plain reads.
"""
from __future__ import annotations

import os

FIRST_SIZE = 4096  # most of these files are far smaller; a bigger one grows its own buffer
MAX_SIZE = 16 << 20  # a pseudo-file larger than this is cut (no file read here comes near)


class ReadError(OSError):
    """An existing file that could not be read (not a missing one: that reads None)."""


class KeptFiles:
    def __init__(self, keep: bool = True, limit: int = 64) -> None:
        self.keep = keep
        self.limit = limit
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}

    def read(self, path: str) -> str | None:
        """The file's text, None when it does not exist; ReadError otherwise."""
        fd = self._fds.get(path)
        if fd is not None:
            try:
                return self._pread(path, fd)
            except OSError:
                self._drop(path)  # removed under us, or a stale handle: open it afresh below
        fd = _open(path)
        if fd is None:
            return None
        try:
            text = self._pread(path, fd)
        except OSError as exc:
            os.close(fd)
            raise ReadError(exc.errno, exc.strerror, path) from None
        if self.keep and len(self._fds) < self.limit:
            self._fds[path] = fd
        else:
            os.close(fd)
        return text

    def _pread(self, path: str, fd: int) -> str:
        size = self._sizes.get(path, FIRST_SIZE)
        while True:
            data = os.pread(fd, size, 0)
            # procfs and cgroupfs fill the buffer up to the last whole line that fits, so
            # only a read well short of the buffer is known to be whole; else read again
            # with a bigger buffer (kept for the next time: one read from then on).
            if len(data) <= size // 2 or size >= MAX_SIZE:
                return data.decode("ascii", "replace")
            size *= 4
            self._sizes[path] = size

    def _drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every kept descriptor (a changed cgroup layout, or the end)."""
        for path in list(self._fds):
            self._drop(path)

    def __len__(self) -> int:
        return len(self._fds)


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ReadError(exc.errno, exc.strerror, path) from None
