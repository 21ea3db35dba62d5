"""The private CODEX_HOME of one run, built from the secret projection plus the
runtime's enforced settings (SPEC section 10, codex-notes sections 3, 6 and 7).

Projection (`<secrets>/codex/`): `config.toml` (provider, model), optional
`auth.json`, and `env/NAME` files whose contents become Codex's environment
variable NAME. Under systemd's `$CREDENTIALS_DIRECTORY` the same files are
either in a `codex/` subdirectory or flat, named as `LoadCredential=codex:DIR`
names them: `codex_config.toml`, `codex_auth.json`, `codex_env_NAME`.

Nothing read here is ever printed: values go to the Redactor, the files go only
into the run's 0700 CODEX_HOME.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caldera.backends.failures import BACKEND_FAILED, SECRET_UNAVAILABLE, BackendFailure
from caldera.backends.forwarder import gateway_base, gateway_key, run_token
from caldera.backends.projection import Projection
from caldera.backends.registry import gateway_settings
from caldera.config import Gateway
from caldera.host.fsutil import atomic_write_bytes
from caldera.protocol.llm import EXTERNAL, GATEWAY, LLMConfig, gateway_config, same_endpoint

GATEWAY_PROVIDER = "caldera-gateway"
LLM_SOURCE = "backend codex"
BUILTIN_OPENAI = "openai"  # Codex's built-in provider (the default `model_provider`)
OPENAI_BASE_URL = "https://api.openai.com/v1"  # Codex's built-in `openai` provider without `openai_base_url`
GATEWAY_KEY_ENV = "CALDERA_GATEWAY_API_KEY"
GATEWAY_CONTEXT_WINDOW = 128000  # what ClawManager's codex image declares for every gateway model
DEFAULT_REQUEST_MAX_RETRIES = 1
DEFAULT_STREAM_MAX_RETRIES = 2
_SECRETISH_KEY = re.compile(r"(?i)(token|secret|password|passwd|api[_-]?key|bearer|credential)")


@dataclass
class ProviderPlan:
    """What a run needs to start Codex: config, environment, secrets to mask."""
    config: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)  # NAME -> value for Codex's environment
    auth_json: bytes | None = None
    secret_values: list[str] = field(default_factory=list)
    source: str = "projection"  # or "gateway"
    provider: str = "openai"
    model: str | None = None
    base_url: str | None = None  # the provider's, as shown (on the gateway: <BASE>/v1, what Codex asks under)
    # On the gateway, what only the run's loopback forwarder holds (codex/gateway.py): the key
    # and its upstream; Codex gets `run_token` in the key's place and the forwarder's URL.
    key: str | None = field(default=None, repr=False)
    upstream: str | None = None
    run_token: str | None = field(default=None, repr=False)
    catalogue: list[dict[str, Any]] | None = None  # model_catalog_json's models (the gateway's)


# ---------------------------------------------------------------- plan

def _projected(projection: Projection) -> tuple[bytes | None, bytes | None, dict[str, str]]:
    """(config.toml, auth.json, env/NAME values) of the projection; all empty: nothing projected."""
    return projection.read("config.toml"), projection.read("auth.json"), projection.env()


def plan_provider(projection: Projection, environ: Mapping[str, str], model: str | None = None) -> ProviderPlan:
    """The provider plan from the projection, else from the AI gateway variables (the model
    then by the gateway's rule: errors.Refused for one its catalogue does not list)."""

    raw_config, auth_json, env = _projected(projection)
    if raw_config is None and auth_json is None and not env:
        gateway = gateway_settings(environ)
        if gateway is None:
            raise BackendFailure(SECRET_UNAVAILABLE, (
                f"no Codex provider configuration: {projection.label}/config.toml is missing "
                "and no AI gateway (CLAWMANAGER_LLM_BASE_URL/CLAWMANAGER_LLM_API_KEY) is configured"))
        return _gateway_plan(gateway, model)
    try:
        config = tomllib.loads(raw_config.decode("utf-8")) if raw_config else {}
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        # tomllib's message gives line and column only, never the content.
        raise BackendFailure(BACKEND_FAILED, f"{projection.label}/config.toml is not valid TOML: {exc}") from None
    secrets = list(env.values()) + _secretish_values(config)
    if auth_json is not None:
        secrets += _json_strings(auth_json)
    plan = ProviderPlan(config=config, env=env, auth_json=auth_json, secret_values=secrets,
                        provider=str(config.get("model_provider") or "openai"),
                        model=model or config.get("model"))
    _check_required(plan, projection)
    _credentials_to_environment(plan)
    provider = config.get("model_providers", {}).get(plan.provider)
    if plan.provider == BUILTIN_OPENAI:
        # Codex's built-in provider takes its URL from `openai_base_url` only: it refuses a
        # [model_providers.openai] table ("reserved built-in provider IDs") and ignores an
        # OPENAI_BASE_URL in its environment (tried with Codex 0.169).
        openai_base_url = config.get("openai_base_url")
        plan.base_url = openai_base_url if isinstance(openai_base_url, str) and openai_base_url.strip() else None
    elif isinstance(provider, dict):
        plan.base_url = provider.get("base_url")
    return plan


def _gateway_plan(gateway: Gateway, model: str | None) -> ProviderPlan:
    """Codex on the AI gateway: its Responses route is `<BASE>/v1/responses` (Codex appends
    `/responses` to the base URL; ClawManager's guide: "the base_url must end in the final /v1"),
    reached through the run's loopback forwarder, which alone holds the gateway's key: Codex's
    environment (and so its commands', should the exclusion fail) holds a run token instead."""
    base_url, api_key = gateway.base_url or "", gateway_key(gateway.api_key or "")  # gateway_settings: both set
    token = run_token()  # masked by its prefix (forwarder.process_secret), not one value per run
    provider = {"name": "AI gateway", "base_url": gateway_responses_base(base_url), "env_key": GATEWAY_KEY_ENV,
                "wire_api": "responses"}
    config: dict[str, Any] = {"model_provider": GATEWAY_PROVIDER, "model_providers": {GATEWAY_PROVIDER: provider}}
    model = gateway.model_for(model)  # SPEC section 10's rule (config.Gateway.model_ref)
    if model:
        config["model"] = model
    models = list(dict.fromkeys([*(gateway.catalogue or ()), *([model] if model else [])]))
    return ProviderPlan(config=config, env={GATEWAY_KEY_ENV: token}, secret_values=[api_key],
                        source="gateway", provider=GATEWAY_PROVIDER, model=model, base_url=provider["base_url"],
                        key=api_key, upstream=provider["base_url"], run_token=token,
                        catalogue=[gateway_model_entry(m, i) for i, m in enumerate(models)] or None)


def gateway_model_entry(model: str, priority: int) -> dict[str, Any]:
    """One gateway model in the run's `model_catalog_json`. Codex 0.169 takes a model its
    bundled catalogue lacks with "fallback metadata" (a `warning`) and then offers no
    apply_patch tool: the agent could edit files only through shell commands (measured). These
    are the fields it requires (it names each missing one), the context window and shell type
    ClawManager's codex image writes, apply_patch as the freeform tool (the only variant 0.169
    accepts), and no instructions of its own (as with the fallback, Codex sends an empty
    `instructions`)."""
    return {"slug": model, "display_name": model, "description": "a model of the AI gateway",
            "context_window": GATEWAY_CONTEXT_WINDOW, "shell_type": "shell_command",
            "apply_patch_tool_type": "freeform",
            "base_instructions": "", "supported_reasoning_levels": [], "visibility": "list", "supported_in_api": True,
            "priority": priority, "support_verbosity": False, "truncation_policy": {"mode": "tokens", "limit": 10000},
            "experimental_supported_tools": []}


def gateway_responses_base(base_url: str) -> str:
    """The base URL Codex needs for the gateway at `base_url`: `<BASE>/v1` (kept when it is there;
    secret-unavailable for a query or fragment: forwarder.gateway_base)."""
    return gateway_base(base_url) + "/v1"


def llm_config(environ: Mapping[str, str], secrets_dir: str | None = None,
               credentials_dir: str | None = None) -> LLMConfig | None:
    """What a Codex run gets to reach a model (registry.LLM_SOURCES): the AI gateway without a
    projection, else the projection's provider, `external` unless its base URL is the gateway's
    (one the projection names but cannot be used as is still a provider of its own); None with
    neither."""
    projection = Projection.locate(secrets_dir, credentials_dir)
    gateway = gateway_settings(environ)
    try:
        plan = plan_provider(projection, environ)
    except BackendFailure:
        return LLMConfig(LLM_SOURCE, EXTERNAL) if _is_projected(projection) else None
    if plan.source == "gateway" and gateway is not None:
        return gateway_config(gateway, LLM_SOURCE, plan.model)
    base_url = plan.base_url or (OPENAI_BASE_URL if plan.provider == BUILTIN_OPENAI else None)
    status = GATEWAY if gateway is not None and same_endpoint(base_url, gateway.base_url) else EXTERNAL
    return LLMConfig(LLM_SOURCE, status, base_url, plan.provider, plan.model, hide=plan.secret_values)


def _is_projected(projection: Projection) -> bool:
    try:
        raw_config, auth_json, env = _projected(projection)
    except BackendFailure:
        return True  # there, but not readable: projected all the same
    return raw_config is not None or auth_json is not None or bool(env)


def _check_required(plan: ProviderPlan, projection: Projection) -> None:
    """Every secret the selected provider needs must be in the projection, before spawn."""
    providers = plan.config.get("model_providers") or {}
    provider = providers.get(plan.provider)
    if provider is None:
        if plan.provider == "openai" and plan.auth_json is None and "OPENAI_API_KEY" not in plan.env:
            raise BackendFailure(SECRET_UNAVAILABLE, (
                f"the openai provider needs {projection.label}/auth.json or "
                f"{projection.label}/env/OPENAI_API_KEY; neither is there"))
        return
    if not isinstance(provider, dict):
        raise BackendFailure(BACKEND_FAILED, f"config.toml: model_providers.{plan.provider} is not a table")
    needed = [provider.get("env_key")] + list((provider.get("env_http_headers") or {}).values())
    for name in needed:
        if isinstance(name, str) and name and name not in plan.env:
            raise BackendFailure(SECRET_UNAVAILABLE, (
                f"provider {plan.provider!r} needs {name}, but {projection.label}/env/{name} is missing"))
    for name in needed:
        if isinstance(name, str) and name in plan.env and not plan.env[name]:
            raise BackendFailure(SECRET_UNAVAILABLE, f"{projection.label}/env/{name} is empty")
    auth = provider.get("auth")
    if isinstance(auth, dict):
        # A failing auth command is silent on the protocol (codex-notes 3b): check its files here.
        for arg in auth.get("args") or []:
            if isinstance(arg, str) and arg.startswith("/") and not os.access(arg, os.R_OK):
                raise BackendFailure(SECRET_UNAVAILABLE, f"provider {plan.provider!r} auth reads {arg}: not readable")


def _secretish_values(config: Any, key: str = "") -> list[str]:
    """String values under secret-looking keys (experimental_bearer_token, http_headers …)."""
    out = []
    if isinstance(config, dict):
        for k, v in config.items():
            if k in ("http_headers",) and isinstance(v, dict):
                out += [x for x in v.values() if isinstance(x, str)]
            else:
                out += _secretish_values(v, str(k))
    elif isinstance(config, list):
        for v in config:
            out += _secretish_values(v, key)
    elif isinstance(config, str) and _SECRETISH_KEY.search(key):
        out.append(config)
    return out


BEARER_ENV = "CODEX_PROVIDER_BEARER_TOKEN"  # config.toml's experimental_bearer_token, moved (below)
HEADER_ENV = "CODEX_PROVIDER_HEADER_{}"  # its http_headers' values, moved


def _credentials_to_environment(plan: ProviderPlan) -> None:
    """Keep the projection's credentials out of CODEX_HOME, which is bound into the sandbox
    where the agent's commands read it (issue 43 review F1): the selected provider's
    experimental_bearer_token and http_headers values, and an API-key-only auth.json of a
    custom provider (`requires_openai_auth`), reach Codex through its environment instead
    (`env_key`, `env_http_headers`), which shell_environment_policy keeps from the commands and
    whose /proc/PID/environ a command cannot read. An auth.json with a ChatGPT login (tokens
    Codex refreshes in it) or for the built-in openai provider stays a file: `plan.auth_json`,
    which backend_status and docs/backends.md say a command can read."""
    provider = (plan.config.get("model_providers") or {}).get(plan.provider)
    if isinstance(provider, dict):
        token = provider.pop("experimental_bearer_token", None)
        if isinstance(token, str) and token:
            plan.env[BEARER_ENV] = token
            provider["env_key"] = BEARER_ENV
        headers = provider.pop("http_headers", None)
        if isinstance(headers, dict):
            moved = provider.setdefault("env_http_headers", {})
            for number, (header, value) in enumerate(sorted(headers.items())):
                plan.env[HEADER_ENV.format(number)] = str(value)
                moved[header] = HEADER_ENV.format(number)
    key = _api_key_only(plan.auth_json)
    # a custom provider only: Codex's built-in one sent no key from its environment (measured,
    # Codex 0.169: no Authorization), and its table cannot be changed ("reserved")
    if key is not None and isinstance(provider, dict) and provider.get("requires_openai_auth"):
        provider.pop("requires_openai_auth")
        provider.setdefault("env_key", "OPENAI_API_KEY")
        plan.env.setdefault(str(provider["env_key"]), key)
        plan.auth_json = None


def _api_key_only(raw: bytes | None) -> str | None:
    """auth.json's OPENAI_API_KEY where it holds nothing else (no ChatGPT login's tokens)."""
    try:
        doc = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("OPENAI_API_KEY"), str) or not doc["OPENAI_API_KEY"]:
        return None
    return doc["OPENAI_API_KEY"] if all(v is None for k, v in doc.items() if k not in ("OPENAI_API_KEY", "auth_mode")) \
        else None


