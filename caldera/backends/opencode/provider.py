"""Where an OpenCode run's provider comes from, and the run's model (SPEC section 10).

In this order:
1. the projection `secrets/opencode/` (or `$CREDENTIALS_DIRECTORY/opencode/`, or flat
   `opencode_opencode.json`, `opencode_env_NAME`): an `opencode.json` whose `{env:NAME}`
   references are the contents of `env/NAME`;
2. `OPENCODE_CONFIG_CONTENT` in the runtime's environment, as ClawManager injects it
   (its `{env:NAME}` references are the runtime's variables, e.g. CLAWMANAGER_LLM_API_KEY);
3. the AI gateway variables: a provider `clawmanager` (`@ai-sdk/openai-compatible`) on
   CLAWMANAGER_LLM_BASE_URL with CLAWMANAGER_LLM_API_KEY (OPENAI_* second), its models the
   catalogue CLAWMANAGER_LLM_MODEL.

Only the providers (with `options.baseURL`), `model` and `small_model` are taken from a
config: everything else OpenCode would act on (mcp, plugin, formatter, lsp, permission,
agent) is the runtime's. `{env:NAME}` is resolved here, never by OpenCode: the values stay
in this process (the forwarder adds them to requests), OpenCode sees placeholders.
"""
from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from caldera.backends import failures as fk
from caldera.backends.projection import ENV_NAME_RE, MAX_SECRET_FILE_BYTES, Projection
from caldera.backends.registry import Refused
from caldera.config import Gateway, gateway_from_env
from caldera.errors import Refused as ModelRefused
from caldera.host import jsonlimits
from caldera.protocol.llm import EXTERNAL, GATEWAY, LLMConfig, gateway_config, same_endpoint

PROFILE = "opencode"
LLM_SOURCE = "backend opencode"
GATEWAY_PROVIDER = "clawmanager"
GATEWAY_NPM = "@ai-sdk/openai-compatible"
_ENV_REF = re.compile(r"\{env:([^}]*)\}")
_SECRETISH_KEY = re.compile(r"(?i)(key|token|secret|password|passwd|bearer|credential|authorization|cookie)")
_SECRETISH_NAME = re.compile(r"(?i)(key|token|secret|password|passwd|credential|auth)")
# Provider entry keys kept; `api`, `env`, `id` could point OpenCode elsewhere than the forwarder.
_PROVIDER_KEYS = ("name", "npm", "models", "options", "whitelist", "blacklist")


@dataclass
class ServerSpec:
    """What an agent's OpenCode server is started with. `providers` hold the real values
    (base URLs, keys): the forwarder's; OpenCode gets `server.render_config`'s copy."""
    providers: dict[str, dict[str, Any]]
    default_model: str  # "provider/model"
    source: str  # "projection" | "opencode-config-content" | "gateway"
    label: str  # where it came from, for messages
    secrets: tuple[str, ...] = ()
    catalogue: tuple[str, ...] | None = None  # the gateway's model ids, when it has one
    fingerprint: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        doc = json.dumps([self.providers, self.default_model, self.source], sort_keys=True)
        self.fingerprint = hashlib.sha256(doc.encode()).hexdigest()

    def base_url(self, provider: str) -> str | None:
        return _shown_url(self.providers.get(provider, {}).get("options", {}).get("baseURL"))

    def models(self, provider: str) -> list[str]:
        return sorted((self.providers.get(provider, {}).get("models") or {}).keys())


# ---------------------------------------------------------------- the plan

