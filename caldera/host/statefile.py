"""`state.json`: the runtime's small durable key-value state (the current
config revision, the journal of fetched commands, the last connection status).

Every set() is an atomic write, so a crash leaves the old state or the new. A write
that fails (a full disk) changes nothing: memory stays what is on disk and the
OSError is raised, so nothing the caller could not record is saved later by
someone else's write (issue 26). Each outcome goes into the `StorageHealth` record."""
from __future__ import annotations

import copy
import threading

from caldera import TYPE_CHECKING
from caldera.host.fsutil import atomic_write_json, read_json
from caldera.host.storage import StorageHealth

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from _typeshed import StrPath


class StateFile:
    def __init__(self, path: StrPath, storage: StorageHealth | None = None) -> None:
        self.path = path
        self.storage = storage or StorageHealth()
        self._lock = threading.Lock()
        try:
            self._data = read_json(path, {}) or {}
        except ValueError:
            # A torn file cannot happen with atomic writes; a hand-edited one can.
            raise ValueError(f"{path} is not valid JSON; move it away to start fresh") from None

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return copy.deepcopy(self._data.get(key, default))

    def set(self, key: str, value: Any) -> None:
        with self._lock:
            self._commit({**self._data, key: copy.deepcopy(value)})

    def update(self, key: str, func: Callable[[Any], Any]) -> Any:
        """Apply func(old) -> new under the lock and persist; returns new."""
        with self._lock:
            new = func(copy.deepcopy(self._data.get(key)))
            self._commit({**self._data, key: new})
            return copy.deepcopy(new)

    def flush(self) -> None:
        """Write the state as it is: the cheap probe of whether the state dir takes writes
        again (daemon/poller, before it fetches while a write failed). Raises OSError."""
        with self._lock:
            self._commit(self._data)

    def _commit(self, data: dict[str, Any]) -> None:
        """Write `data`, then make it the state; on failure the state stays as it was."""
        try:
            atomic_write_json(self.path, data, mode=0o600)
        except OSError as exc:
            if data == self._data or not self._replaced(data):  # a rewrite as it was proves nothing
                self.storage.failed(self.path, exc)
                raise
            # The rename happened and only the directory's fsync failed: the file holds `data`,
            # so memory follows it (a restart reads it); only a power cut could lose it now.
        self._data = data
        self.storage.ok()

    def _replaced(self, data: dict[str, Any]) -> bool:
        """Whether the file already holds `data` (the write failed after its rename)."""
        try:
            return bool(read_json(self.path, None) == data)
        except (OSError, ValueError):
            return False
