"""The run log `logs/run-<run_id>.log`: the whole raw transcript of a run, redacted.

One line per record: `<utc ts> <channel> <text>`, channels `c2s` (sent to the
backend), `s2c` (received), `stderr`, `event` (a normalised event as JSON),
`note` (the runtime's own remarks). Everything passes through the Redactor
first. The file is 0600 and capped (LOG_CAP_BYTES); past the cap one line says
so and the rest of the transcript is dropped (the events still flow).
"""
from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caldera.errors import CommandError
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from caldera.redact import Redactor

LOG_CAP_BYTES = 64 * 1024 * 1024
FLUSH_SECONDS = 0.5  # the buffer goes to the file at least this often while records come
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: "r1\n" is no run id


@functools.cache
def _encoder() -> json.JSONEncoder:
    # What json.dumps(…, ensure_ascii=False, separators=…) builds on every call: built once.
    return json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def log_path(logs_dir: str | os.PathLike[str], run_id: str) -> Path:
    if not RUN_ID_RE.fullmatch(run_id or ""):
        raise ValueError(f"run_id {run_id!r}: use 1-128 letters, digits, '.', '_' or '-'")
    return Path(logs_dir) / f"run-{run_id}.log"


class RunLog:
    def __init__(self, path: str | os.PathLike[str], redactor: Redactor, cap: int = LOG_CAP_BYTES):
        self.path = Path(path)
        self.redactor = redactor
        self.cap = cap
        self.size = 0
        self.full = False
        self._lock = threading.Lock()
        self._flushed = time.monotonic()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # O_NOFOLLOW: logs/ is a directory an agent's commands can write to; a symlink planted
        # at run-<id>.log must not make the runtime append its transcript to another file.
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise CommandError(f"the run log {self.path} cannot be opened ({exc.strerror}); "
                               "a symlink there is never followed") from None
        self._fh = os.fdopen(fd, "w", encoding="utf-8", errors="replace", buffering=1 << 16)

    def write(self, channel: str, text: str) -> None:
        self._append(f"{rfc3339(millis=True)} {channel} {self.redactor.text(text.rstrip(chr(10)))}\n")

    def write_lines(self, channel: str, lines: list[str]) -> None:
        """Several records of one channel (lines without newlines) at once: one redaction
        over their joined text, one timestamp, one append."""
        block = self.redactor.text_lines(lines)
        prefix = f"{rfc3339(millis=True)} {channel} "
        self._append(prefix + block.replace("\n", "\n" + prefix) + "\n")

    def _append(self, text: str) -> None:
        with self._lock:
            if self.full or self._fh.closed:
                return
            size = len(text)  # characters: close enough to bytes for a cap
            if self.size + size > self.cap:
                self.full = True
                self._fh.write(f"{rfc3339(millis=True)} note run log reached {self.cap} bytes; transcript cut here\n")
                return
            self.size += size
            self._fh.write(text)
            now = time.monotonic()
            if now - self._flushed >= FLUSH_SECONDS:  # readers of a live run: `caldera log --follow`, the poster
                self._fh.flush()
                self._flushed = now

    def event(self, event: dict[str, Any]) -> None:
        # EventSink.emit redacted the event's data already, and the rest is ours: no second pass.
        self._append(f"{rfc3339(millis=True)} event {_encoder().encode(event)}\n")

    def note(self, text: str) -> None:
        self.write("note", text)

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()
