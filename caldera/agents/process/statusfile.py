"""The agent's status file (SPEC section 7b): read with limits, filtered by the one filter.

The file is untrusted: it is opened without following a symlink (O_NOFOLLOW, and
the opened descriptor must be a regular file, so a FIFO can't block the reader),
read up to 256 KiB + 1 byte (more is "oversized", never parsed), decoded as UTF-8
JSON and passed through `caldera.agents.status.filter_status`, the same filter as
adapter `status`. Every problem becomes a health entry with the reason; nothing
here raises.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass

from caldera import TYPE_CHECKING
from caldera.agents.contract import ContractError
from caldera.agents.status import filter_status
from caldera.host.fsutil import read_capped
from caldera.host.jsonlimits import JSONLimitError, loads

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

MAX_BYTES = 256 * 1024
NAME = "Status file"


@dataclass(frozen=True)
class StatusRead:
    """What one read of the status file gave."""

    body: dict[str, Any] | None = None  # the filtered body
    problem: dict[str, Any] | None = None  # a health entry saying what is wrong
    mtime: float | None = None  # the file's, wall time


def _entry(level: str, reason: str) -> dict[str, Any]:
    return {"name": NAME, "level": level, "reason": reason[:1000]}


def read_status_file(path: Path | None, *, stale_after: float, now: float | None = None) -> StatusRead:
    """The status file's filtered body, or None with the reason as a health entry."""
    if path is None:
        return StatusRead()
    now = time.time() if now is None else now
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return StatusRead(problem=_entry("warn", "status file not written yet (the state comes from the process)"))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return StatusRead(problem=_entry("bad", "status file is a symlink; it is not followed"))
        return StatusRead(problem=_entry("bad", f"status file can't be opened: {exc.strerror}"))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return StatusRead(problem=_entry("bad", "status file is not a regular file"))
        data = read_capped(fd, MAX_BYTES)
    except OSError as exc:
        return StatusRead(problem=_entry("bad", f"status file can't be read: {exc.strerror}"))
    finally:
        os.close(fd)
    return _parse(data, st.st_mtime, now, stale_after)


def _parse(data: bytes, mtime: float, now: float, stale_after: float) -> StatusRead:
    if len(data) > MAX_BYTES:
        return StatusRead(problem=_entry("bad", f"status file is over {MAX_BYTES // 1024} KiB; it is not read"),
                          mtime=mtime)
    try:
        raw = loads(data, max_bytes=MAX_BYTES, what="status file")  # the one bounded parser
    except json.JSONDecodeError as exc:
        return StatusRead(problem=_entry("bad", f"status file is not JSON ({exc.msg} at character {exc.pos})"),
                          mtime=mtime)
    except JSONLimitError as exc:  # not UTF-8, nested too deep, NaN, a number Python won't convert
        return StatusRead(problem=_entry("bad", str(exc)), mtime=mtime)
    try:
        body = filter_status(raw)
    except ContractError as exc:
        return StatusRead(problem=_entry("bad", f"status file breaks the contract: {exc}"), mtime=mtime)
    problem = None
    age = now - mtime
    if age > stale_after:
        problem = _entry("warn", f"status file is stale (written {age:.0f} s ago; "
                                 f"more than {stale_after:.0f} s is stale)")
    return StatusRead(body=body, problem=problem, mtime=mtime)
