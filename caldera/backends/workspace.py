"""The diff of a turn, from the workspace itself: a snapshot before, a unified diff after.

For a backend that does not tell its changes as a diff (Claude Code: its edits arrive as
tool calls, its Bash commands' writes not at all). Bounded: files up to FILE_BYTES are
kept as text (at most TOTAL_BYTES in all, MAX_FILES files, `.git` and other VCS dirs
skipped); a larger or binary file is compared by size and mtime and shown as one line.
A workspace past the bounds gives no diff (`Snapshot.complete` is False), never a wrong one.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field

FILE_BYTES = 256 * 1024
TOTAL_BYTES = 16 * 1024 * 1024
MAX_FILES = 5000
SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__"}
DIFF_CONTEXT = 3

Stamp = tuple[int, int]  # (size, mtime_ns)


@dataclass
class Snapshot:
    root: str
    stamps: dict[str, Stamp] = field(default_factory=dict)
    texts: dict[str, str | None] = field(default_factory=dict)  # None: large or binary
    complete: bool = True

    @classmethod
    def take(cls, root: str) -> Snapshot:
        snap = cls(root)
        total = 0
        for rel, path in _files(root):
            if len(snap.stamps) >= MAX_FILES:
                snap.complete = False
                break
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            snap.stamps[rel] = (st.st_size, st.st_mtime_ns)
            text = _read_text(path, st.st_size) if total + st.st_size <= TOTAL_BYTES else None
            snap.texts[rel] = text
            total += len(text or "")
        return snap

    def diff(self) -> str:
        """A unified diff of what changed since the snapshot ("" when nothing did)."""
        if not self.complete:
            return ""
        after = Snapshot.take(self.root)
        if not after.complete:
            return ""
        out: list[str] = []
        for rel in sorted(set(self.stamps) | set(after.stamps)):
            old, new = self.stamps.get(rel), after.stamps.get(rel)
            if old == new:
                continue
            before_text = self.texts.get(rel) if old else ""
            after_text = after.texts.get(rel) if new else ""
            if before_text is None or after_text is None:
                what = "added" if not old else "deleted" if not new else "changed"
                out.append(f"Binary or large file {rel} {what}\n")
                continue
            if before_text == after_text:
                continue
            out.extend(difflib.unified_diff(
                before_text.splitlines(keepends=True), after_text.splitlines(keepends=True),
                fromfile=f"a/{rel}" if old else "/dev/null", tofile=f"b/{rel}" if new else "/dev/null",
                n=DIFF_CONTEXT))
            if out and not out[-1].endswith("\n"):
                out[-1] += "\n\\ No newline at end of file\n"
        return "".join(out)


def _files(root: str) -> list[tuple[str, str]]:
    found = []
    for current, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = os.path.join(current, name)
            found.append((os.path.relpath(path, root), path))
            if len(found) > MAX_FILES:
                return found
    return found


def _read_text(path: str, size: int) -> str | None:
    if size > FILE_BYTES or os.path.islink(path):
        return None
    try:
        with open(path, "rb") as fh:
            raw = fh.read(FILE_BYTES + 1)
    except OSError:
        return None
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
