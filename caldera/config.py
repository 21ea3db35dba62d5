"""Which agent, where its files are, and its settings (SPEC sections 2 and 3).

Settings are read from the process environment, then `agent.env`, then
`secrets.env` (later wins), the same files systemd's EnvironmentFile= reads.
Every CALDERA_* variable also answers to its ClawManager name; when both are
set the CALDERA_* one wins. A bad value is a ConfigError naming the variable.
"""
from __future__ import annotations

import io
import os
import re
import stat
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, MutableMapping
    from typing import Any

    Environ = Mapping[str, str]

MANIFEST_NAME = "caldera.agent.yaml"
STATE_SUBDIR_IN_INSTANCE = "caldera-agent"
# A --manifest agent's state without --state-dir: <the manifest's dir>/.caldera-state/NAME, the
# same wherever the command is typed (docs/runtime.md, "A --manifest agent's state").
STATE_BESIDE_MANIFEST = ".caldera-state"

# CALDERA name -> ClawManager alias (None: no alias)
ALIASES = {
    "CALDERA_AGENT_ENABLED": "CLAWMANAGER_AGENT_ENABLED",
    "CALDERA_BASE_URL": "CLAWMANAGER_AGENT_BASE_URL",
    "CALDERA_TOKEN": "CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN",
    "CALDERA_INSTANCE_ID": "CLAWMANAGER_AGENT_INSTANCE_ID",
    "CALDERA_PROTOCOL_VERSION": "CLAWMANAGER_AGENT_PROTOCOL_VERSION",
    "CALDERA_PERSISTENT_DIR": "CLAWMANAGER_AGENT_PERSISTENT_DIR",
    "CALDERA_DISK_LIMIT_BYTES": "CLAWMANAGER_AGENT_DISK_LIMIT_BYTES",
    "CALDERA_RUNTIME_TYPE": None,  # the platform's CLAWMANAGER_AGENT_RUNTIME_TYPE comes first: runtime_type_of
    "CALDERA_AGENT_ID": "CLAWMANAGER_AGENT_ID",
    "CALDERA_SKILL_DIRS": "CLAWMANAGER_AGENT_SKILL_DIRS",
    "CALDERA_CA_BUNDLE": None,
    "CALDERA_LOG_LEVEL": None,
    "CALDERA_REPORT_INTERVAL_SECONDS": None,
}
ALLOW_PLAIN_HTTP = "CALDERA_ALLOW_PLAIN_HTTP"  # SPEC section 3: the operator's plain-http consent
INJECTED_SECRETS = ("CLAWMANAGER_LLM_API_KEY", "OPENAI_API_KEY", "CLAWMANAGER_INSTANCE_TOKEN")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Patterns as strings: `re` compiles (and caches) them on first use, so a quick
# verb that never reads an env file does not pay for compiling them at import.
_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_RUNTIME_TYPE_RE = r"^[a-z0-9][a-z0-9_-]{0,31}$"
# An agent id: what the server stores trimmed (VARCHAR(255)) and compares untrimmed on start.
_AGENT_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
AGENT_ID_MAX = 255
# ClawManager's CLAWMANAGER_RUNTIME_TYPE: where the instance is placed, never what runs in it.
RUNTIME_MARKERS = ("desktop", "gateway", "shell")
# The skill dirs of ClawManager's runtime images, as their own agent scans them when neither
# CALDERA_SKILL_DIRS nor CLAWMANAGER_AGENT_SKILL_DIRS is set (AgentsRuntime, instanceagent
# runtimeDefaults; docs/container.md). The others (openclaw, deepseek-harness) name none.
RUNTIME_SKILL_DIRS = {
    "hermes": ("/config/hermes/skills", "/config/.hermes/skills"),
    "codex": ("/config/.codex/skills",),
    "claude-code": ("/config/.claude/skills",),
    "opencode": ("/config/.opencode/skills",),
}
FOREIGN_ENV_LIMIT = 64 * 1024  # bytes of another agent's agent.env read at most
_ENV_LINE_RE = r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$"


class AgentPaths:
    """Where one agent's files are. (Plain classes, not dataclasses: `dataclasses`
    imports `inspect`, which a person typing `caldera pause` should not wait for;
    docs/performance.md, section 1.)"""

    __slots__ = ("name", "config_dir", "manifest_path", "state_dir")

    def __init__(self, name: str, config_dir: Path, manifest_path: Path, state_dir: Path) -> None:
        self.name = name
        self.config_dir = config_dir  # holds the manifest, agent.env, secrets.env, secrets/
        self.manifest_path = manifest_path
        self.state_dir = state_dir

    def _key(self) -> tuple[str, Path, Path, Path]:
        return self.name, self.config_dir, self.manifest_path, self.state_dir

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AgentPaths) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"AgentPaths(name={self.name!r}, config_dir={str(self.config_dir)!r}, state_dir={str(self.state_dir)!r})"

    @property
    def agent_env(self) -> Path:
        return self.config_dir / "agent.env"

    @property
    def secrets_env(self) -> Path:
        return self.config_dir / "secrets.env"

    @property
    def secrets_dir(self) -> Path:
        return self.config_dir / "secrets"


class Settings:
    """The agent's validated settings (SPEC section 3), read-only; `env` is the merged
    KEY=VALUEs and `secret_values` every value the Redactor must mask. Its repr shows no
    value of either. (A plain class for AgentPaths' reason.)"""

    FIELDS = ("enabled", "base_url", "bootstrap_token", "instance_id", "protocol_version", "persistent_dir",
              "disk_limit_bytes", "runtime_type", "ca_bundle", "log_level", "report_interval", "env",
              "secret_values", "agent_id_given", "injected")
    __slots__ = FIELDS
    enabled: bool
    base_url: str | None
    bootstrap_token: str | None
    instance_id: int | None
    protocol_version: str
    persistent_dir: Path
    disk_limit_bytes: int | None
    runtime_type: str
    ca_bundle: str | None
    log_level: str
    report_interval: float
    env: dict[str, str]
    secret_values: tuple[str, ...]
    agent_id_given: str | None  # CALDERA_AGENT_ID / CLAWMANAGER_AGENT_ID, checked
    injected: dict[str, str]  # PLATFORM_INJECTED as the platform injected them (injected_values)

    def __init__(self, *, enabled: bool, base_url: str | None, bootstrap_token: str | None,
                 instance_id: int | None, protocol_version: str, persistent_dir: Path,
                 disk_limit_bytes: int | None, runtime_type: str, ca_bundle: str | None, log_level: str,
                 report_interval: float, env: dict[str, str] | None = None,
                 secret_values: tuple[str, ...] = (), agent_id_given: str | None = None,
                 injected: dict[str, str] | None = None) -> None:
        given = (enabled, base_url, bootstrap_token, instance_id, protocol_version, persistent_dir,
                 disk_limit_bytes, runtime_type, ca_bundle, log_level, report_interval,
                 {} if env is None else env, secret_values, agent_id_given, {} if injected is None else injected)
        for key, value in zip(self.FIELDS, given, strict=True):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("Settings are read-only")

    def __repr__(self) -> str:
        shown = ("enabled", "base_url", "instance_id", "runtime_type", "log_level")
        return "Settings(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in shown) + ", ...)"

    @property
    def agent_id(self) -> str:
        """The one given (CALDERA_AGENT_ID, CLAWMANAGER_AGENT_ID), else `<runtime_type>-<instance>-main`."""
        return self.agent_id_given or f"{self.runtime_type}-{self.instance_id}-main"

    @property
    def plain_http_host(self) -> str | None:
        """The control plane's host when it is reached over plain http across a network (named
        once at start), else None: https, or a loopback host (nothing leaves this machine)."""
        if not self.base_url:
            return None
        parts = urllib.parse.urlsplit(self.base_url)
        host = parts.hostname or ""
        return host if parts.scheme == "http" and not is_loopback(host) else None


