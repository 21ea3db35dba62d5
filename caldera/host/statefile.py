"""`state.json`: the runtime's small durable key-value state (the current
config revision, the journal of fetched commands, the last connection status).
Every set() is an atomic write, so a crash leaves the old state or the new."""
from __future__ import annotations

import copy
import threading

from caldera import TYPE_CHECKING
from caldera.host.fsutil import atomic_write_json, read_json

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from _typeshed import StrPath


class StateFile:
    def __init__(self, path: StrPath) -> None:
        self.path = path
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
            self._data[key] = copy.deepcopy(value)
            atomic_write_json(self.path, self._data, mode=0o600)

    def update(self, key: str, func: Callable[[Any], Any]) -> Any:
        """Apply func(old) -> new under the lock and persist; returns new."""
        with self._lock:
            new = func(copy.deepcopy(self._data.get(key)))
            self._data[key] = new
            atomic_write_json(self.path, self._data, mode=0o600)
            return copy.deepcopy(new)