def _json_strings(raw: bytes) -> list[str]:
    """Every string value in auth.json (the whole file is sensitive)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return [raw.decode("utf-8", "replace").strip()]
    out = []
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            out.append(item)
    return out


# ---------------------------------------------------------------- enforced settings

def enforce(plan: ProviderPlan, *, network: bool, request_retries: int, stream_retries: int,
            stall_seconds: int = 0) -> dict[str, Any]:
    """The config Codex gets: the projection's, with the runtime's settings on top."""
    config = json.loads(json.dumps(plan.config, default=str))  # deep copy; dates become strings
    config.pop("profile", None)  # a profile could re-select another provider; the plan chose one
    config["model_provider"] = plan.provider
    if plan.model:
        config["model"] = plan.model
    config.setdefault("analytics", {})["enabled"] = False
    features = config.setdefault("features", {})
    for key in ("plugins", "remote_plugin", "apps", "tool_suggest", "unbounded_connection_retries"):
        features[key] = False
    sep = config.setdefault("shell_environment_policy", {})
    exclude = [x for x in sep.get("exclude") or [] if isinstance(x, str)]
    sep["exclude"] = sorted(set(exclude) | set(plan.env))
    sep.pop("set", None)  # `set` could hand a value straight to the agent's commands
    config.setdefault("sandbox_workspace_write", {})["network_access"] = bool(network)
    provider = (config.get("model_providers") or {}).get(plan.provider)
    if isinstance(provider, dict):
        provider["request_max_retries"] = _bounded(provider.get("request_max_retries"), request_retries)
        provider["stream_max_retries"] = _bounded(provider.get("stream_max_retries"), stream_retries)
        if stall_seconds:  # a stalled answer: Codex's own bound is 300 s, then retried (normalize.py)
            provider["stream_idle_timeout_ms"] = _bounded(provider.get("stream_idle_timeout_ms"),
                                                          stall_seconds * 1000)
    return config


def _bounded(value: Any, cap: int) -> int:
    return min(value, cap) if isinstance(value, int) and value >= 0 else cap


# Keys whose lines may appear in events (SPEC section 10: base URL, model and profile names).
SHOWN_KEYS = ("base_url", "model", "model_provider", "profile", "name")
_LINE_KEY = re.compile(r'^\s*"?([A-Za-z0-9_.-]+)"?\s*=')


def withheld_lines(*texts: str) -> list[str]:
    """Every line of the projected and the written config.toml that must never reach an event
    or a log: all but blank lines, table headers and the SHOWN_KEYS. Fed to the Redactor, so a
    config line echoed anywhere (a TOML error snippet on stderr, a warning) is masked whole."""
    lines = set()
    for text in texts:
        for line in (text or "").splitlines():
            stripped = line.strip()
            if not stripped or (stripped.startswith("[") and stripped.endswith("]")):
                continue
            found = _LINE_KEY.match(stripped)
            if found and found.group(1).split(".")[-1] in SHOWN_KEYS:
                continue
            lines.add(stripped)
    return sorted(lines)


def write_codex_home(home: Path, plan: ProviderPlan, config: dict[str, Any]) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    if plan.catalogue is not None:
        atomic_write_bytes(home / "models.json", json.dumps({"models": plan.catalogue}).encode(), mode=0o600)
        config = dict(config, model_catalog_json=str(home / "models.json"))
    atomic_write_bytes(home / "config.toml", dump_toml(config).encode("utf-8"), mode=0o600)
    if plan.auth_json is not None:
        atomic_write_bytes(home / "auth.json", plan.auth_json, mode=0o600)


# ---------------------------------------------------------------- TOML writer

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes are TOML basic-string escapes; JSON leaves DEL as it is, TOML refuses it.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dump_toml(doc: dict[str, Any], prefix: str = "") -> str:
    """TOML for a tomllib-shaped dict: scalars first, then one [table] per nested dict."""
    lines, tables = [], []
    for key, value in doc.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{_key(str(key))} = {_value(value)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in tables:
        name = f"{prefix}.{_key(str(key))}" if prefix else _key(str(key))
        out += f"\n[{name}]\n" + dump_toml(value, name)
    return out