def plan_server(environ: Mapping[str, str], secrets_dir: str | None, credentials_dir: str | None,
                requested_model: str | None = None) -> ServerSpec:
    """The server spec from the projection, else ClawManager's OPENCODE_CONFIG_CONTENT, else
    the gateway variables; secret-unavailable (before anything is spawned) when none is there
    or a value it names is missing."""
    projection = Projection.locate(secrets_dir, credentials_dir, backend=PROFILE)
    raw = projection.read("opencode.json")
    values = projection.env()
    if raw is not None or values:
        if raw is None:
            raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, f"{projection.label}/opencode.json is missing "
                                                           "(the projection has env/ files but no config)")
        doc = _parse(raw, f"{projection.label}/opencode.json")
        return _from_config(doc, lambda name: values.get(name), set(values.values()), "projection",
                            f"{projection.label}/opencode.json", f"{projection.label}/env/{{}}")
    content = environ.get("OPENCODE_CONFIG_CONTENT")
    if content:
        doc = _parse(content.encode("utf-8", "surrogatepass"), "OPENCODE_CONFIG_CONTENT")
        secret_names = {n for n in environ if _SECRETISH_NAME.search(n)}
        secrets = {environ[n] for n in secret_names if environ.get(n)}
        spec = _from_config(doc, lambda name: environ.get(name) or None, secrets, "opencode-config-content",
                            "OPENCODE_CONFIG_CONTENT", "the runtime's environment variable {}")
        return _with_catalogue(spec, Gateway(environ), requested_model)
    return _from_gateway(environ, requested_model, projection.label)


