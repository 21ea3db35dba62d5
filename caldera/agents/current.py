"""`Current`: what may be replaced while the daemon runs (`reload_config`, a config
revision's blueprint update): the settings, the manifest and the driver built from it.
The daemon builds it (daemon/wiring.py); the reports read it, and the revision handlers
(agents/revisions.py) replace what they change.
"""
from __future__ import annotations

import threading

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from caldera.agents.driver import AgentDriver
    from caldera.agents.manifest import Manifest
    from caldera.config import Settings


class _Unchanged:
    """`Current.replace`'s default: the part is not replaced (None is a value there)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()


class Current:
    """What may be replaced while the daemon runs (`reload_config`, a blueprint update):
    the settings, the manifest and the driver built from it. Readers take the value
    at the time they start; a replacement is one assignment under the lock."""

    __slots__ = ("settings", "manifest", "driver", "_lock")

    settings: Settings
    manifest: Manifest | None
    driver: AgentDriver | None
    _lock: threading.Lock

    def __init__(self, settings: Settings, manifest: Manifest | None = None,
                 driver: AgentDriver | None = None) -> None:
        self.settings = settings
        self.manifest = manifest
        self.driver = driver
        self._lock = threading.Lock()

    def replace(self, *, settings: Settings | _Unchanged = UNCHANGED,
                manifest: Manifest | None | _Unchanged = UNCHANGED,
                driver: AgentDriver | None | _Unchanged = UNCHANGED) -> None:
        """Each one given replaced at once, under the lock (None is a value: no manifest, no
        driver; a name not given stays as it is)."""
        with self._lock:
            if not isinstance(settings, _Unchanged):
                self.settings = settings
            if not isinstance(manifest, _Unchanged):
                self.manifest = manifest
            if not isinstance(driver, _Unchanged):
                self.driver = driver
