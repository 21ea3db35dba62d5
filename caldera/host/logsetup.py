"""Logging to stderr (journald adds the time), every record through the Redactor."""
from __future__ import annotations

import logging
import sys


class RedactingFilter(logging.Filter):
    def __init__(self, redactor):
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


def setup(level: str, redactor, stream=None, with_time: bool = False) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    fmt = "%(asctime)s " if with_time else ""
    handler.setFormatter(logging.Formatter(fmt + "%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter(redactor))
    root = logging.getLogger("caldera")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
    return handler