def _parse(raw: bytes, label: str) -> dict[str, Any]:
    try:
        doc = jsonlimits.loads(raw, max_bytes=MAX_SECRET_FILE_BYTES, what=label)
    except ValueError as exc:
        # The decoder's message names a line and column, never the content.
        raise fk.BackendFailure(fk.BACKEND_FAILED, f"{label} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise fk.BackendFailure(fk.BACKEND_FAILED, f"{label} is not a JSON object")
    return doc


def _from_config(doc: dict[str, Any], lookup: Any, secrets: set[str], source: str, label: str,
                 missing: str) -> ServerSpec:
    providers_in = doc.get("provider")
    if not isinstance(providers_in, dict) or not providers_in:
        raise fk.BackendFailure(fk.BACKEND_FAILED, f"{label} defines no provider")
    providers: dict[str, dict[str, Any]] = {}
    for pid, entry in providers_in.items():
        if not isinstance(entry, dict):
            raise fk.BackendFailure(fk.BACKEND_FAILED, f"{label}: provider.{pid} is not an object")
        resolved = _resolve(entry, lookup, label, missing, secrets)
        kept = {k: resolved[k] for k in _PROVIDER_KEYS if k in resolved}
        options = kept.get("options")
        if not isinstance(options, dict) or not _is_http_url(options.get("baseURL")):
            continue  # not routable through the forwarder: OpenCode does not get it (see _check_model)
        secrets.update(_secretish_values(kept))
        providers[pid] = kept
    if not providers:
        raise fk.BackendFailure(fk.BACKEND_FAILED, (
            f"{label}: no provider has options.baseURL (an http or https URL): caldera sends "
            "OpenCode's requests through its own loopback forwarder, which needs the provider's URL"))
    default = doc.get("model") if isinstance(doc.get("model"), str) else None
    if default is None or "/" not in default:
        pid = next(iter(providers))
        first = next(iter(sorted((providers[pid].get("models") or {}).keys())), None)
        default = f"{pid}/{first}" if first else None
    if default is None:
        raise fk.BackendFailure(fk.BACKEND_FAILED, f"{label} names no model (set model: \"provider/model\")")
    return ServerSpec(providers=providers, default_model=default, source=source, label=label,
                      secrets=tuple(sorted(s for s in secrets if s)))


def _resolve(value: Any, lookup: Any, label: str, missing: str, secrets: set[str]) -> Any:
    """`{env:NAME}` replaced by its value everywhere in `value` (OpenCode's syntax);
    `{file:…}` refused (the projection has no files beside the config)."""
    if isinstance(value, dict):
        return {k: _resolve(v, lookup, label, missing, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, lookup, label, missing, secrets) for v in value]
    if not isinstance(value, str):
        return value
    if "{file:" in value:
        raise fk.BackendFailure(fk.BACKEND_FAILED, f"{label}: {{file:…}} references are not supported here; "
                                                   "use {env:NAME} with an env/NAME file")

    def sub(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        found = lookup(name) if ENV_NAME_RE.match(name) else None
        if not found:  # an empty env/NAME (the shipped example's, before the key is put in) too
            raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, (
                f"{label} references {{env:{name}}}, but {missing.format(name)} is missing or empty"))
        return str(found)

    return _ENV_REF.sub(sub, value)


def _secretish_values(entry: Any, key: str = "") -> list[str]:
    """Strings under secret-looking keys and every header value of a provider entry."""
    out: list[str] = []
    if isinstance(entry, dict):
        for k, v in entry.items():
            if k == "headers" and isinstance(v, dict):
                out += [x for x in v.values() if isinstance(x, str)]
            else:
                out += _secretish_values(v, str(k))
    elif isinstance(entry, list):
        for v in entry:
            out += _secretish_values(v, key)
    elif isinstance(entry, str) and _SECRETISH_KEY.search(key) and entry:
        out.append(entry)
    return out


def _is_http_url(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    parsed = urllib.parse.urlsplit(value)
    return parsed.scheme in ("http", "https") and bool(parsed.hostname)


def _shown_url(value: Any) -> str | None:
    """A base URL as it may be shown: no userinfo, no query (SPEC section 10)."""
    if not isinstance(value, str):
        return None
    parsed = urllib.parse.urlsplit(value)
    host = parsed.hostname or ""
    if parsed.port:
        host = f"{host}:{parsed.port}"
    return urllib.parse.urlunsplit((parsed.scheme, host, parsed.path, "", ""))


# ---------------------------------------------------------------- the AI gateway

def _from_gateway(environ: Mapping[str, str], requested: str | None, projection_label: str) -> ServerSpec:
    gateway = gateway_from_env(environ)
    if gateway is None or gateway.base_url is None or gateway.api_key is None:
        raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, (
            f"no OpenCode provider configuration: {projection_label}/opencode.json is missing, "
            "OPENCODE_CONFIG_CONTENT is not set and no AI gateway (CLAWMANAGER_LLM_BASE_URL/"
            "CLAWMANAGER_LLM_API_KEY) is configured"))
    if not _is_http_url(gateway.base_url):
        raise fk.BackendFailure(fk.BACKEND_FAILED, "CLAWMANAGER_LLM_BASE_URL is not an http or https URL")
    provider = {"npm": GATEWAY_NPM, "name": "ClawManager AI gateway",
                "options": {"baseURL": gateway.base_url, "apiKey": gateway.api_key}, "models": {}}
    spec = ServerSpec(providers={GATEWAY_PROVIDER: provider}, default_model=f"{GATEWAY_PROVIDER}/auto",
                      source="gateway", label="the AI gateway variables", secrets=(gateway.api_key,))
    return _with_catalogue(spec, gateway, requested)


def _with_catalogue(spec: ServerSpec, gateway: Gateway, requested: str | None) -> ServerSpec:
    """The gateway's models declared to OpenCode (it refuses undeclared ones): the catalogue,
    the default model, and a requested one when there is no catalogue to check it against
    (config.Gateway's rule: a catalogue that is not a JSON list is ignored)."""
    pid = spec.default_model.split("/", 1)[0]
    if pid not in spec.providers:
        raise fk.BackendFailure(fk.BACKEND_FAILED,
                                f"{spec.label}: model {spec.default_model} names no provider it defines")
    catalogue = gateway.catalogue
    default = gateway.model_for() or spec.default_model.split("/", 1)[1]
    wanted = list(catalogue or []) + [default] + ([requested] if requested and catalogue is None else [])
    provider = dict(spec.providers[pid])
    models = dict(provider.get("models") or {})
    for model in wanted:
        models.setdefault(_model_id(model, pid), {})
    provider["models"] = models
    providers = dict(spec.providers, **{pid: provider})
    return ServerSpec(providers=providers, default_model=f"{pid}/{_model_id(default, pid)}", source=spec.source,
                      label=spec.label, secrets=spec.secrets, catalogue=catalogue)


def _model_id(model: str, provider: str) -> str:
    return model[len(provider) + 1:] if model.startswith(provider + "/") else model


def choose_model(spec: ServerSpec, environ: Mapping[str, str], requested: str | None) -> tuple[str, str]:
    """(provider id, model id) of a run. Refused (a sentence: the run ends `blocked`) for a
    model this agent does not offer; the payload's model may be "provider/model" or a bare
    model id. Under the gateway, config.Gateway's rule (errors.Refused naming the catalogue), a
    "provider/model" of CLAWMANAGER_LLM_PROVIDER_MODELS on that provider where the config
    defines it with the model (ClawManager's OPENCODE_CONFIG_CONTENT: one provider per id)."""
    if spec.source == "projection":
        if not requested:
            pid, _, model = spec.default_model.partition("/")
        elif "/" in requested and requested.split("/", 1)[0] in spec.providers:
            pid, _, model = requested.partition("/")
        else:
            pid, model = spec.default_model.split("/", 1)[0], requested
        if pid not in spec.providers:
            raise Refused(f"model {spec.default_model}: provider {pid!r} is not one caldera can route "
                               f"(it needs options.baseURL in {spec.label})")
        if model not in spec.models(pid):
            raise Refused(f"model {model!r} is not among provider {pid!r}'s models in {spec.label} "
                               f"({', '.join(spec.models(pid)) or 'none'})")
        return pid, model
    pid = spec.default_model.split("/", 1)[0]
    bare = _model_id(requested, pid) if requested else None
    provider, chosen = Gateway(environ).model_ref(bare)
    model = _model_id(chosen or spec.default_model.split("/", 1)[1], pid)
    if provider in spec.providers and model in spec.models(provider):
        return provider, model  # CLAWMANAGER_LLM_PROVIDER_MODELS's provider, as the server's config has it
    return pid, model


# ---------------------------------------------------------------- the state report

def llm_config(environ: Mapping[str, str], secrets_dir: str | None = None,
               credentials_dir: str | None = None) -> LLMConfig | None:
    """What an OpenCode run gets to reach a model (registry.LLM_SOURCES): `gateway` when it is
    the platform's AI gateway (the gateway variables; ClawManager's OPENCODE_CONFIG_CONTENT or a
    projection whose provider's base URL is the gateway's), `external` for a provider of its own
    (one the projection names but that cannot be used is one all the same); None with neither.
    Never a key: the base URL without credentials, the config's secrets hidden from it."""
    gateway = gateway_from_env(environ)
    projection = Projection.locate(secrets_dir, credentials_dir, backend=PROFILE)
    try:
        spec = plan_server(environ, secrets_dir, credentials_dir)
        provider, model = choose_model(spec, environ, None)
    except (fk.BackendFailure, Refused, ModelRefused):
        if _is_projected(projection):
            return LLMConfig(LLM_SOURCE, EXTERNAL)
        return gateway_config(gateway, LLM_SOURCE) if gateway is not None else None
    if spec.source == "gateway" and gateway is not None:
        return gateway_config(gateway, LLM_SOURCE, model)
    base_url = spec.providers[provider].get("options", {}).get("baseURL")
    status = GATEWAY if gateway is not None and same_endpoint(base_url, gateway.base_url) else EXTERNAL
    return LLMConfig(LLM_SOURCE, status, base_url, provider, model, hide=spec.secrets)


def _is_projected(projection: Projection) -> bool:
    try:
        return projection.read("opencode.json") is not None or bool(projection.env_names())
    except fk.BackendFailure:
        return True  # there, but not readable: projected all the same
