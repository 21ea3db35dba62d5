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
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caldera.backends import failures as fk
from caldera.host import jsonlimits

GATEWAY_PROVIDER = "clawmanager"
GATEWAY_NPM = "@ai-sdk/openai-compatible"
MAX_FILE_BYTES = 1024 * 1024
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_REF = re.compile(r"\{env:([^}]*)\}")
_SECRETISH_KEY = re.compile(r"(?i)(key|token|secret|password|passwd|bearer|credential|authorization|cookie)")
_SECRETISH_NAME = re.compile(r"(?i)(key|token|secret|password|passwd|credential|auth)")
# Provider entry keys kept; `api`, `env`, `id` could point OpenCode elsewhere than the forwarder.
_PROVIDER_KEYS = ("name", "npm", "models", "options", "whitelist", "blacklist")


class ModelRefused(Exception):
    """The run asks for a model this agent does not offer; str() is the sentence."""


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


# ---------------------------------------------------------------- the projection

@dataclass(frozen=True)
class Projection:
    root: Path | None
    flat: Path | None = None
    label: str = "secrets/opencode"

    @classmethod
    def locate(cls, secrets_dir: str | None, credentials_dir: str | None) -> Projection:
        if secrets_dir and Path(secrets_dir, "opencode").is_dir():
            return cls(Path(secrets_dir, "opencode"), label=f"{secrets_dir}/opencode")
        if credentials_dir:
            cred = Path(credentials_dir)
            if (cred / "opencode").is_dir():
                return cls(cred / "opencode", label="$CREDENTIALS_DIRECTORY/opencode")
            if cred.is_dir() and any(n.startswith("opencode_") for n in _listdir(cred)):
                return cls(None, flat=cred, label="$CREDENTIALS_DIRECTORY")
        return cls(None, label=f"{secrets_dir or 'secrets'}/opencode")

    def _path(self, name: str) -> Path | None:
        if self.root is not None:
            return self.root / name
        if self.flat is not None:
            return self.flat / ("opencode_" + name.replace("/", "_"))
        return None

    def read(self, name: str) -> bytes | None:
        """The file's bytes, None when absent; secret-unavailable when present but unreadable."""
        path = self._path(name)
        if path is None:
            return None
        try:
            with open(path, "rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise fk.BackendFailure(fk.SECRET_UNAVAILABLE,
                                    f"{self.label}/{name}: cannot read ({exc.strerror})") from None
        if len(data) > MAX_FILE_BYTES:
            raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, f"{self.label}/{name}: larger than 1 MiB")
        return data

    def env(self) -> dict[str, str]:
        """NAME -> value of every env/NAME file (trailing newline trimmed)."""
        if self.root is not None:
            names = [n for n in _listdir(self.root / "env", self.label + "/env") if ENV_NAME_RE.match(n)]
        elif self.flat is not None:
            names = [n[len("opencode_env_"):] for n in _listdir(self.flat, self.label)
                     if n.startswith("opencode_env_") and ENV_NAME_RE.match(n[len("opencode_env_"):])]
        else:
            names = []
        return {name: _env_value(self.read(f"env/{name}") or b"", f"{self.label}/env/{name}") for name in sorted(names)}


def _listdir(path: Path, label: str | None = None) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, f"{label or path}: cannot list ({exc.strerror})") from None


def _env_value(raw: bytes, label: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, f"{label}: not UTF-8") from None
    text = text.rstrip("\r\n")
    if "\0" in text:
        raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, f"{label}: holds a NUL byte")
    return text


# ---------------------------------------------------------------- the plan

def plan_server(environ: Mapping[str, str], secrets_dir: str | None, credentials_dir: str | None,
                requested_model: str | None = None) -> ServerSpec:
    """The server spec from the projection, else ClawManager's OPENCODE_CONFIG_CONTENT, else
    the gateway variables; secret-unavailable (before anything is spawned) when none is there
    or a value it names is missing."""
    projection = Projection.locate(secrets_dir, credentials_dir)
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
        return _with_catalogue(spec, environ, requested_model)
    return _from_gateway(environ, requested_model, projection.label)


def _parse(raw: bytes, label: str) -> dict[str, Any]:
    try:
        doc = jsonlimits.loads(raw, max_bytes=MAX_FILE_BYTES, what=label)
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
        if found is None:
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

