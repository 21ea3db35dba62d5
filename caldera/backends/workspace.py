"""The diff of a turn, from the workspace itself: a snapshot before, a unified diff after.

For a backend that does not tell its changes as a diff (Claude Code: its edits arrive as
tool calls, its Bash commands' writes not at all). The workspace is the agent's: anything in
it may be a trap, and nothing in it may make the runtime read elsewhere or wait.

- The walk holds each directory open (os.fwalk, no symlink followed: a directory swapped for
  a symlink while the walk runs is not entered) and opens each file relative to its
  directory, `O_NOFOLLOW | O_NONBLOCK`; a file is read only when `fstat` of what was opened
  says a regular file with the inode the listing saw. A FIFO, socket or device is never
  opened (it would block, or be a window elsewhere): it is one line of the diff.
- Bounded: files up to FILE_BYTES are kept as text (TOTAL_BYTES in all, MAX_FILES entries,
  MAX_DEPTH levels, SECONDS of walking, `.git` and other VCS dirs skipped); a larger or binary
  file is compared by size and mtime and shown as one line. A walk past a bound, or stopped
  by its caller (cancel, deadline), gives no diff (`Snapshot.complete` is False), never a
  wrong one.

The backend takes the second snapshot only once the CLI and everything in its sandbox are
gone, so that no write of the turn is missed and none happens during the walk.
"""
from __future__ import annotations

import difflib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

FILE_BYTES = 256 * 1024
TOTAL_BYTES = 16 * 1024 * 1024
MAX_FILES = 5000
MAX_DEPTH = 64
SECONDS = 20.0
SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__"}
DIFF_CONTEXT = 3
CHECK_EVERY = 32  # entries between two looks at the caller's stop
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
KINDS = ((stat.S_ISREG, "file"), (stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
         (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"))


@dataclass(frozen=True)
class Entry:
    kind: str  # "file", "symlink", "FIFO", "socket", "device", "other"
    size: int
    mtime_ns: int
    text: str | None = None  # a regular file's text; None: large, binary, unreadable, past the budget


class Stop(Exception):
    """The walk went past a bound or was stopped: the snapshot is incomplete."""


@dataclass
class Snapshot:
    root: str
    entries: dict[str, Entry] = field(default_factory=dict)
    complete: bool = True
    reason: str | None = None  # why it is incomplete

    @classmethod
    def take(cls, root: str, should_stop: Callable[[], bool] | None = None, seconds: float = SECONDS) -> Snapshot:
        snap = cls(root)
        try:
            _Walk(snap, should_stop, time.monotonic() + seconds).run()
        except Stop as exc:
            snap.complete, snap.reason = False, str(exc)
        return snap

    def diff(self, should_stop: Callable[[], bool] | None = None) -> str:
        """A unified diff of what changed since the snapshot ("" when nothing did, or when
        either walk was incomplete)."""
        if not self.complete:
            return ""
        after = Snapshot.take(self.root, should_stop)
        if not after.complete:
            self.reason = f"after the turn: {after.reason}"
            return ""
        out: list[str] = []
        for rel in sorted(set(self.entries) | set(after.entries)):
            out.extend(_changes(rel, self.entries.get(rel), after.entries.get(rel)))
        return "".join(out)


def _changes(rel: str, old: Entry | None, new: Entry | None) -> list[str]:
    if old is not None and new is not None and (old.kind, old.size, old.mtime_ns) == (new.kind, new.size,
                                                                                          new.mtime_ns):
        return []
    what = "added" if old is None else "deleted" if new is None else "changed"
    if old is not None and new is not None and old.kind != new.kind:
        return [f"{rel}: {old.kind} replaced by {new.kind}\n"]
    either = new if new is not None else old
    kind = either.kind if either is not None else "file"
    if kind != "file":
        return [f"{kind if kind == 'FIFO' else kind.capitalize()} {rel} {what}\n"]
    before_text = old.text if old is not None else ""
    after_text = new.text if new is not None else ""
    if before_text is None or after_text is None:
        return [f"Binary or large file {rel} {what}\n"]
    if before_text == after_text:
        return []
    out = list(difflib.unified_diff(
        before_text.splitlines(keepends=True), after_text.splitlines(keepends=True),
        fromfile=f"a/{rel}" if old is not None else "/dev/null", tofile=f"b/{rel}" if new is not None else "/dev/null",
        n=DIFF_CONTEXT))
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n\\ No newline at end of file\n"
    return out


class _Walk:
    def __init__(self, snap: Snapshot, should_stop: Callable[[], bool] | None, deadline: float):
        self.snap, self.should_stop, self.deadline = snap, should_stop, deadline
        self.budget = TOTAL_BYTES
        self.seen = 0

    def run(self) -> None:
        root = self.snap.root
        for current, dirs, files, dirfd in os.fwalk(root, topdown=True, follow_symlinks=False):
            rel_dir = os.path.relpath(current, root)
            depth = 0 if rel_dir == "." else rel_dir.count(os.sep) + 1
            kept = []
            for name in sorted(dirs):
                if name in SKIP_DIRS:
                    continue
                # os.fwalk lists a symlink to a directory among the directories (and never enters it)
                if self._record(rel_dir, name, dirfd, directory=True):
                    kept.append(name)
            if kept and depth >= MAX_DEPTH:
                raise Stop(f"deeper than {MAX_DEPTH} levels")
            dirs[:] = kept
            for name in sorted(files):
                self._record(rel_dir, name, dirfd)

    def _record(self, rel_dir: str, name: str, dirfd: int, directory: bool = False) -> bool:
        """Record one entry; True for a real directory (to walk into)."""
        self.seen += 1
        if self.seen % CHECK_EVERY == 0:
            if time.monotonic() > self.deadline:
                raise Stop(f"the walk took longer than {SECONDS:.0f} s")
            if self.should_stop is not None and self.should_stop():
                raise Stop("the run was stopped")
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError:
            return False  # gone meanwhile
        if stat.S_ISDIR(st.st_mode):
            return directory
        if len(self.snap.entries) >= MAX_FILES:
            raise Stop(f"more than {MAX_FILES} files")
        kind = next((k for test, k in KINDS if test(st.st_mode)), "other")
        text = self._read(name, dirfd, st) if kind == "file" else None
        rel = name if rel_dir == "." else os.path.join(rel_dir, name)
        self.snap.entries[rel] = Entry(kind, st.st_size, st.st_mtime_ns, text)
        return False

    def _read(self, name: str, dirfd: int, listed: os.stat_result) -> str | None:
        """The text of a regular file, if it is one still (the inode the listing saw), small,
        within the budget, and UTF-8 without NUL."""
        if listed.st_size > FILE_BYTES or listed.st_size > self.budget:
            return None
        try:
            fd = os.open(name, _OPEN, dir_fd=dirfd)
        except OSError:
            return None  # a symlink now (ELOOP), gone, or not ours to read
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (listed.st_dev, listed.st_ino):
                return None  # swapped since the listing
            raw = os.read(fd, FILE_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        self.budget -= len(raw)
        if len(raw) > FILE_BYTES or b"\0" in raw:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
