"""The agent driver interface: what the daemon, the CLI and the command handlers use of
the driver that speaks for the agent, in adapter mode (`AdapterDriver`,
agents/adapter/driver.py) and in process mode (`ProcessDriver`, agents/process/driver.py).

Both drivers satisfy `AgentDriver`; mypy checks it (each driver module ends with the
check). What only process mode has (start / stop / restart, the supervisor thread, the
control socket) is asked of a `ProcessDriver` by `as_process_driver`, never probed.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import threading

    from caldera.agents.adapter.answer import Answer
    from caldera.agents.manifest import Manifest
    from caldera.agents.process.driver import ProcessDriver

PROCESS_DRIVER_MODULE = "caldera.agents.process.driver"


class AgentDriver(Protocol):
    """The verbs return an `Answer` (a refusal is an Answer too, never an exception); a
    command's thread passes its cancel event and deadline (time.monotonic()), the control
    socket and the local CLI pass neither."""

    @property
    def manifest(self) -> Manifest:
        """The effective manifest the driver acts on now."""

    @property
    def last_level(self) -> str | None:
        """The agent's level in the last report (a blueprint update's window compares it);
        None when no report has judged it."""

    def refresh_manifest(self) -> None:
        """Pick up a changed effective manifest (an update, a rollback, an edit)."""

    def report_section(self) -> dict[str, Any]:
        """The agent's part of a heartbeat and a state report, redacted."""

    def controls(self) -> list[str]:
        """The controls the plane may offer (the manifest's, or all of them)."""

    def pause(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer: ...

    def resume(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer: ...

    def run_now(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer: ...

    def settings_get(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer: ...

    def settings_set(self, values: dict[str, Any], *, cancel: threading.Event | None = None,
                     deadline: float | None = None) -> Answer: ...

    def log_list(self, *, cancel: threading.Event | None = None, deadline: float | None = None) -> Answer: ...

    def log_get(self, name: str, *, cancel: threading.Event | None = None,
                deadline: float | None = None) -> Answer: ...

    def check_told(self, content: dict[str, Any]) -> list[str]:
        """Why a config revision's `instructions`/`mcp` may not be applied (one sentence
        each; [] = allowed). Asked before anything of the revision is stored."""

    def apply_told(self, content: dict[str, Any]) -> dict[str, Any]:
        """Apply a checked revision's `instructions`/`mcp`; the finish result's part."""


def as_process_driver(driver: AgentDriver | None) -> ProcessDriver | None:
    """The driver when it is process mode's, else None. An adapter-mode runtime never
    imports process mode (its start-up and memory budget, docs/performance.md), and no
    ProcessDriver exists before its module is imported: the isinstance is asked only then."""
    if driver is None or PROCESS_DRIVER_MODULE not in sys.modules:
        return None
    from caldera.agents.process.driver import ProcessDriver

    return driver if isinstance(driver, ProcessDriver) else None