def _gateway_values(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    base = environ.get("CLAWMANAGER_LLM_BASE_URL") or environ.get("OPENAI_BASE_URL") or None
    key = environ.get("CLAWMANAGER_LLM_API_KEY") or environ.get("OPENAI_API_KEY") or None
    return base, key


def _from_gateway(environ: Mapping[str, str], requested: str | None, projection_label: str) -> ServerSpec:
    base, key = _gateway_values(environ)
    if not (base and key):
        raise fk.BackendFailure(fk.SECRET_UNAVAILABLE, (
            f"no OpenCode provider configuration: {projection_label}/opencode.json is missing, "
            "OPENCODE_CONFIG_CONTENT is not set and no AI gateway (CLAWMANAGER_LLM_BASE_URL/"
            "CLAWMANAGER_LLM_API_KEY) is configured"))
    if not _is_http_url(base):
        raise fk.BackendFailure(fk.BACKEND_FAILED, "CLAWMANAGER_LLM_BASE_URL is not an http or https URL")
    provider = {"npm": GATEWAY_NPM, "name": "ClawManager AI gateway",
                "options": {"baseURL": base, "apiKey": key}, "models": {}}
    spec = ServerSpec(providers={GATEWAY_PROVIDER: provider}, default_model=f"{GATEWAY_PROVIDER}/auto",
                      source="gateway", label="the AI gateway variables", secrets=(key,))
    return _with_catalogue(spec, environ, requested)


def _with_catalogue(spec: ServerSpec, environ: Mapping[str, str], requested: str | None) -> ServerSpec:
    """The gateway's models declared to OpenCode (it refuses undeclared ones): the catalogue,
    the default model, and a requested one when there is no catalogue to check it against."""
    pid = spec.default_model.split("/", 1)[0]
    if pid not in spec.providers:
        raise fk.BackendFailure(fk.BACKEND_FAILED,
                                f"{spec.label}: model {spec.default_model} names no provider it defines")
    catalogue = gateway_catalogue(environ)
    default = gateway_model(environ, None) or spec.default_model.split("/", 1)[1]
    wanted = list(catalogue or []) + [default] + ([requested] if requested and catalogue is None else [])
    provider = dict(spec.providers[pid])
    models = dict(provider.get("models") or {})
    for model in wanted:
        models.setdefault(_model_id(model, pid), {})
    provider["models"] = models
    providers = dict(spec.providers, **{pid: provider})
    return ServerSpec(providers=providers, default_model=f"{pid}/{_model_id(default, pid)}", source=spec.source,
                      label=spec.label, secrets=spec.secrets, catalogue=tuple(catalogue) if catalogue else None)


def _model_id(model: str, provider: str) -> str:
    return model[len(provider) + 1:] if model.startswith(provider + "/") else model


# The model rule of the AI gateway (issue 34 adds the shared one to caldera/config.py; this
# is the OpenCode backend's copy until it is folded in).

def gateway_catalogue(environ: Mapping[str, str]) -> list[str] | None:
    """CLAWMANAGER_LLM_MODEL: the catalogue, a JSON list of model ids (SPEC section 10);
    None when unset. A value that is not JSON (no '[') is taken as a one-model catalogue."""
    raw = (environ.get("CLAWMANAGER_LLM_MODEL") or "").strip()
    if not raw:
        return None
    if not raw.startswith("["):
        return [raw]
    try:
        doc = jsonlimits.loads(raw, max_bytes=64 * 1024, what="CLAWMANAGER_LLM_MODEL")
    except ValueError as exc:
        raise fk.BackendFailure(fk.BACKEND_FAILED,
                                f"CLAWMANAGER_LLM_MODEL is not a JSON list of model ids: {exc}") from None
    if not isinstance(doc, list) or not all(isinstance(m, str) and m.strip() for m in doc):
        raise fk.BackendFailure(fk.BACKEND_FAILED, "CLAWMANAGER_LLM_MODEL is not a JSON list of model ids")
    return [m.strip() for m in doc] or None


def gateway_model(environ: Mapping[str, str], requested: str | None) -> str | None:
    """A run's model under the AI gateway: the payload's `model` when the catalogue lists it
    (or there is no catalogue), refused with a sentence naming the catalogue otherwise;
    without one, OPENAI_MODEL, else the catalogue's first; None when there is neither."""
    catalogue = gateway_catalogue(environ)
    if requested:
        if catalogue is not None and requested not in catalogue:
            raise ModelRefused(f"model {requested!r} is not in this agent's model catalogue "
                               f"(CLAWMANAGER_LLM_MODEL: {', '.join(catalogue)})")
        return requested
    default = (environ.get("OPENAI_MODEL") or "").strip()
    if default:
        return default
    return catalogue[0] if catalogue else None


def choose_model(spec: ServerSpec, environ: Mapping[str, str], requested: str | None) -> tuple[str, str]:
    """(provider id, model id) of a run. ModelRefused (a sentence) for a model this agent
    does not offer; the payload's model may be "provider/model" or a bare model id."""
    if spec.source == "projection":
        if not requested:
            pid, _, model = spec.default_model.partition("/")
        elif "/" in requested and requested.split("/", 1)[0] in spec.providers:
            pid, _, model = requested.partition("/")
        else:
            pid, model = spec.default_model.split("/", 1)[0], requested
        if pid not in spec.providers:
            raise ModelRefused(f"model {spec.default_model}: provider {pid!r} is not one caldera can route "
                               f"(it needs options.baseURL in {spec.label})")
        if model not in spec.models(pid):
            raise ModelRefused(f"model {model!r} is not among provider {pid!r}'s models in {spec.label} "
                               f"({', '.join(spec.models(pid)) or 'none'})")
        return pid, model
    pid = spec.default_model.split("/", 1)[0]
    bare = _model_id(requested, pid) if requested else None
    chosen = gateway_model(environ, bare) or spec.default_model.split("/", 1)[1]
    return pid, _model_id(chosen, pid)
