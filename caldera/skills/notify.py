"""Kernel change notification (inotify through ctypes, stdlib only) for the watcher.

With it, the watcher's 30-second check costs one non-blocking read when nothing
changed, instead of one lstat per file. It only ever *adds* work: a skill with
an event, a skill it could not watch (watch limit), an event-queue overflow, and
every 10th check (`Inventory.FULL_CHECK_EVERY`) fall back to the stat signature.
Watches are added before a skill's signature is taken, so a change after the
signature always leaves an event.
"""
from __future__ import annotations

import ctypes
import os
import struct

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW = 0x1000000, 0x2000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
_HEADER = struct.Struct("iIII")


class Notifier:
    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self.fd: int | None = fd
        self._libc = libc
        self._skill_of: dict[int, str] = {}  # watch descriptor -> skill path
        self._watches: dict[str, list[int]] = {}  # skill path -> its watch descriptors
        self._dirty: set[str] = set()
        self._overflow = False

    @classmethod
    def open(cls) -> Notifier | None:
        """A notifier, or None where inotify is not available (the stat check is used)."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        return cls(fd, libc) if fd >= 0 else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def watch(self, skill: str) -> bool:
        """Watch every non-hidden directory of a skill; False if any watch failed."""
        self.forget(skill)
        wds: list[int] = []
        stack = [skill]
        while stack:
            directory = stack.pop()
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(directory), MASK)
            if wd < 0:
                self._watches[skill] = wds
                self.forget(skill)
                return False
            wds.append(wd)
            self._skill_of[wd] = skill
            try:
                with os.scandir(directory) as it:
                    stack.extend(e.path for e in it if e.name[0] != "." and e.is_dir(follow_symlinks=False))
            except OSError:
                self._watches[skill] = wds
                self.forget(skill)
                return False
        self._watches[skill] = wds
        self._dirty.discard(skill)
        return True

    def forget(self, skill: str) -> None:
        for wd in self._watches.pop(skill, []):
            self._skill_of.pop(wd, None)
            self._libc.inotify_rm_watch(self.fd, wd)

    def drain(self) -> None:
        fd = self.fd
        if fd is None:  # closed: no event can come
            return
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset + _HEADER.size <= len(data):
                wd, mask, _, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size + length
                if mask & IN_Q_OVERFLOW:
                    self._overflow = True
                skill = self._skill_of.get(wd)
                if skill is not None:
                    self._dirty.add(skill)
                    if mask & IN_IGNORED:
                        self._skill_of.pop(wd, None)

    def unchanged(self, skill: str) -> bool:
        """True only when the skill is watched and no event touched it since `watch()`."""
        self.drain()
        return not self._overflow and bool(self._watches.get(skill)) and skill not in self._dirty

    @property
    def overflowed(self) -> bool:
        return self._overflow

    def clear(self) -> None:
        """Before a scan that re-watches every skill: forget the overflow and old events."""
        self._overflow = False
        self._dirty.clear()

