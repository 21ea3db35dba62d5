"""Logging to stderr, every record through the Redactor; journald priorities when stderr is the journal.

Under systemd, stderr is a stream to journald and `$JOURNAL_STREAM` holds its
"device:inode". When that matches fstat(stderr), each line starts with the
sd-daemon prefix `<N>` (syslog priority: 3 err, 4 warning, 6 info, 7 debug), so
`journalctl -p warning` finds the warnings; journald adds the time. Anywhere
else (a terminal, a file, a pipe, a child that inherited the variable with
another stderr) the lines stay plain text.
"""
from __future__ import annotations

import logging
import os
import sys

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TextIO

    from caldera.redact import Redactor

# logging level -> syslog priority (sd-daemon(3)); anything in between rounds to the next lower level's
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))
DEBUG_PRIORITY = 7


class RedactingFilter(logging.Filter):
    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        # Format once, redact the result; args are gone so no handler re-formats raw values.
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info, record.exc_text = None, None
        record.msg, record.args = self.redactor.text(message), None
        return True


def priority(levelno: int) -> int:
    for level, prio in PRIORITIES:
        if levelno >= level:
            return prio
    return DEBUG_PRIORITY


class JournalFormatter(logging.Formatter):
    """Every line of a record (a traceback too) carries the record's `<N>`: journald reads it per line."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def stream_is_journal(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """True when `stream` is the journal stream systemd named in $JOURNAL_STREAM ("dev:ino")."""
    dev, sep, ino = environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no file descriptor behind it (e.g. StringIO)
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def setup(level: str, redactor: Redactor, stream: TextIO | None = None, with_time: bool = False,
          environ: Mapping[str, str] = os.environ) -> logging.Handler:
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    fmt = "%(levelname)s %(name)s: %(message)s"
    if stream_is_journal(stream, environ):
        handler.setFormatter(JournalFormatter(fmt))
    else:
        handler.setFormatter(logging.Formatter(("%(asctime)s " if with_time else "") + fmt))
    handler.addFilter(RedactingFilter(redactor))
    root = logging.getLogger("caldera")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
    return handler
