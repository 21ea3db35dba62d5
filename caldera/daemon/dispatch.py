"""Control-plane commands: the registry of handlers and what a handler is given.

A handler is a plain function `handler(ctx: CommandContext, payload: dict) -> dict`.
It returns the finish `result` (succeeded) or raises `CommandError(message)`
(failed). The payload has already been validated against
`schemas/commands/<type>.schema.json`. Handlers are imported only when their
command first arrives, so the daemon never pays for a subsystem it does not use.
"""
from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from caldera.errors import CommandError

if TYPE_CHECKING:
    from caldera.agents.driver import AgentDriver
    from caldera.backends.registry import ActiveRuns
    from caldera.config import AgentPaths, Settings
    from caldera.daemon.live import LiveStatus
    from caldera.daemon.reporter import Reports
    from caldera.daemon.wakeups import Wakeups
    from caldera.daemon.wiring import Current, Parts
    from caldera.host.statefile import StateFile
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.command import Command
    from caldera.protocol.outbox import Outbox
    from caldera.redact import Redactor
    from caldera.skills.publish import Publisher

# command_type -> "module:function"
HANDLERS: dict[str, str] = {
    "collect_system_info": "caldera.daemon.builtin:collect_system_info",
    "health_check": "caldera.daemon.builtin:health_check",
    # adapter verbs (SPEC section 8); only those in the manifest's `controls` where it names them
    "pause": "caldera.agents.adapter.commands:pause",
    "resume": "caldera.agents.adapter.commands:resume",
    "run_now": "caldera.agents.adapter.commands:run_now",
    "settings_get": "caldera.agents.adapter.commands:settings_get",
    "settings_set": "caldera.agents.adapter.commands:settings_set",
    "log_list": "caldera.agents.adapter.commands:log_list",
    "log_get": "caldera.agents.adapter.commands:log_get",
    "start_openclaw": "caldera.agents.process.commands:start_openclaw",
    "stop_openclaw": "caldera.agents.process.commands:stop_openclaw",
    "restart_openclaw": "caldera.agents.process.commands:restart_openclaw",
    # skills (SPEC section 9)
    "sync_skill_inventory": "caldera.skills.commands:sync_skill_inventory",
    "refresh_skill_inventory": "caldera.skills.commands:refresh_skill_inventory",
    "collect_skill_package": "caldera.skills.commands:collect_skill_package",
    "install_skill": "caldera.skills.commands:install_skill",
    "update_skill": "caldera.skills.commands:update_skill",
    "uninstall_skill": "caldera.skills.commands:uninstall_skill",
    "remove_skill": "caldera.skills.commands:remove_skill",
    "disable_skill": "caldera.skills.commands:disable_skill",
    "quarantine_skill": "caldera.skills.commands:quarantine_skill",
    "handle_skill_risk": "caldera.skills.commands:handle_skill_risk",
    # config revisions
    "apply_config_revision": "caldera.agents.revisions:apply_config_revision",
    "reload_config": "caldera.agents.revisions:reload_config",
    # code-agent runs (SPEC section 10)
    "agent_run": "caldera.backends.commands:agent_run",
    "agent_interrupt": "caldera.backends.commands:agent_interrupt",
}


@dataclass(frozen=True, eq=False)
class CommandContext:
    """What a handler is given: the command, its cancel and deadline, and the runtime's
    parts a handler may use, each by name (built per command by `for_command`).

    command:   the frozen Command parsed at fetch (caldera.protocol.command).
    cancel:    set when the command's timeout passes or the operator cancels; long
               work checks it and subprocesses are killed on it.
    deadline:  time.monotonic() by which the command must be finished.
    settings, driver: the values current when the command started (`current` is
               the holder, for the handlers that replace them: reload_config, revisions).
    """

    command: Command
    cancel: threading.Event
    deadline: float
    agent_id: str
    paths: AgentPaths
    settings: Settings
    driver: AgentDriver | None  # None without a manifest
    current: Current
    redactor: Redactor
    client: ControlPlaneClient | None  # None when the agent is not connected
    outbox: Outbox
    state: StateFile
    wake: Wakeups
    live: LiveStatus
    reports: Reports
    runs: ActiveRuns
    publisher: Publisher

    @classmethod
    def for_command(cls, parts: Parts, command: Command, cancel: threading.Event, deadline: float) -> CommandContext:
        current = parts.current
        return cls(command=command, cancel=cancel, deadline=deadline, agent_id=parts.identity.agent_id,
                   paths=parts.paths, settings=current.settings, driver=current.driver, current=current,
                   redactor=parts.redactor, client=parts.client, outbox=parts.outbox, state=parts.state,
                   wake=parts.wake, live=parts.live, reports=parts.reports, runs=parts.runs,
                   publisher=parts.publisher)

    def report_now(self) -> None:
        self.wake.report_now()

    def inventory_changed(self) -> None:
        self.wake.inventory_changed()


Handler = Callable[[CommandContext, dict[str, Any]], dict[str, Any]]


def resolve(command_type: str) -> Handler:
    """The handler for a type; CommandError for an unknown one."""
    target = HANDLERS.get(command_type)
    if target is None:
        raise CommandError(f"unsupported command type: {command_type}")
    module_name, func_name = target.split(":")
    handler: Handler = getattr(importlib.import_module(module_name), func_name)
    return handler


def schema_name(command_type: str) -> str:
    return f"commands/{command_type}.schema.json"


if TYPE_CHECKING:
    # Never runs: `resolve` imports a handler by its HANDLERS string, which mypy cannot
    # follow, so this table names every handler once more for mypy to check against
    # `Handler`. tests/daemon/test_daemon_dispatch.py keeps it equal to HANDLERS.
    from caldera.agents import revisions
    from caldera.agents.adapter import commands as adapter_commands
    from caldera.agents.process import commands as process_commands
    from caldera.backends import commands as backend_commands
    from caldera.daemon import builtin
    from caldera.skills import commands as skill_commands

    _CHECKED: dict[str, Handler] = {
        "collect_system_info": builtin.collect_system_info,
        "health_check": builtin.health_check,
        "pause": adapter_commands.pause,
        "resume": adapter_commands.resume,
        "run_now": adapter_commands.run_now,
        "settings_get": adapter_commands.settings_get,
        "settings_set": adapter_commands.settings_set,
        "log_list": adapter_commands.log_list,
        "log_get": adapter_commands.log_get,
        "start_openclaw": process_commands.start_openclaw,
        "stop_openclaw": process_commands.stop_openclaw,
        "restart_openclaw": process_commands.restart_openclaw,
        "sync_skill_inventory": skill_commands.sync_skill_inventory,
        "refresh_skill_inventory": skill_commands.refresh_skill_inventory,
        "collect_skill_package": skill_commands.collect_skill_package,
        "install_skill": skill_commands.install_skill,
        "update_skill": skill_commands.update_skill,
        "uninstall_skill": skill_commands.uninstall_skill,
        "remove_skill": skill_commands.remove_skill,
        "disable_skill": skill_commands.disable_skill,
        "quarantine_skill": skill_commands.quarantine_skill,
        "handle_skill_risk": skill_commands.handle_skill_risk,
        "apply_config_revision": revisions.apply_config_revision,
        "reload_config": revisions.reload_config,
        "agent_run": backend_commands.agent_run,
        "agent_interrupt": backend_commands.agent_interrupt,
    }