# ---------------------------------------------------------------- paths

def valid_agent_name(name: str) -> bool:
    return bool(re.match(_NAME_RE, name))


def config_root(environ: Environ = os.environ) -> Path:
    return Path(environ.get("CALDERA_CONFIG_DIR") or "/etc/caldera")


def state_root(environ: Environ = os.environ) -> Path:
    return Path(environ.get("CALDERA_STATE_DIR") or "/var/lib/caldera")


def installed_agents(environ: Environ = os.environ) -> list[str]:
    agents = config_root(environ) / "agents"
    try:
        return sorted(p.name for p in agents.iterdir() if (p / MANIFEST_NAME).is_file())
    except FileNotFoundError:
        return []


def agent_from_args(args: object, environ: Environ = os.environ) -> AgentPaths:
    """The agent a command acts on: --manifest, --agent, CALDERA_AGENT, or the only one installed.
    `args`: the command's arguments; `agent`, `manifest` and `state_dir` are read where present."""
    manifest: str | None = getattr(args, "manifest", None)
    state_dir: str | None = getattr(args, "state_dir", None)
    if manifest:
        path = manifest_file(manifest)
        name = manifest_name(path)
        state = Path(state_dir).resolve() if state_dir else path.parent / STATE_BESIDE_MANIFEST / name
        return AgentPaths(name, path.parent, path, state)
    name = _installed_name(getattr(args, "agent", None) or selected_agent(environ), environ)
    config_dir = config_root(environ) / "agents" / name
    instance_dir = persistent_dir(environ)  # inside a ClawManager instance the platform injects it
    if state_dir:
        state = Path(state_dir).resolve()
    elif not environ.get("CALDERA_STATE_DIR") and instance_dir:
        state = Path(instance_dir) / STATE_SUBDIR_IN_INSTANCE
    else:
        state = state_root(environ) / name
    return AgentPaths(name, config_dir, config_dir / MANIFEST_NAME, state)


def state_left_here(paths: AgentPaths) -> Path | None:
    """A --manifest agent's state that a caldera before STATE_BESIDE_MANIFEST kept under the
    directory the command was typed in (./.caldera-state/NAME), when this command uses the
    default beside the manifest and that one holds a state.json: said by status and at start,
    never moved (a daemon may run on it)."""
    default = paths.manifest_path.parent / STATE_BESIDE_MANIFEST / paths.name
    try:
        old = Path.cwd() / STATE_BESIDE_MANIFEST / paths.name
    except OSError:  # no current directory
        return None
    return old if paths.state_dir == default != old and (old / "state.json").is_file() else None


def manifest_file(given: str) -> Path:
    """--manifest's file: the path given, or the caldera.agent.yaml in the directory given."""
    path = Path(given).resolve()
    if path.is_dir():
        if not (path / MANIFEST_NAME).is_file():
            raise ConfigError(f"--manifest {given}: a directory without {MANIFEST_NAME} (name the manifest "
                              "file, or the directory that holds it)")
        return path / MANIFEST_NAME
    if not path.is_file():
        raise ConfigError(f"--manifest {given}: no such file or directory (a manifest file, or the directory "
                          f"that holds its {MANIFEST_NAME})")
    return path


def _installed_name(name: str | None, environ: Environ) -> str:
    """The installed agent named (else the only one installed); ConfigError otherwise."""
    if not name:
        found = installed_agents(environ)
        if len(found) != 1:
            where = config_root(environ) / "agents"
            listing = ", ".join(found) if found else "none"
            hint = _elsewhere(environ) if not found else ""
            raise ConfigError(f"pick an agent with --agent NAME (installed in {where}: {listing}){hint}")
        name = found[0]
    if not re.match(_NAME_RE, name):
        raise ConfigError(f"agent name {name!r}: use letters, digits, '.', '_' or '-'")
    if not (config_root(environ) / "agents" / name / MANIFEST_NAME).is_file():
        listing = ", ".join(installed_agents(environ)) or "none"
        raise ConfigError(f"no agent {name!r} is installed in {config_root(environ) / 'agents'} (installed there: "
                          f"{listing}){_elsewhere(environ)}")
    return name


def _elsewhere(environ: Environ) -> str:
    """Where else an agent may be: one installed with CALDERA_CONFIG_DIR is found only with it."""
    if environ.get("CALDERA_CONFIG_DIR"):
        return ""
    return "; one installed with CALDERA_CONFIG_DIR set is found with the same CALDERA_CONFIG_DIR"


def state_in_persistent_dir(environ: Environ = os.environ) -> bool:
    """An installed agent's state lives in the instance's persistent dir (a ClawManager
    instance: the persistent dir is set, CALDERA_STATE_DIR is not): agent_from_args' rule."""
    return not environ.get("CALDERA_STATE_DIR") and persistent_dir(environ) is not None


# ---------------------------------------------------------------- single variables
# Every other module reads a CALDERA_*/CLAWMANAGER_* variable through one of these, so
# that a variable's name, alias and default live here. `environ` is the process
# environment unless a caller passes the agent's merged settings (`Settings.env`).

def selected_agent(environ: Environ = os.environ) -> str | None:
    """CALDERA_AGENT: the agent a command acts on when no --agent/--manifest is given."""
    return environ.get("CALDERA_AGENT") or None


