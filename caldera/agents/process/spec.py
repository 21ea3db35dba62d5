"""Process mode's manifest keys (SPEC section 7b): their checks, and the `ProcessSpec`
the supervisor, the environment and the status reader are built from.

The checks are plain Python (local verbs never import jsonschema) and agree with
`schemas/manifest.schema.json` (a test holds them together on a corpus). Paths
given as a string or as a one-key mapping (`status: {file: …}`, `logs: {dir: …}`,
`state: {dir: …}`) mean the same; docs/process.md says why both are taken.
"""
from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from caldera.errors import ConfigError

RUNTIME_KEYS = ("stop_signal", "stop_timeout_seconds", "restart", "run_now_signal")
RESTART_POLICIES = ("on-failure", "always", "never")
SIGNALS = ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "KILL", "WINCH")
STOP_TIMEOUT_DEFAULT, STOP_TIMEOUT_MIN, STOP_TIMEOUT_MAX = 10, 1, 300
BINDINGS = ("llm_gateway",)
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
ACCOUNT_RE = r"^[a-z_][a-z0-9_-]{0,31}\$?$"
MCP_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_ENV, MAX_SECRETS, MAX_MCP = 100, 50, 50
VALUE_MAX = 4096
# Names the runtime sets itself: the manifest's env can't shadow them.
RESERVED_ENV = ("PATH", "HOME", "LANG", "TZ", "CALDERA_AGENT", "CALDERA_AGENT_STATE_DIR", "CALDERA_SETTINGS_FILE",
                "CALDERA_INSTRUCTIONS_FILE", "CALDERA_MCP_CONFIG")
TOKENS = ("CALDERA_TOKEN", "CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN", "CLAWMANAGER_INSTANCE_TOKEN")
PATH_FORMS = {"status": "file", "logs": "dir", "state": "dir", "instructions": "file"}


