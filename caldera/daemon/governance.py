"""The state report's LLM-governance fields: what caldera hands out to reach a model.

ClawManager's LLM-governance view classifies every instance from `runtime.llm_config_status`,
`llm_provider_base_url` and `llm_config_fingerprint` (docs/container.md, "What the report
says of the LLM configuration"). caldera hands a model provider to two kinds of consumer:
the code-agent backends' control-plane runs (backends.registry.llm_configs: each backend
describes its own) and the process-mode agent (its `bindings` and provider `secrets`:
agents.process.environment.llm_configs). What they call `gateway` is `gateway` in the report
only when it is the platform's, injected in the process environment (protocol/llm.confirmed);
protocol/llm.report_fields makes one answer of them.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from caldera import config
from caldera.agents.narrow import as_process_driver
from caldera.backends.registry import Refused, confinement, sandboxes
from caldera.backends.registry import llm_configs as backend_llm_configs
from caldera.host.loopguard import LoopGuard
from caldera.protocol.llm import confirmed, platform_gateways, report_fields

if TYPE_CHECKING:
    from collections.abc import Mapping

    from caldera.agents.current import Current
    from caldera.config import AgentPaths
    from caldera.protocol.llm import LLMConfig
    from caldera.redact import Redactor

log = logging.getLogger("caldera.reporter")


def llm_fields(current: Current, paths: AgentPaths) -> dict[str, Any]:
    """The `runtime` fields of a state report; {} when caldera hands out no provider. Read
    afresh for each report (a projection edited on disk shows in the next one): without
    workspace roots and a process agent, that is two dictionary lookups."""
    settings = current.settings
    env = settings.env
    configs: list[LLMConfig] = backend_llm_configs(env, str(paths.secrets_dir), config.credentials_directory(env))
    process = as_process_driver(current.driver)
    if process is not None:
        from caldera.agents.process.environment import llm_configs  # loaded with process mode already

        configs += llm_configs(process.spec, env)
    confinement = run_confinement(env)
    if not configs:
        return confinement
    keys = [env.get(name) or "" for name in config.GATEWAY_API_KEY]
    return {**report_fields(confirmed(configs, platform_gateways(settings.injected, keys))), **confinement}


def run_confinement(env: Mapping[str, str]) -> dict[str, str]:
    """`runtime.code_agent_confinement` (caldera's; ClawManager ignores it): what keeps the
    commands of the agent's workspace-write runs in, `backend` (each backend's own sandbox) or
    `external` (CALDERA_RUN_SANDBOX=external: the container), `refused` when that setting is
    refused here (every run then ends blocked, saying why). Absent without workspace roots
    (no run can start). A read-only run keeps its backend's sandbox whatever this says."""
    if not config.workspace_roots(env):
        return {}
    try:
        return {"code_agent_confinement": confinement(env)}
    except Refused:
        return {"code_agent_confinement": "refused"}


class LLMFields:
    """llm_fields for `Reports`: a bug in it never costs a report (the report goes without the
    fields, and the error is logged once while it repeats)."""

    def __init__(self, current: Current, paths: AgentPaths, redactor: Redactor) -> None:
        self.current, self.paths = current, paths
        self.guard = LoopGuard(log, "the LLM-governance fields of the state report", redact=redactor)

    def __call__(self) -> dict[str, Any]:
        try:
            fields = llm_fields(self.current, self.paths)
        except Exception as exc:  # noqa: BLE001 -- logged by the guard; the report goes out
            self.guard.failed(exc)
            return {}
        self.guard.ok()
        return fields


class SandboxHealth:
    """`health.code_agent_sandbox` for `Reports`: what confines the commands of the agent's
    code-agent runs here (registry.sandboxes: caldera's bubblewrap, or what a run gets without
    it and why), so that a host where it cannot start says so before any run. A bug in it never
    costs a report (the entry is left out, the error logged once while it repeats)."""

    def __init__(self, current: Current, redactor: Redactor) -> None:
        self.current = current
        self.guard = LoopGuard(log, "the code-agent sandbox entry of the state report", redact=redactor)

    def __call__(self) -> dict[str, Any]:
        try:
            found = sandboxes(self.current.settings.env)
        except Exception as exc:  # noqa: BLE001 -- logged by the guard; the report goes out
            self.guard.failed(exc)
            return {}
        self.guard.ok()
        return {"code_agent_sandbox": found} if found else {}
