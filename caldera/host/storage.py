"""The state dir's storage health: the last durable write that failed, until one succeeds.

`StateFile` and the `Outbox` report every durable write here (`failed(path, exc)` /
`ok()`). While a write fails the runtime takes no command it could not journal
(daemon/poller), heartbeats go on (daemon/heartbeat), and the state report's health
carries `storage` (`health()`). The record lives in memory only: it cannot be written
where it is about (status.json neither), so `caldera status` also looks at the file
system itself (`free_space_problem`).
"""
from __future__ import annotations

import errno
import os
import threading

from caldera import TYPE_CHECKING
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from _typeshed import StrPath

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space (or no quota) left: it passes when space returns
LOW_SPACE = 64 * 1024  # bytes free under which `caldera status` calls the state dir's file system full
REASON_CAP = 300


def describe(exc: OSError) -> str:
    """An OSError as one short sentence part: 'No space left on device' (no path: given apart)."""
    return (exc.strerror or str(exc) or type(exc).__name__)[:REASON_CAP]


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


class StorageHealth:
    """Thread-safe; one per state dir, shared by its StateFile and Outbox (daemon/wiring)."""

    def __init__(self, on_change: Callable[[dict[str, Any] | None], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._failure: dict[str, Any] | None = None
        self._on_change = on_change or _log_change

    def failed(self, path: StrPath, exc: OSError) -> None:
        """A durable write to `path` failed with `exc`; `since` stays that of the first failure in a row."""
        with self._lock:
            previous = self._failure
            entry = {"state": "full" if is_full(exc) else "error", "error": describe(exc), "path": os.fspath(path),
                     "since": previous["since"] if previous else rfc3339()}
            self._failure = entry
            changed = previous is None or previous["state"] != entry["state"] or previous["error"] != entry["error"]
        if changed:
            self._on_change(dict(entry))

    def ok(self) -> None:
        """A durable write succeeded: the file system takes writes again."""
        with self._lock:
            was, self._failure = self._failure, None
        if was is not None:
            self._on_change(None)

    @property
    def failing(self) -> bool:
        return self._failure is not None

    def failure(self) -> dict[str, Any] | None:
        """The current failure ({state, error, path, since}), or None while writes succeed."""
        with self._lock:
            return dict(self._failure) if self._failure else None

    def health(self) -> dict[str, Any]:
        """`{"storage": {...}}` for the state report's health while a write fails, else {}."""
        failure = self.failure()
        if failure is None:
            return {}
        return {"storage": {"level": "bad", **failure,
                            "effect": "commands are not fetched until the state dir takes writes again"}}


def _log_change(failure: dict[str, Any] | None) -> None:
    import logging  # here: a quick verb that opens a StateFile never pays for logging

    log = logging.getLogger("caldera.storage")
    if failure is None:
        log.warning("the state dir takes writes again; fetching commands")
    else:
        log.error("cannot write %s: %s (since %s); heartbeats go on, commands are not fetched until it "
                  "takes writes again", failure["path"], failure["error"], failure["since"])


def free_space_problem(directory: StrPath, statvfs: Callable[[StrPath], os.statvfs_result] = os.statvfs,
                       as_root: bool = False) -> str | None:
    """Why the file system of `directory` cannot take the runtime's writes, as a sentence part
    ('file system full (0 bytes free)', 'read-only file system'), or None when it can.
    `as_root`: the daemon writes as root (a container's), which may use the reserved blocks."""
    try:
        st = statvfs(directory)
    except OSError as exc:
        return f"cannot be examined: {describe(exc)}"
    if st.f_flag & os.ST_RDONLY:
        return "read-only file system"
    free = (st.f_bfree if as_root else st.f_bavail) * st.f_frsize
    if free < LOW_SPACE:
        return f"file system full ({free} bytes free)"
    if st.f_files and not (st.f_ffree if as_root else st.f_favail):  # inodes: "full" with space left
        return "file system full (no free inodes)"
    return None
