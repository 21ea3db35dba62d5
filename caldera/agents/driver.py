"""The agent driver interface: what the daemon, the CLI and the command handlers use of
the driver that speaks for the agent, in adapter mode (`AdapterDriver`,
agents/adapter/driver.py) and in process mode (`ProcessDriver`, agents/process/driver.py).

Both drivers satisfy `AgentDriver`; mypy checks it (each driver module ends with the
check). What only process mode has (start / stop / restart, the supervisor thread, the
control socket) is asked of a `ProcessDriver` by `agents.process.as_process_driver`, never
probed.

`AgentCall` is what the commands that act through the driver are given (the adapter verbs,
agents/adapter/commands.py, and start/stop/restart_openclaw, agents/process/commands.py).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from caldera.protocol.handlers import Call

if TYPE_CHECKING:
    import threading

    from caldera.agents.adapter.answer import Answer
    from caldera.agents.manifest import Manifest
    from caldera.protocol.command import Command


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


class AgentCall(Call):
    """A command that acts through the agent's driver: the driver current when it started
    (None without a manifest) and how to ask for a state report now (the state changed)."""

    __slots__ = ("driver", "report_now")

    driver: AgentDriver | None
    report_now: Callable[[], None]

    def __init__(self, command: Command, cancel: threading.Event, deadline: float, driver: AgentDriver | None,
                 report_now: Callable[[], None]) -> None:
        super().__init__(command, cancel, deadline)
        self.driver = driver
        self.report_now = report_now