def persistent_dir(environ: Environ = os.environ) -> str | None:
    """CALDERA_PERSISTENT_DIR, else ClawManager's CLAWMANAGER_AGENT_PERSISTENT_DIR."""
    return environ.get("CALDERA_PERSISTENT_DIR") or environ.get("CLAWMANAGER_AGENT_PERSISTENT_DIR") or None


def runtime_type_of(environ: Environ = os.environ) -> tuple[str, str | None]:
    """(the runtime's name, the variable it came from; None for the default "caldera"), unchecked.

    ClawManager's own CLAWMANAGER_AGENT_RUNTIME_TYPE first (the platform names what the instance
    runs; one of the placement markers there is passed over, as ClawManager's own agent does),
    then CALDERA_RUNTIME_TYPE (the image's or operator's), then "caldera". CLAWMANAGER_RUNTIME_TYPE
    is never read: it says where the instance is placed (desktop, gateway, shell), not what runs."""
    platform = (environ.get("CLAWMANAGER_AGENT_RUNTIME_TYPE") or "").strip().lower()
    if platform and platform not in RUNTIME_MARKERS:
        return platform, "CLAWMANAGER_AGENT_RUNTIME_TYPE"
    own = (environ.get("CALDERA_RUNTIME_TYPE") or "").strip()
    if own:
        return own, "CALDERA_RUNTIME_TYPE"
    return "caldera", None


def runtime_type_name(environ: Environ = os.environ) -> str:
    """runtime_type_of's name, unchecked (`caldera sample` labels only)."""
    return runtime_type_of(environ)[0]


def in_instance(environ: Environ = os.environ) -> bool:
    """Inside a ClawManager instance: the platform's persistent dir is set (under either name)."""
    return persistent_dir(environ) is not None


def schema_dir_override(environ: Environ = os.environ) -> Path | None:
    """CALDERA_SCHEMA_DIR: a schemas directory that wins over the installed ones."""
    raw = environ.get("CALDERA_SCHEMA_DIR")
    return Path(raw) if raw else None


def plane_db_path(environ: Environ = os.environ, euid: int | None = None, home: Path | None = None) -> Path:
    """The plane's database: CALDERA_PLANE_DB, else <CALDERA_STATE_DIR>/plane/plane.db, else
    /var/lib/caldera/plane/plane.db for root, ~/.local/state/caldera/plane/plane.db for anyone else."""
    if environ.get("CALDERA_PLANE_DB"):
        return Path(environ["CALDERA_PLANE_DB"])
    if environ.get("CALDERA_STATE_DIR"):
        return Path(environ["CALDERA_STATE_DIR"]) / "plane" / "plane.db"
    if (os.geteuid() if euid is None else euid) == 0:
        return Path("/var/lib/caldera/plane/plane.db")
    return (Path.home() if home is None else home) / ".local" / "state" / "caldera" / "plane" / "plane.db"


# The old daemon's signal pipe across a restart in place: "<fd>:<inode>" (caldera.daemon.signals).
SIGNAL_HANDOVER_VAR = "CALDERA_SIGNAL_HANDOVER"