def _fail(where: str, text: str) -> None:
    raise ConfigError(f"{where}: {text}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _path_value(doc: dict, key: str, where: str) -> str | None:
    """The path a key names (string or {file|dir: path}); ConfigError naming the key."""
    if key not in doc:
        return None
    value, inner = doc[key], PATH_FORMS[key]
    if isinstance(value, dict):
        if set(value) != {inner}:
            _fail(where, f"{key}: a path, or a mapping with only '{inner}:'")
        value = value[inner]
    if not isinstance(value, str) or not value or "\0" in value:
        _fail(where, f"{key}: must be a path (a non-empty string)")
    if ".." in Path(value).parts:
        _fail(where, f"{key}: '..' is not allowed in the path")
    return value


def check_process_runtime(runtime: dict, where: str) -> None:
    """The runtime.* keys only process mode has."""
    for key in ("stop_signal", "run_now_signal"):
        if key in runtime and runtime[key] not in SIGNALS:
            _fail(where, f"runtime.{key}: one of {', '.join(SIGNALS)} (without SIG)")
    if "stop_timeout_seconds" in runtime:
        value = runtime["stop_timeout_seconds"]
        if not _is_int(value) or not STOP_TIMEOUT_MIN <= value <= STOP_TIMEOUT_MAX:
            _fail(where, f"runtime.stop_timeout_seconds: a whole number from {STOP_TIMEOUT_MIN} to {STOP_TIMEOUT_MAX}")
    if "restart" in runtime and runtime["restart"] not in RESTART_POLICIES:
        _fail(where, f"runtime.restart: one of {', '.join(RESTART_POLICIES)}")


def check_process_keys(doc: dict, where: str) -> None:
    """status, logs, state, secrets, bindings, instructions, mcp, env, account (as a user name)."""
    for key in PATH_FORMS:
        _path_value(doc, key, where)
    _check_names(doc.get("secrets"), "secrets", MAX_SECRETS, where)
    bindings = doc.get("bindings")
    if bindings is not None:
        if not isinstance(bindings, list) or not all(isinstance(b, str) for b in bindings):
            _fail(where, f"bindings: a list, a subset of {', '.join(BINDINGS)}")
        for item in bindings:
            if item not in BINDINGS:
                _fail(where, f"bindings: '{item}' is not one of {', '.join(BINDINGS)}")
    _check_env(doc.get("env"), where)
    _check_mcp(doc.get("mcp"), where)
    account = doc.get("account")
    if isinstance(account, str) and not re.match(ACCOUNT_RE, account):
        _fail(where, "account: true, false, or a system user name to run the agent as")


def _check_names(value, key: str, limit: int, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > limit:
        _fail(where, f"{key}: a list of at most {limit} variable names")
    for item in value:
        if not isinstance(item, str) or not re.match(ENV_NAME_RE, item):
            _fail(where, f"{key}: {item!r} is not a variable name (letters, digits, '_')")
        if item in RESERVED_ENV:
            _fail(where, f"{key}: {item} is set by the runtime itself")
        if item in TOKENS:
            _fail(where, f"{key}: {item} is the runtime's own token; it never reaches the agent")
    if len(set(value)) != len(value):
        _fail(where, f"{key}: a name is listed twice")


def _check_env(env, where: str) -> None:
    if env is None:
        return
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        _fail(where, f"env: a mapping of at most {MAX_ENV} NAME: value pairs")
    for name, value in env.items():
        if not isinstance(name, str) or not re.match(ENV_NAME_RE, name):
            _fail(where, f"env: {name!r} is not a variable name")
        if name in RESERVED_ENV or name.startswith(("CLAWMANAGER_", "CALDERA_TOKEN")):
            _fail(where, f"env.{name}: set by the runtime or a binding, not by the manifest")
        if not isinstance(value, str) or "\0" in value or len(value) > VALUE_MAX:
            _fail(where, f"env.{name}: a plain string value (quote numbers), at most {VALUE_MAX} characters")


def _check_mcp(mcp, where: str) -> None:
    if mcp is None:
        return
    if not isinstance(mcp, dict) or len(mcp) > MAX_MCP:
        _fail(where, f"mcp: a mapping of at most {MAX_MCP} servers, name: {{command: [...]}} or {{url: ...}}")
    for name, server in mcp.items():
        if not isinstance(name, str) or not re.match(MCP_NAME_RE, name):
            _fail(where, f"mcp: {name!r} is not a server name")
        check_mcp_server(name, server, where)


def check_mcp_server(name: str, server, where: str) -> None:
    at = f"mcp.{name}"
    if not isinstance(server, dict) or len(server) != 1 or next(iter(server)) not in ("command", "url"):
        _fail(where, f"{at}: exactly one of command: [argv] or url: https://…")
    if "command" in server:
        argv = server["command"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a and "\0" not in a for a in argv):
            _fail(where, f"{at}.command: a non-empty argv list, never a shell string")
    else:
        url = server["url"]
        if not isinstance(url, str) or not re.match(r"^https?://[^\s]+$", url) or len(url) > VALUE_MAX:
            _fail(where, f"{at}.url: an http(s) URL")


class ProcessSpec:
    """What process mode reads from a checked manifest; paths resolved, defaults filled."""

    __slots__ = ("name", "version", "command", "workdir", "stop_signal", "stop_timeout", "restart",
                 "run_now_signal", "status_file", "logs_dir", "state_dir", "secrets", "bindings",
                 "instructions", "mcp", "env", "account", "settings_schema", "settings_defaults", "controls",
                 "health")

    def __init__(self, **fields):
        for name in self.__slots__:
            setattr(self, name, fields.pop(name))
        if fields:
            raise TypeError(f"unknown ProcessSpec fields: {', '.join(fields)}")

    def __repr__(self) -> str:
        return f"ProcessSpec({self.name!r}, {list(self.command)!r})"


def signal_number(name: str) -> int:
    return int(getattr(signal, f"SIG{name}"))


def build_spec(manifest, agent_state_dir: Path) -> ProcessSpec:
    """The spec of a checked process manifest. `agent_state_dir` is the runtime's state dir:
    a relative `state` lies under it; relative `status` and `logs` under `state` when the
    manifest names one (the agent writes there), else under the workdir."""
    if manifest.runtime_type != "process":
        raise ConfigError(f"{manifest.path}: runtime.type: {manifest.runtime_type} is not process mode")
    doc, where = manifest.doc, str(manifest.path)
    runtime = doc["runtime"]
    state_rel = _path_value(doc, "state", where)
    state_dir = _under(Path(agent_state_dir), state_rel) if state_rel else Path(agent_state_dir) / "agent"
    status_rel = _path_value(doc, "status", where)
    status_base = state_dir if state_rel else manifest.workdir
    logs_rel = _path_value(doc, "logs", where)
    instructions = _path_value(doc, "instructions", where)
    account = doc.get("account")
    return ProcessSpec(
        name=manifest.name, version=manifest.version, command=tuple(manifest.command), workdir=manifest.workdir,
        stop_signal=signal_number(runtime.get("stop_signal", "TERM")),
        stop_timeout=float(runtime.get("stop_timeout_seconds", STOP_TIMEOUT_DEFAULT)),
        restart=runtime.get("restart", "on-failure"),
        run_now_signal=signal_number(runtime.get("run_now_signal", "USR1")),
        status_file=_under(status_base, status_rel) if status_rel else None,
        logs_dir=_under(status_base, logs_rel) if logs_rel else None,
        state_dir=state_dir, secrets=tuple(doc.get("secrets") or ()), bindings=tuple(doc.get("bindings") or ()),
        instructions=_under(manifest.workdir, instructions) if instructions else None,
        mcp=dict(doc.get("mcp") or {}), env=dict(doc.get("env") or {}),
        account=account if isinstance(account, str) else None,
        settings_schema=manifest.settings_schema, settings_defaults=manifest.settings_defaults,
        controls=manifest.controls, health=manifest.health,
    )


def _under(base: Path, rel: str) -> Path:
    path = Path(rel)
    return Path(os.path.normpath(path if path.is_absolute() else Path(base) / path))
