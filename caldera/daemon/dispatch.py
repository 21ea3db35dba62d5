"""Control-plane commands: the table of routes, command type -> handler and its context.

The contract (what a handler is given and returns, `Route`) is protocol/handlers.py; each
domain declares the context its handlers take. This table is the one place that knows every
domain: each route names its handler and the builder of that handler's context, once, and
mypy checks the pair where `route()` makes it. A domain's module is imported when its first
command arrives (`LazyModule`: what that saves, docs/performance.md, section 2).
"""
from __future__ import annotations

from caldera import TYPE_CHECKING
from caldera.agents.driver import AgentCall
from caldera.daemon import builtin
from caldera.errors import CommandError
from caldera.protocol.handlers import Bound, Call, LazyModule, Route, route

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from caldera.agents import revisions
    from caldera.agents.adapter import commands as adapter
    from caldera.agents.process import commands as process
    from caldera.backends import commands as runs
    from caldera.daemon.wiring import Parts
    from caldera.skills import commands as skills
else:  # the same modules, each imported by its first command's route
    revisions = LazyModule("caldera.agents.revisions")
    adapter = LazyModule("caldera.agents.adapter.commands")
    process = LazyModule("caldera.agents.process.commands")
    runs = LazyModule("caldera.backends.commands")
    skills = LazyModule("caldera.skills.commands")


# ---------------------------------------------------------------- each domain's context

def _builtin(parts: Parts, call: Call) -> builtin.BuiltinCall:
    return builtin.BuiltinCall(call.command, call.cancel, call.deadline, client=parts.client, reports=parts.reports,
                               report_soon=parts.wake.report_soon)


def _agent(parts: Parts, call: Call) -> AgentCall:
    return AgentCall(call.command, call.cancel, call.deadline, driver=parts.current.driver,
                     report_now=parts.wake.report_now)


def _revision(parts: Parts, call: Call) -> revisions.RevisionCall:
    return revisions.RevisionCall(call.command, call.cancel, call.deadline, paths=parts.paths, current=parts.current,
                                  state=parts.state, client=parts.client, redactor=parts.redactor,
                                  report_now=parts.wake.report_now)


def _skill(parts: Parts, call: Call) -> skills.SkillCall:
    return skills.SkillCall(call.command, call.cancel, call.deadline, agent_id=parts.identity.agent_id,
                            state_dir=parts.paths.state_dir, env=parts.current.settings.env, client=parts.client,
                            publisher=parts.publisher, inventory_changed=parts.wake.inventory_changed)


def _run(parts: Parts, call: Call) -> runs.RunCall:
    return runs.RunCall(call.command, call.cancel, call.deadline, agent_id=parts.identity.agent_id,
                        paths=parts.paths, env=parts.current.settings.env, redactor=parts.redactor,
                        client=parts.client, runs=parts.runs, servers=parts.servers)


# ---------------------------------------------------------------- the table

def routes() -> dict[str, Route[Parts, Any]]:
    """command_type -> its route (SPEC section 8)."""
    return {
        "collect_system_info": route(_builtin, lambda: builtin.collect_system_info),
        "health_check": route(_builtin, lambda: builtin.health_check),
        # adapter verbs; only those in the manifest's `controls` where it names them
        "pause": route(_agent, lambda: adapter.pause),
        "resume": route(_agent, lambda: adapter.resume),
        "run_now": route(_agent, lambda: adapter.run_now),
        "settings_get": route(_agent, lambda: adapter.settings_get),
        "settings_set": route(_agent, lambda: adapter.settings_set),
        "log_list": route(_agent, lambda: adapter.log_list),
        "log_get": route(_agent, lambda: adapter.log_get),
        # process mode's v1 slots
        "start_openclaw": route(_agent, lambda: process.start_openclaw),
        "stop_openclaw": route(_agent, lambda: process.stop_openclaw),
        "restart_openclaw": route(_agent, lambda: process.restart_openclaw),
        # skills (SPEC section 9)
        "sync_skill_inventory": route(_skill, lambda: skills.sync_skill_inventory),
        "refresh_skill_inventory": route(_skill, lambda: skills.refresh_skill_inventory),
        "collect_skill_package": route(_skill, lambda: skills.collect_skill_package),
        "install_skill": route(_skill, lambda: skills.install_skill),
        "update_skill": route(_skill, lambda: skills.update_skill),
        "uninstall_skill": route(_skill, lambda: skills.uninstall_skill),
        "remove_skill": route(_skill, lambda: skills.remove_skill),
        "disable_skill": route(_skill, lambda: skills.disable_skill),
        "quarantine_skill": route(_skill, lambda: skills.quarantine_skill),
        "handle_skill_risk": route(_skill, lambda: skills.handle_skill_risk),
        # config revisions
        "apply_config_revision": route(_revision, lambda: revisions.apply_config_revision),
        "reload_config": route(_revision, lambda: revisions.reload_config),
        # code-agent runs (SPEC section 10)
        "agent_run": route(_run, lambda: runs.agent_run),
        "agent_interrupt": route(_run, lambda: runs.agent_interrupt),
    }


def binder(parts: Parts) -> Callable[[Call], Bound]:
    """`bind(call)`: the handler of the call's command type given its context (its module
    imported now, the first time); CommandError for a type no route names."""
    table = routes()

    def bind(call: Call) -> Bound:
        route = table.get(call.command.type)
        if route is None:
            raise CommandError(f"unsupported command type: {call.command.type}")
        return route.bind(parts, call)

    return bind


def schema_name(command_type: str) -> str:
    return f"commands/{command_type}.schema.json"