def take_signal_handover(environ: MutableMapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(fd, inode) of the pipe a restarted daemon inherits, taken out of the environment
    so that no child sees it; None when there is none (or the value is not one)."""
    fd, _, inode = (environ.pop(SIGNAL_HANDOVER_VAR, None) or "").partition(":")
    return (int(fd), int(inode)) if fd.isdigit() and inode.isdigit() else None


def codex_binary(environ: Environ = os.environ) -> str | None:
    """CALDERA_CODEX_BIN: the Codex binary to run instead of `codex` on PATH."""
    return environ.get("CALDERA_CODEX_BIN") or None


def codex_retries(environ: Environ, request_default: int, stream_default: int) -> tuple[int, int]:
    """(CALDERA_CODEX_REQUEST_MAX_RETRIES, CALDERA_CODEX_STREAM_MAX_RETRIES), each a whole
    number >= 0 or its default when unset; ConfigError naming the variable otherwise."""
    return (_count(environ, "CALDERA_CODEX_REQUEST_MAX_RETRIES", request_default),
            _count(environ, "CALDERA_CODEX_STREAM_MAX_RETRIES", stream_default))


def claude_code_binary(environ: Environ = os.environ) -> str | None:
    """CALDERA_CLAUDE_CODE_BIN: the Claude Code binary to run instead of `claude` on PATH."""
    return environ.get("CALDERA_CLAUDE_CODE_BIN") or None


def claude_code_retries(environ: Environ, default: int) -> int:
    """CALDERA_CLAUDE_CODE_MAX_RETRIES (Claude Code's CLAUDE_CODE_MAX_RETRIES for a run): a
    whole number >= 0, its default when unset; ConfigError naming the variable otherwise."""
    return _count(environ, "CALDERA_CLAUDE_CODE_MAX_RETRIES", default)


def opencode_binary(environ: Environ = os.environ) -> str | None:
    """CALDERA_OPENCODE_BIN: the OpenCode binary to run instead of `opencode` on PATH."""
    return environ.get("CALDERA_OPENCODE_BIN") or None


def opencode_settings(environ: Environ, *, retries: int, idle_seconds: int) -> tuple[int, int]:
    """(CALDERA_OPENCODE_MAX_RETRIES, CALDERA_OPENCODE_IDLE_SECONDS): the provider retries a
    turn lets OpenCode make before it is aborted, and how long an agent's idle OpenCode
    server is kept; whole numbers >= 0, the defaults when unset; ConfigError otherwise."""
    return (_count(environ, "CALDERA_OPENCODE_MAX_RETRIES", retries),
            _count(environ, "CALDERA_OPENCODE_IDLE_SECONDS", idle_seconds))


PROVIDER_STALL_SECONDS = 60  # default: a minute of silence fits a turn's end within 90 s (docs/backends.md)


def provider_stall_seconds(environ: Environ) -> int:
    """CALDERA_PROVIDER_STALL_SECONDS: how long a provider may say nothing within an answer
    (not a byte since the request, or since its last one) before the turn ends, every
    backend; 0 leaves it to the CLI's own bound. A whole number >= 0, 60 when unset;
    ConfigError naming the variable otherwise."""
    return _count(environ, "CALDERA_PROVIDER_STALL_SECONDS", PROVIDER_STALL_SECONDS)


def _count(environ: Environ, name: str, default: int) -> int:
    raw = environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not an integer") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r}: must be 0 or more")
    return value


# ---------------------------------------------------------------- the AI gateway (SPEC section 10)
# As ClawManager's server injects it (buildGatewayEnv): the base URL and key under its own names
# and the OPENAI_* aliases, CLAWMANAGER_LLM_MODEL the catalogue (a JSON list of model ids, never
# a model name), OPENAI_MODEL the default model, CLAWMANAGER_LLM_PROVIDER `openai-compatible`.
GATEWAY_BASE_URL = ("CLAWMANAGER_LLM_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_BASE")
GATEWAY_API_KEY = ("CLAWMANAGER_LLM_API_KEY", "OPENAI_API_KEY")
GATEWAY_CATALOGUE, GATEWAY_DEFAULT_MODEL, GATEWAY_PROVIDER = "CLAWMANAGER_LLM_MODEL", "OPENAI_MODEL", \
    "CLAWMANAGER_LLM_PROVIDER"
# ClawManager PR #193: the same catalogue qualified by each model's provider, a JSON list of
# "provider/model" whose first is "auto/auto" (an entry without "/" is the server's "auto/<it>").
GATEWAY_PROVIDER_MODELS = "CLAWMANAGER_LLM_PROVIDER_MODELS"
# What the LLM-governance status trusts only as the platform injected it: the gateway's base URL
# under each of its names, and the control plane's (the gateway's host); injected_values.
PLATFORM_INJECTED = (*GATEWAY_BASE_URL, "CLAWMANAGER_AGENT_BASE_URL")
CATALOGUE_MAX_BYTES = 64 * 1024  # the server caps what it injects at 64 KiB
CATALOGUE_NAMED = 20  # a refusal names this many of the catalogue's models
MODEL_NAMED_CHARS = 64  # and each at most this long (a model id is not bounded by the platform)


def _first(environ: Environ, names: Iterable[str]) -> str | None:
    return next((environ[n] for n in names if environ.get(n)), None)


def gateway_catalogue(raw: str | None, name: str = GATEWAY_CATALOGUE) -> tuple[tuple[str, ...] | None, str | None]:
    """(the catalogue's model ids, None) from CLAWMANAGER_LLM_MODEL's value (`name`'s: the same
    reading for CLAWMANAGER_LLM_PROVIDER_MODELS); (None, a sentence) when it is not a JSON list of
    model names (it is then ignored); (None, None) when unset."""
    if raw is None or not raw.strip():
        return None, None
    if len(raw) > CATALOGUE_MAX_BYTES:
        return None, f"{name} is over {CATALOGUE_MAX_BYTES // 1024} KiB"
    import json  # here: only a gateway's reader needs it

    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None, f"{name} is not JSON (the platform sends a JSON list of model ids)"
    if not isinstance(doc, list) or not doc:
        kinds = {"dict": "object", "str": "string", "int": "number", "float": "number", "bool": "boolean"}
        what = "an empty list" if doc == [] else f"a JSON {kinds.get(type(doc).__name__, 'null')}"
        return None, f"{name} is {what}, not a JSON list of model ids"
    bad = next((i for i, item in enumerate(doc) if not isinstance(item, str) or not item.strip()), None)
    if bad is not None:
        return None, f"{name}: item {bad + 1} is not a model id (a non-empty string)"
    return tuple(item.strip() for item in doc), None


def provider_models(raw: str | None) -> tuple[tuple[tuple[str, str], ...] | None, str | None]:
    """((provider, model) pairs, None) from CLAWMANAGER_LLM_PROVIDER_MODELS, read as the server
    reads what it writes (parseProviderModelRefs): split at the first "/", an entry with no
    provider or no model is ("auto", the entry), duplicates dropped; (None, a sentence) when it is
    not a JSON list of strings; (None, None) when unset."""
    refs, problem = gateway_catalogue(raw, GATEWAY_PROVIDER_MODELS)
    if refs is None:
        return None, problem
    pairs: list[tuple[str, str]] = []
    for ref in refs:
        provider, _, model = (part.strip() for part in ref.partition("/"))
        pair = (provider, model) if provider and model else ("auto", ref)
        if pair not in pairs:
            pairs.append(pair)
    return tuple(pairs), None


class Gateway:
    """ClawManager's AI gateway as the platform injects it (a plain class for AgentPaths' reason).
    `catalogue` is None when CLAWMANAGER_LLM_MODEL is unset or not a JSON list of model ids
    (`problem` then says which, for the one warning at start). Its repr shows no key."""

    __slots__ = ("base_url", "api_key", "provider", "default_model", "catalogue", "problem", "provider_models",
                 "qualified_problem")

    def __init__(self, environ: Environ) -> None:
        self.base_url = _first(environ, GATEWAY_BASE_URL)
        self.api_key = _first(environ, GATEWAY_API_KEY)
        self.provider = environ.get(GATEWAY_PROVIDER) or None
        self.default_model = (environ.get(GATEWAY_DEFAULT_MODEL) or "").strip() or None
        self.catalogue, self.problem = gateway_catalogue(environ.get(GATEWAY_CATALOGUE))
        self.provider_models, self.qualified_problem = provider_models(environ.get(GATEWAY_PROVIDER_MODELS))

    def __repr__(self) -> str:
        host = urllib.parse.urlsplit(self.base_url or "").hostname  # never the URL: it may carry credentials
        return f"Gateway(host={host!r}, default_model={self.default_model!r}, catalogue={self.catalogue!r})"

    def model_for(self, requested: str | None = None) -> str | None:
        """The model of a run on the gateway, as the gateway is asked for it (a model id, never
        "provider/model"): model_ref's."""
        return self.model_ref(requested)[1]

    def model_ref(self, requested: str | None = None) -> tuple[str | None, str | None]:
        """(its provider, where CLAWMANAGER_LLM_PROVIDER_MODELS names one; the model id) of a run
        on the gateway. `requested` (a payload's `model`): a "provider/model" that
        CLAWMANAGER_LLM_PROVIDER_MODELS lists, else a model id the catalogue lists (or any, with
        no catalogue); refused (errors.Refused, naming the lists) otherwise. Without one,
        OPENAI_MODEL, else the catalogue's first (without CLAWMANAGER_LLM_MODEL, the first of
        CLAWMANAGER_LLM_PROVIDER_MODELS, the same catalogue qualified: "auto/auto" is not skipped,
        as "auto" first in the catalogue is not); (None, None) when none says."""
        if requested:
            provider, _, model = requested.partition("/")
            if self.provider_models is not None and (provider, model) in self.provider_models:
                return provider, model
            known = self.catalogue if self.catalogue is not None or self.provider_models is None \
                else tuple(m for _, m in self.provider_models)
            if known is not None and requested not in known:
                from caldera.errors import Refused  # here: the quick verbs never choose a model

                lists = [f"{GATEWAY_CATALOGUE}: {self.catalogue_named()}"] if self.catalogue is not None else []
                lists += [f"{GATEWAY_PROVIDER_MODELS}: {self.catalogue_named(True)}"] \
                    if self.provider_models is not None else []
                raise Refused(f"model {_named_model(requested)!r} is not in the AI gateway's catalogue "
                              f"({'; '.join(lists)})")
            return self._provider_of(requested), requested
        default = self.default_model or (self.catalogue[0] if self.catalogue else None) \
            or (self.provider_models[0][1] if self.provider_models else None)
        return (self._provider_of(default) if default else None), default

    def _provider_of(self, model: str) -> str | None:
        """The provider CLAWMANAGER_LLM_PROVIDER_MODELS gives a model id first, if any."""
        return next((p for p, m in self.provider_models or () if m == model), None)

    def catalogue_named(self, qualified: bool = False) -> str:
        """The catalogue (`qualified`: CLAWMANAGER_LLM_PROVIDER_MODELS) as a sentence names it:
        CATALOGUE_NAMED ids at most, each cut to MODEL_NAMED_CHARS (a refusal stays a sentence,
        whatever the platform injected)."""
        catalogue = [f"{p}/{m}" for p, m in self.provider_models or ()] if qualified else self.catalogue or ()
        shown = ", ".join(_named_model(m) for m in catalogue[:CATALOGUE_NAMED])
        more = len(catalogue) - CATALOGUE_NAMED
        return shown + (f" and {more} more" if more > 0 else "")

    def warnings(self) -> list[str]:
        """What to say once at start about the gateway as injected: a catalogue that is not one
        (then ignored), a default model the catalogue does not list (a run that names no model
        asks for it, and a gateway that holds to its catalogue refuses it)."""
        if self.problem:
            return [f"{self.problem}: the AI gateway's model catalogue is ignored (a run's model is the one it asks "
                    f"for, else {GATEWAY_DEFAULT_MODEL})"]
        if self.qualified_problem:
            return [f"{self.qualified_problem}: it is ignored (a run's \"provider/model\" is checked against "
                    f"{GATEWAY_CATALOGUE} as it is)"]
        if self.default_model and self.catalogue is not None and self.default_model not in self.catalogue:
            return [f"{GATEWAY_DEFAULT_MODEL}={_named_model(self.default_model)!r} is not in the AI gateway's "
                    f"catalogue ({GATEWAY_CATALOGUE}: {self.catalogue_named()}): a run that names no model asks "
                    "for it, and the gateway may refuse it"]
        return []


def _named_model(model: str) -> str:
    return model if len(model) <= MODEL_NAMED_CHARS else model[:MODEL_NAMED_CHARS - 1] + "…"


def gateway_from_env(environ: Environ) -> Gateway | None:
    """The AI gateway when the environment carries one (a base URL and a key), else None."""
    gateway = Gateway(environ)
    return gateway if gateway.base_url and gateway.api_key else None


def credentials_directory(environ: Environ) -> str | None:
    """$CREDENTIALS_DIRECTORY: systemd's LoadCredential= files (a backend's projection may be there)."""
    return environ.get("CREDENTIALS_DIRECTORY") or os.environ.get("CREDENTIALS_DIRECTORY") or None


# The agent's code-agent settings in agent.env (SPEC section 10); messages name agent.env.
_RUN_TRUE = {"1", "true", "yes", "on"}
_RUN_FALSE = {"", "0", "false", "no", "off"}


def run_caps(environ: Environ, *, sandboxes: Iterable[str], default_max_timeout: int) -> dict[str, Any]:
    """The agent's caps on a code-agent run: CALDERA_RUN_MAX_TIMEOUT_SECONDS, CALDERA_RUN_MAX_SANDBOX
    (one of `sandboxes`, the widest allowed), CALDERA_RUN_ALLOW_NETWORK/_APPROVAL. ConfigError when bad."""
    try:
        max_timeout = int(environ.get("CALDERA_RUN_MAX_TIMEOUT_SECONDS") or default_max_timeout)
    except ValueError:
        raise ConfigError("CALDERA_RUN_MAX_TIMEOUT_SECONDS in agent.env is not an integer") from None
    sandbox = environ.get("CALDERA_RUN_MAX_SANDBOX") or "workspace-write"
    if sandbox not in sandboxes:
        raise ConfigError(f"CALDERA_RUN_MAX_SANDBOX={sandbox!r}: one of {', '.join(sandboxes)}")
    return {"max_timeout_seconds": max_timeout, "max_sandbox": sandbox,
            "allow_network": _run_flag(environ, "CALDERA_RUN_ALLOW_NETWORK"),
            "allow_approval": _run_flag(environ, "CALDERA_RUN_ALLOW_APPROVAL")}


RUN_SANDBOX = "CALDERA_RUN_SANDBOX"
RUN_SANDBOX_EXTERNAL = "external"


def run_sandbox_external(environ: Environ) -> bool:
    """CALDERA_RUN_SANDBOX=external: the operator states that the host (a container, a
    ClawManager instance) is the sandbox, and the code agents' commands run there without the
    backends' own (docs/container.md, "Code agents where user namespaces are forbidden"). Unset
    or empty: each backend's own sandbox (the default). Anything else is a ConfigError; whether
    the host is a container at all is the backends' check (backends/registry.confinement)."""
    raw = str(environ.get(RUN_SANDBOX) or "").strip()
    if not raw:
        return False
    if raw.lower() == RUN_SANDBOX_EXTERNAL:
        return True
    raise ConfigError(f"{RUN_SANDBOX}={raw!r}: the only value is 'external' (the container is the sandbox); "
                      "leave it unset for each backend's own sandbox")


def _run_flag(environ: Environ, name: str) -> bool:
    raw = str(environ.get(name) or "").strip().lower()
    if raw in _RUN_TRUE:
        return True
    if raw in _RUN_FALSE:
        return False
    raise ConfigError(f"{name}={environ.get(name)!r} in agent.env is not a boolean")


PROJECT_PATH_VAR = "CLAWMANAGER_PROJECT_PATH"


def workspace_roots(environ: Environ) -> list[str]:
    """CALDERA_WORKSPACE_ROOTS: the directories a control-plane run may work in (colon-separated).
    Unset, in a ClawManager instance: CLAWMANAGER_PROJECT_PATH, the directory every coding image
    opens its CLI in (`/config/workspace`, an ENV of the image), when it is absolute."""
    given = environ.get("CALDERA_WORKSPACE_ROOTS")
    if given is None and in_instance(environ):
        project = implicit_workspace_root(environ)[0]
        return [project] if project else []
    return [p for p in (given or "").split(":") if p.strip()]


def workspace_roots_in_runtime_roots(environ: Environ) -> list[str]:
    """A sentence (said once at start) for each of CALDERA_WORKSPACE_ROOTS that is or lies in
    the runtime's config or state root, or is the persistent dir: every run whose workspace is
    there is refused (backends/service.check_workspace), since the sandbox would bind the
    other agents' secrets.env and session.json into it. A root above them stays allowed, and
    one inside the persistent dir (ClawManager's `/config/workspace` in `/config`)."""
    runtime = [str(config_root(environ)), str(state_root(environ))]
    real = [os.path.realpath(p) for p in runtime if os.path.realpath(p) != "/"]
    persistent = persistent_dir(environ)
    out = []
    for root in workspace_roots(environ):
        found = os.path.realpath(root)
        holder = next((r for r in real if found == r or found.startswith(r.rstrip("/") + "/")), None)
        if holder is None and persistent and found == os.path.realpath(persistent):
            holder = found
        if holder is not None:
            out.append(f"the workspace root {root} is or lies in {holder}, one of the runtime's roots: "
                       "every run whose workspace is there is refused")
    return out


def implicit_workspace_root(environ: Environ) -> tuple[str | None, str | None]:
    """(CLAWMANAGER_PROJECT_PATH as the workspace root when CALDERA_WORKSPACE_ROOTS is unset in
    an instance, else None; the sentence to warn once at start when it is not used). Not `/`
    nor a directory holding the persistent or state dir: a run's agent could read and write
    the runtime's own state (its key, its queue) there. Only this implicit default is held to
    it: roots an operator names are theirs."""
    project = (environ.get(PROJECT_PATH_VAR) or "").strip()
    if environ.get("CALDERA_WORKSPACE_ROOTS") is not None or not in_instance(environ) or not os.path.isabs(project):
        return None, None
    real = os.path.realpath(project)
    own = [os.path.realpath(d) for d in (persistent_dir(environ), str(state_root(environ))) if d]
    held = next((d for d in own if d == real or d.startswith(real.rstrip("/") + "/")), None)
    if held is None:
        return project, None
    why = "it is /" if real == "/" else f"it holds {held}, the runtime's own state"
    return None, (f"{PROJECT_PATH_VAR}={project} is not used as the workspace root ({why}): control-plane runs "
                  "are refused until CALDERA_WORKSPACE_ROOTS names the directories they may work in")


SKILL_DIRS_VAR = "CALDERA_SKILL_DIRS"


def skill_dirs_of(environ: Environ | None) -> tuple[list[str], str | None]:
    """(the discovered skill dirs, where they come from: a variable's name, "<runtime> default",
    or None when there are none). CALDERA_SKILL_DIRS, else ClawManager's CLAWMANAGER_AGENT_SKILL_DIRS
    (colon-separated, stripped, unchecked), else, inside a ClawManager instance, the dirs the
    runtime's image keeps skills in (RUNTIME_SKILL_DIRS; scanned where they exist)."""
    env = environ or {}
    for name in (SKILL_DIRS_VAR, "CLAWMANAGER_AGENT_SKILL_DIRS"):
        if env.get(name):
            return [e.strip() for e in env[name].split(":") if e.strip()], name
    runtime = runtime_type_name(env)
    if in_instance(env) and runtime in RUNTIME_SKILL_DIRS:
        return list(RUNTIME_SKILL_DIRS[runtime]), f"{runtime} default"
    return [], None


def skill_dirs(environ: Environ | None) -> list[str]:
    """The discovered skill dirs (skill_dirs_of)."""
    return skill_dirs_of(environ)[0]


def skill_dirs_scanned(environ: Environ | None) -> tuple[list[str], list[str], str | None]:
    """(the discovered dirs a scan takes: absolute, normalised, each once, in order; the entries
    left out, not being absolute; where they come from, as skill_dirs_of): the one reading of
    the variable for the inventory and `caldera status` alike."""
    entries, origin = skill_dirs_of(environ)
    dirs: list[str] = []
    left_out: list[str] = []
    for entry in entries:
        if not os.path.isabs(entry):
            left_out.append(entry)
        elif os.path.normpath(entry) not in dirs:
            dirs.append(os.path.normpath(entry))
    return dirs, left_out, origin


def manifest_name(path: Path) -> str:
    """The manifest's `name:` read without a YAML parser (cheap), else its directory's name."""
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                m = re.match(r"^name:\s*['\"]?([A-Za-z0-9][A-Za-z0-9_.-]{0,63})['\"]?\s*(#.*)?$", line)
                if m:
                    return m.group(1)
    except OSError as exc:
        raise ConfigError(f"cannot read manifest {path}: {exc.strerror}") from exc
    return path.parent.name


# ---------------------------------------------------------------- env files

def read_env_file(path: Path, secret: bool = False) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them; {} when absent."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {}
    if secret and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
            f"run chmod 600 {path}")
    with open(path, encoding="utf-8") as fh:
        return parse_env_lines(fh, path)


def parse_env_lines(lines: Iterable[str], path: Path) -> dict[str, str]:
    """read_env_file's reading of `lines` (a text file's, `path` named in its errors)."""
    values: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        m = re.match(_ENV_LINE_RE, line)
        if not m:
            raise ConfigError(f"{path}:{number}: not a KEY=VALUE line")
        key, value = m.group(1), m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key] = value
    return values


