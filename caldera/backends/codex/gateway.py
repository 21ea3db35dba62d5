"""Codex on ClawManager's AI gateway through the run's loopback forwarder (backends/forwarder.py).

Codex sends its provider key as `Authorization: Bearer <env_key's value>`, and its environment
is the agent's commands' (`shell_environment_policy.exclude` keeps the name out, but a command
run another way, or a Codex that forgot the rule, would see it). So on the gateway Codex holds
only the run's token and a base URL on 127.0.0.1; the forwarder checks the token, puts the
gateway's key in its place and sends `POST /responses` on to `<BASE>/v1/responses`, nothing
else (the forwarder is no open relay). It lives as long as the run: `open_forwarder` in
`prepare`, `close()` in `finalize`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from caldera.backends.codex.config import ProviderPlan
from caldera.backends.failures import BACKEND_FAILED, BackendFailure
from caldera.backends.forwarder import Forwarder, TokenRoute, Upstream, openai_error, upstream_proxy

FORWARDED_PATHS = ("/responses",)  # all Codex asks of a Responses provider (measured, 0.169)


def open_forwarder(plan: ProviderPlan, config: dict[str, Any],
                   note: Callable[[str], None] | None = None) -> Forwarder | None:
    """The run's forwarder, started, when the plan is the gateway's (None otherwise), and the
    run's `config` (enforce's) pointed at it."""
    if plan.upstream is None or plan.key is None or plan.run_token is None:
        return None
    try:
        upstream = Upstream.parse(plan.upstream, upstream_proxy(plan.upstream))
    except ValueError as exc:
        raise BackendFailure(BACKEND_FAILED, f"CLAWMANAGER_LLM_BASE_URL: {exc}") from None
    route = TokenRoute(upstream, plan.run_token, ("authorization", f"Bearer {plan.key}"), FORWARDED_PATHS)
    forwarder = Forwarder(route, name="codex-forwarder", note=note, error_body=openai_error)
    config["model_providers"][plan.provider]["base_url"] = forwarder.start()
    return forwarder