def read_foreign_env_file(path: Path, limit: int = FOREIGN_ENV_LIMIT) -> dict[str, str]:
    """read_env_file for a file another account may have planted (another agent's agent.env):
    a link is followed (agent.env may be one) to a regular file of at most `limit` bytes, else
    ConfigError; opened without blocking (a FIFO would hang the reader for good) and read with
    that limit (a link to /dev/zero, a huge file). {} when absent; OSError when unreadable."""
    try:
        fd = os.open(os.path.realpath(path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path} is not a regular file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{path} is larger than {limit} bytes")
    return parse_env_lines(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"), path)


def merged_env(paths: AgentPaths, environ: Environ = os.environ) -> tuple[dict[str, str], dict[str, str]]:
    """(everything merged, just secrets.env)."""
    secrets = read_env_file(paths.secrets_env, secret=True)
    merged = dict(environ)
    merged.update(read_env_file(paths.agent_env))
    merged.update(secrets)
    return merged, secrets


def changed_names(old: Environ, new: Environ) -> list[str]:
    """The variables whose value differs between two merged environments (names only:
    what a reload may log)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def lookup(env: Environ, name: str) -> str | None:
    value = env.get(name)
    alias = ALIASES.get(name)
    if (value is None or value == "") and alias:
        value = env.get(alias)
    return value if value not in (None, "") else None


def _var(name: str) -> str:
    alias = ALIASES.get(name)
    return f"{name} (or {alias})" if alias else name


# ---------------------------------------------------------------- settings

def load_settings(paths: AgentPaths, environ: Environ = os.environ) -> Settings:
    env, secrets = merged_env(paths, environ)
    enabled = _parse_bool(env, "CALDERA_AGENT_ENABLED")
    base_url = _parse_url(env, environ) if (enabled or lookup(env, "CALDERA_BASE_URL")) else None
    token = lookup(env, "CALDERA_TOKEN")
    if token is not None and not header_safe(token):
        # a secret file's trailing newline, as Kubernetes mounts it: refused as the backends
        # refuse such a key, with a sentence that never quotes it
        raise ConfigError(f"{_var('CALDERA_TOKEN')} is not one line of printable characters "
                          "(a trailing newline or blank from a secret file?)")
    instance_id = _parse_int(env, "CALDERA_INSTANCE_ID", minimum=1)
    if enabled:
        for var, value in (("CALDERA_BASE_URL", base_url), ("CALDERA_TOKEN", token),
                           ("CALDERA_INSTANCE_ID", instance_id)):
            if value is None:
                raise ConfigError(f"{_var(var)} is required when the agent is enabled")
    protocol = lookup(env, "CALDERA_PROTOCOL_VERSION") or "v1"
    if protocol != "v1":
        raise ConfigError(f"{_var('CALDERA_PROTOCOL_VERSION')}={protocol!r}: only v1 is spoken")
    runtime_type = _runtime_type(env)
    log_level = (lookup(env, "CALDERA_LOG_LEVEL") or "info").lower()
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"CALDERA_LOG_LEVEL={log_level!r}: one of {', '.join(LOG_LEVELS)}")
    ca_bundle = lookup(env, "CALDERA_CA_BUNDLE")
    if ca_bundle and not (os.path.isfile(ca_bundle) or os.path.isdir(ca_bundle)):  # a directory: hashed certificates
        raise ConfigError(f"CALDERA_CA_BUNDLE: no such file or directory: {ca_bundle}")
    report_interval = _parse_float(env, "CALDERA_REPORT_INTERVAL_SECONDS", 5.0, minimum=2.0)
    persistent = lookup(env, "CALDERA_PERSISTENT_DIR")
    # ClawManager's gateway key and instance token travel in the environment: mask them too.
    injected = (env.get(name) for name in INJECTED_SECRETS)
    secret_values = tuple(v for v in (token, *secrets.values(), *injected) if v)
    return Settings(
        enabled=enabled, base_url=base_url, bootstrap_token=token, instance_id=instance_id,
        protocol_version=protocol, persistent_dir=Path(persistent) if persistent else paths.state_dir,
        disk_limit_bytes=_parse_int(env, "CALDERA_DISK_LIMIT_BYTES", minimum=0),
        runtime_type=runtime_type, ca_bundle=ca_bundle, log_level=log_level,
        report_interval=report_interval, env=env, secret_values=secret_values, agent_id_given=_agent_id(env),
        injected=injected_values(env, environ, PLATFORM_INJECTED),
    )


def _runtime_type(env: Environ) -> str:
    """runtime_type_of's name, checked: a bad one names its variable."""
    runtime_type, source = runtime_type_of(env)
    if runtime_type in RUNTIME_MARKERS:  # only CALDERA_RUNTIME_TYPE can still hold one here
        raise ConfigError(f"{source}={runtime_type!r}: {', '.join(RUNTIME_MARKERS)} are ClawManager's placement "
                          "markers (CLAWMANAGER_RUNTIME_TYPE), not a runtime name")
    if not re.fullmatch(_RUNTIME_TYPE_RE, runtime_type):  # fullmatch: `$` alone lets a trailing newline by
        raise ConfigError(f"{source}={runtime_type!r}: lowercase letters, digits, '_' or '-', at most 32")
    return runtime_type


def _agent_id(env: Environ) -> str | None:
    """CALDERA_AGENT_ID (else ClawManager's CLAWMANAGER_AGENT_ID), checked; None when neither is set."""
    name = next((n for n in ("CALDERA_AGENT_ID", "CLAWMANAGER_AGENT_ID") if env.get(n)), None)
    if name is None:
        return None
    raw = env[name]
    if len(raw) > AGENT_ID_MAX:
        raise ConfigError(f"{name}: {len(raw)} characters, the control plane keeps at most {AGENT_ID_MAX}")
    if not re.fullmatch(_AGENT_ID_RE, raw):
        raise ConfigError(f"{name}={raw[:80]!r}: use letters, digits, '.', '_', ':', '@' or '-', "
                          f"starting with a letter or digit ({_agent_id_fault(raw)})")
    return raw


def _agent_id_fault(raw: str) -> str:
    """What is wrong with an agent id _AGENT_ID_RE refuses, named: its first wrong character."""
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@-")
    at = next((i for i, c in enumerate(raw) if c not in allowed or (i == 0 and c in "._:@-")), 0)
    char = raw[at]
    shown = repr(char) if char.isascii() else f"{char!r} (U+{ord(char):04X})"
    if char.isspace() and (at == 0 or not raw[at:].strip()):
        where = "start" if at == 0 else "end"
        return f"{shown} at its {where}: the server trims it at register and then refuses every command"
    if at == 0:
        return f"it starts with {shown}"
    if char.isspace():
        return f"{shown} inside it: no spaces"
    return f"{shown} is not one of them" + ("" if char.isascii() else ": ASCII only")


def _parse_bool(env: Environ, name: str) -> bool:
    raw = lookup(env, name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{_var(name)}={raw!r}: use true or false")


def _parse_int(env: Environ, name: str, minimum: int | None = None) -> int | None:
    raw = lookup(env, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{_var(name)}={raw!r}: not a whole number") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{_var(name)}={raw!r}: must be at least {minimum}")
    return value


def _parse_float(env: Environ, name: str, default: float, minimum: float) -> float:
    raw = lookup(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r}: must be at least {minimum:g}")
    return value


def _parse_url(env: Environ, environ: Environ) -> str:
    """The control plane's URL from the merged `env`; `environ` is the process's own
    environment, the only place the platform's injected URL can come from (SPEC section 3)."""
    allow_plain = _parse_bool(env, ALLOW_PLAIN_HTTP)  # a bad value is an error even beside https://
    raw = lookup(env, "CALDERA_BASE_URL")
    if raw is None:
        raise ConfigError(f"{_var('CALDERA_BASE_URL')} is required when the agent is enabled")
    url = raw.strip().rstrip("/")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{_var('CALDERA_BASE_URL')}: not an http(s) URL")
    if parts.username or parts.password:
        raise ConfigError(f"{_var('CALDERA_BASE_URL')}: must not carry credentials")
    if parts.query or parts.fragment:
        raise ConfigError(f"{_var('CALDERA_BASE_URL')}: must not carry a query or fragment")
    if parts.path.rstrip("/").endswith("/api/v1/agent"):
        raise ConfigError(f"{_var('CALDERA_BASE_URL')}: give the API root, without /api/v1/agent")
    if parts.scheme == "http" and not (allow_plain or _platform_plain_http(env, environ, parts.hostname)):
        raise ConfigError(
            f"{_var('CALDERA_BASE_URL')}: plain http:// to {parts.hostname} is refused: use https://, or set "
            f"{ALLOW_PLAIN_HTTP}=true where the network to it is trusted (plain http is taken without it only "
            "for a loopback host and for the URL ClawManager injects as CLAWMANAGER_AGENT_BASE_URL)")
    return url


def _platform_plain_http(env: Environ, environ: Environ, host: str) -> bool:
    """SPEC section 3: plain http where the network is the platform's: a loopback host, or the
    URL ClawManager injects. Injected means in the process environment (`environ`), under the
    platform's own name CLAWMANAGER_AGENT_BASE_URL, and still the URL in use once agent.env
    and secrets.env are merged (`env`: no CALDERA_BASE_URL over it, no other value for it in a
    file). A CLAWMANAGER_AGENT_BASE_URL written in agent.env is the operator's, not the
    platform's. Anything else needs the operator's CALDERA_ALLOW_PLAIN_HTTP=true."""
    if is_loopback(host):
        return True
    return bool(injected_values(env, environ, ("CLAWMANAGER_AGENT_BASE_URL",))) and not env.get("CALDERA_BASE_URL")


def injected_values(env: Environ, environ: Environ, names: Iterable[str]) -> dict[str, str]:
    """`names` as the platform injected them: set in the process environment (`environ`, where
    ClawManager puts its variables; caldera's unit reads agent.env and secrets.env itself, never
    through EnvironmentFile=) and still the value in use once agent.env and secrets.env are
    merged (`env`). A value written in either file is the operator's, not the platform's: the
    plain-http rule (SPEC section 3) and the LLM-governance status (docs/container.md) read
    only what this returns."""
    return {name: environ[name] for name in names if environ.get(name) and env.get(name) == environ[name]}


def header_safe(value: str) -> bool:
    """Whether a credential can be a header value as it is (http.client would refuse another
    with an error quoting it whole): one line of printable ASCII, no surrounding blanks."""
    return value.isascii() and value.isprintable() and value == value.strip()


def is_loopback(host: str) -> bool:
    import ipaddress  # here: the quick verbs never read base_url (docs/performance.md, section 1)

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- names caldera reads

# Every CALDERA_* name caldera reads or sets (tests/test_config.py holds this to the source):
# one in agent.env or secrets.env that is none of these is a misspelling or a leftover, and
# `caldera run` says so once at its start (unknown_variables) rather than ignoring it silently.
KNOWN_VARS = (
    "CALDERA_AGENT", "CALDERA_AGENT_ENABLED", "CALDERA_AGENT_ID", "CALDERA_AGENT_STATE_DIR", "CALDERA_ALLOW_PLAIN_HTTP",
    "CALDERA_BASE_URL", "CALDERA_CA_BUNDLE", "CALDERA_CLAUDE_CODE_BIN", "CALDERA_CLAUDE_CODE_MAX_RETRIES",
    "CALDERA_CODEX_BIN", "CALDERA_CODEX_REQUEST_MAX_RETRIES",
    "CALDERA_CODEX_STREAM_MAX_RETRIES", "CALDERA_CONFIG_DIR", "CALDERA_DISK_LIMIT_BYTES", "CALDERA_GATEWAY_API_KEY",
    "CALDERA_INSTANCE_ID", "CALDERA_INSTRUCTIONS_FILE", "CALDERA_LOG_LEVEL", "CALDERA_MCP_CONFIG",
    "CALDERA_OPENCODE_BIN", "CALDERA_OPENCODE_IDLE_SECONDS", "CALDERA_OPENCODE_MAX_RETRIES",
    "CALDERA_PERSISTENT_DIR", "CALDERA_PLANE_DB", "CALDERA_PROVIDER_STALL_SECONDS", "CALDERA_PROTOCOL_VERSION",
    "CALDERA_REPORT_INTERVAL_SECONDS",
    "CALDERA_RUNTIME_TYPE", "CALDERA_RUN_ALLOW_APPROVAL", "CALDERA_RUN_ALLOW_NETWORK", "CALDERA_RUN_MAX_SANDBOX",
    "CALDERA_RUN_MAX_TIMEOUT_SECONDS", "CALDERA_RUN_SANDBOX", "CALDERA_SCHEMA_DIR",
    "CALDERA_SETTINGS_FILE", "CALDERA_SIGNAL_HANDOVER",
    "CALDERA_SKILL_DIRS", "CALDERA_STATE_DIR", "CALDERA_TOKEN", "CALDERA_VERB", "CALDERA_WORKSPACE_ROOTS",
)


def unknown_variables(paths: AgentPaths) -> list[tuple[Path, str, str | None]]:
    """(file, name, the closest known name or None) for each CALDERA_* name in the agent's
    agent.env and secrets.env that caldera does not read. Files that do not read are skipped
    (loading the settings names their problems)."""
    found = []
    for path, secret in ((paths.agent_env, False), (paths.secrets_env, True)):
        try:
            names = read_env_file(path, secret=secret)
        except (OSError, ValueError, ConfigError):
            continue
        for name in names:
            if name.startswith("CALDERA_") and name not in KNOWN_VARS:
                import difflib  # here: only an unknown name pays for it (0.2 MiB a daemon, docs/performance.md)

                close = difflib.get_close_matches(name, KNOWN_VARS, n=1, cutoff=0.6)
                found.append((path, name, close[0] if close else None))
    return found
