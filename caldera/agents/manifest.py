"""`caldera.agent.yaml`: load, check, and cache the parsed manifest.

The checks here are plain Python and give the same verdict as
`schemas/manifest.schema.json` (a test holds the two together on a corpus);
`validate_schema=True` also runs the schema through `caldera.protocol.schemas`
(`caldera check` and `caldera init` do; the daemon runs the plain checks only,
docs/performance.md section 2). Local verbs
must feel instant, so they never import jsonschema, and they do not pay for
PyYAML either when the manifest has not changed: the parsed document is cached
as JSON in `<state-dir>/cache/manifest.json`, keyed by the manifest's path,
mtime_ns, size and inode (docs/adapter.md, "Manifest cache").
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents.settings import value_problem
from caldera.errors import ConfigError
from caldera.host.fsutil import atomic_write_json

if TYPE_CHECKING:
    from typing import Any, NoReturn

CACHE_NAME = "manifest.json"
CACHE_FORMAT = 1
FORBIDDEN_IN_ADAPTER_MODE = ("status", "logs", "state", "secrets", "bindings", "instructions", "mcp")
FORBIDDEN_IN_ADAPTER_MODE_EXTRA = ("env",)  # process mode's plain environment for the agent
TOP_LEVEL = {"name", "version", "description", "runtime", "settings", "controls", "health", "account",
             *FORBIDDEN_IN_ADAPTER_MODE, *FORBIDDEN_IN_ADAPTER_MODE_EXTRA}
CONTROLS = ("pause", "resume", "run_now")
SETTING_TYPES = ("percent", "number", "integer", "boolean", "string", "enum")
SETTING_KEYS = {"key", "label", "type", "min", "max", "step", "options", "max_length", "description"}
# The name and key rules (^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$ and ^[A-Za-z_][A-Za-z0-9_]{0,63}$)
# as character sets, not regexes: every quick verb checks its cached manifest, and compiling
# the two regexes was a large part of its cost (docs/performance.md, section 1).
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_NAME_FIRST, _NAME_REST = _ALNUM, _ALNUM | frozenset("_.-")
_KEY_FIRST = (_ALNUM - frozenset("0123456789")) | frozenset("_")
_KEY_REST = _ALNUM | frozenset("_")


def is_name(text: str) -> bool:
    return _word(text, _NAME_FIRST, _NAME_REST)


def is_key(text: str) -> bool:
    return _word(text, _KEY_FIRST, _KEY_REST)


def _word(text: str, first: frozenset[str], rest: frozenset[str]) -> bool:
    return 0 < len(text) <= 64 and text[0] in first and all(c in rest for c in text[1:])


TIMEOUT_MIN, TIMEOUT_MAX = 1, 120
MAX_SETTINGS = 100
PROBLEM_MAX = 200  # a schema problem quotes the value it found: the sentence stays a line
PROCESS_RUNTIME_KEYS = ("stop_signal", "stop_timeout_seconds", "restart", "run_now_signal")


class Manifest:
    """The checked manifest (a plain class, not a dataclass: a local verb builds one, and
    `dataclasses` would cost it its import: docs/performance.md, section 1). Treat it as
    read-only; a changed file gives a new Manifest."""

    __slots__ = ("path", "doc", "name", "version", "runtime_type", "command", "workdir", "timeout_seconds",
                 "settings_schema", "settings_defaults", "controls", "health", "account", "update")
    path: Path
    doc: dict[str, Any]  # the checked document
    name: str
    version: str | None
    runtime_type: str  # adapter | process
    command: tuple[str, ...]  # argv; command[0] made absolute when relative
    workdir: Path  # absolute (a relative one is relative to the manifest's directory)
    timeout_seconds: int | None
    settings_schema: tuple[dict[str, Any], ...]
    settings_defaults: dict[str, Any]
    controls: tuple[str, ...] | None  # None when the manifest names none
    health: dict[str, Any] | None
    account: bool
    # None for the installed manifest, else {revision_id, version, applied_at} of the stored
    # blueprint update over it (caldera.agents.updates).
    update: dict[str, Any] | None

    def __init__(self, *, path: Path, doc: dict[str, Any], name: str, version: str | None, runtime_type: str,
                 command: tuple[str, ...], workdir: Path, timeout_seconds: int | None,
                 settings_schema: tuple[dict[str, Any], ...], settings_defaults: dict[str, Any],
                 controls: tuple[str, ...] | None, health: dict[str, Any] | None, account: bool,
                 update: dict[str, Any] | None = None) -> None:
        self.path = path
        self.doc = doc
        self.name = name
        self.version = version
        self.runtime_type = runtime_type
        self.command = command
        self.workdir = workdir
        self.timeout_seconds = timeout_seconds
        self.settings_schema = settings_schema
        self.settings_defaults = settings_defaults
        self.controls = controls
        self.health = health
        self.account = account
        self.update = update

    def __repr__(self) -> str:
        return f"Manifest({self.name!r}, {self.runtime_type}, {str(self.path)!r})"



# ---------------------------------------------------------------- loading

def load_manifest(path: str | Path, *, cache_dir: str | Path | None = None, validate_schema: bool = False) -> Manifest:
    """The checked manifest at `path`; ConfigError naming the problem otherwise.

    cache_dir: where the parsed-manifest cache lives (the CLI passes
    `<state-dir>/cache`); None reads the YAML every time.
    """
    path = Path(path).absolute()
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the manifest: {exc.strerror}") from None
    key = [str(path), st.st_mtime_ns, st.st_size, st.st_ino, CACHE_FORMAT]
    doc = _cache_get(cache_dir, key)
    if doc is None:
        doc = _parse_yaml(path)
        check_document(doc, path)
        _cache_put(cache_dir, key, doc)
    if validate_schema:
        schema_check(doc, path)
    return build(doc, path)


def _parse_yaml(path: Path) -> Any:
    import yaml  # deferred: a cache hit (every warm quick verb) never pays for it

    try:
        with open(path, "rb") as fh:
            return yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the manifest: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{at}: {problem}") from None


def parse_text(text: str | bytes, path: str | Path = "caldera.agent.yaml") -> dict[str, Any]:
    """Parse and check manifest text (a blueprint update); the checked document."""
    import yaml  # deferred: a warm `caldera pause` reads the manifest cache and never needs it

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    check_document(doc, Path(path))
    return doc


def schema_check(doc: Any, path: str | Path) -> None:
    # deferred: a quick verb never checks the schema (docs/performance.md, section 1)
    from caldera.protocol.schemas import SchemaError, validate

    try:
        validate("manifest.schema.json", doc)
    except SchemaError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _cache_file(cache_dir: str | Path | None) -> Path | None:
    return Path(cache_dir) / CACHE_NAME if cache_dir is not None else None


def _cache_get(cache_dir: str | Path | None, key: list[Any]) -> dict[str, Any] | None:
    file = _cache_file(cache_dir)
    if file is None:
        return None
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # the state dir: never a planted link
        with os.fdopen(fd, "rb") as fh:
            entry = json.loads(fh.read())
    except (OSError, ValueError):
        return None  # absent, unreadable or torn: parse the YAML instead
    if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("doc"), dict):
        return None
    doc = entry["doc"]
    # The checks are cheap; running them on a hit means a tampered cache can't smuggle anything in.
    check_document(doc, Path(key[0]))
    return doc


def _cache_put(cache_dir: str | Path | None, key: list[Any], doc: dict[str, Any]) -> None:
    file = _cache_file(cache_dir)
    if file is None:
        return
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_json(file, {"key": key, "doc": doc})
    except (OSError, TypeError, ValueError):
        # Only a cache: an unwritable state dir (a person without rights to it) or a
        # document JSON can't hold (YAML dates) costs the next call a YAML parse, nothing else.
        pass


def build(doc: dict[str, Any], path: Path) -> Manifest:
    runtime = doc["runtime"]
    base = path.parent
    workdir = Path(runtime.get("workdir") or ".")
    workdir = (workdir if workdir.is_absolute() else base / workdir).resolve()
    command = tuple(runtime.get("command") or ())
    if command and "/" in command[0] and not os.path.isabs(command[0]):
        # Relative to the workdir, as the adapter's author reads it in the manifest.
        command = (str(workdir / command[0]),) + command[1:]
    settings = doc.get("settings") or {}
    controls = doc.get("controls")
    return Manifest(
        path=path, doc=doc, name=doc["name"], version=_opt_str(doc.get("version")),
        runtime_type=runtime["type"], command=command, workdir=workdir,
        timeout_seconds=runtime.get("timeout_seconds"),
        settings_schema=tuple(dict(i) for i in settings.get("schema") or ()),
        settings_defaults=dict(settings.get("defaults") or {}),
        controls=tuple(controls) if controls is not None else None,
        health=doc.get("health"), account=bool(doc.get("account", False)),
    )


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


# ---------------------------------------------------------------- checks

def check_document(doc: Any, path: str | Path) -> None:
    """Raise ConfigError naming the first problem; the same rules as manifest.schema.json."""
    where = str(path)
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: {shape_problem(doc)}")
    runtime = doc.get("runtime")
    if isinstance(runtime, dict) and runtime.get("type") == "adapter":
        for key in (*FORBIDDEN_IN_ADAPTER_MODE, *FORBIDDEN_IN_ADAPTER_MODE_EXTRA):
            if key in doc:
                raise ConfigError(
                    f"{where}: '{key}' is not allowed with runtime.type: adapter (in adapter mode the "
                    f"runtime reads no agent files and passes no credentials; the adapter owns them)")
    for key in doc:
        if key not in TOP_LEVEL:
            raise ConfigError(f"{where}: {unknown_key(doc, key)}")
    name = doc.get("name")
    if not isinstance(name, str) or not is_name(name):
        raise ConfigError(f"{where}: name: required, letters, digits, '.', '_' or '-' (at most 64)")
    for key in ("version", "description"):
        if key in doc and not isinstance(doc[key], str):
            raise ConfigError(f"{where}: {key}: must be a string (quote it: {key}: \"{doc[key]}\")")
    _check_runtime(runtime, where)
    _check_settings(doc.get("settings"), where)
    _check_controls(doc, where)
    _check_health(doc.get("health"), where)
    if isinstance(runtime, dict) and runtime.get("type") == "process":
        _check_process(doc, where)
    elif "account" in doc and not isinstance(doc["account"], bool):
        raise ConfigError(f"{where}: account: must be true or false")


def unknown_key(doc: dict[str, Any], key: object) -> str:
    """A top-level key the manifest does not know, in one sentence: a misspelling of a key
    the document lacks (`runtim:`) names the missing key first, as the reader must fix it."""
    import difflib  # here: only a manifest with an unknown key pays for it

    missing = [known for known in TOP_LEVEL if known not in doc]
    close = difflib.get_close_matches(str(key), missing, n=1, cutoff=0.75)
    return f"{close[0]}: missing (is '{key}' a misspelling?)" if close else f"unknown key '{key}'"


def shape_problem(doc: Any) -> str:
    """Why a document that is not a mapping is no manifest, in one sentence."""
    if doc is None:
        return "the manifest is empty; write its keys at the top level: name:, then runtime: with type: and command:"
    kind = {list: "a YAML list", str: "a single YAML string", bool: "a YAML boolean"}.get(type(doc), "a YAML value")
    if isinstance(doc, (int, float)) and not isinstance(doc, bool):
        kind = "a YAML number"
    return f"the manifest is {kind}, not a mapping; write its keys at the top level: name:, runtime:, …"


def explain_schema_problem(doc: dict[str, Any], problem: str) -> list[str]:
    """One of manifest.schema.json's problems ("path: message", protocol.schemas.problems) in
    the words of check_document: its `not` rules (the keys adapter mode refuses) would
    otherwise print the whole document and the rule as jsonschema states them."""
    at, _, message = problem.partition(": ")
    if "should not be valid under" in message:
        scope = doc.get("runtime") if at == "runtime" else doc
        refused = (PROCESS_RUNTIME_KEYS if at == "runtime"
                   else (*FORBIDDEN_IN_ADAPTER_MODE, *FORBIDDEN_IN_ADAPTER_MODE_EXTRA))
        prefix = "runtime." if at == "runtime" else ""
        keys = [k for k in refused if isinstance(scope, dict) and k in scope]
        return [f"'{prefix}{key}' is not allowed with runtime.type: adapter" for key in keys] or [problem]
    if at == "(top level)" and message.startswith("Additional properties are not allowed"):
        return [unknown_key(doc, key) for key in doc if key not in TOP_LEVEL] or [problem]
    if at == "(top level)" and message.endswith(" is a required property"):
        key = message.removesuffix(" is a required property").strip("'")
        said = [unknown_key(doc, other) for other in doc if other not in TOP_LEVEL]
        return [s for s in said if s.startswith(f"{key}: ")] or [f"{key}: missing (required)"]
    return [problem if len(problem) <= PROBLEM_MAX else problem[:PROBLEM_MAX - 1] + "…"]


def _check_process(doc: dict[str, Any], where: str) -> None:
    check_process_runtime(doc["runtime"], where)
    check_process_keys(doc, where)
    if "account" in doc and not isinstance(doc["account"], (bool, str)):
        raise ConfigError(f"{where}: account: true, false, or a system user name to run the agent as")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_argv(value: Any, label: str, where: str) -> None:
    if isinstance(value, str):
        raise ConfigError(f"{where}: {label}: must be an argv list, never a shell string "
                          f"(write [{', '.join(value.split())}])")
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
        raise ConfigError(f"{where}: {label}: must be a non-empty list of non-empty strings")
    if any("\0" in a for a in value):
        raise ConfigError(f"{where}: {label}: an argument holds a NUL")


def _check_timeout(value: Any, label: str, where: str) -> None:
    if not _is_int(value) or not TIMEOUT_MIN <= value <= TIMEOUT_MAX:
        raise ConfigError(f"{where}: {label}: a whole number of seconds from {TIMEOUT_MIN} to {TIMEOUT_MAX}")


def _check_runtime(runtime: Any, where: str) -> None:
    if not isinstance(runtime, dict):
        raise ConfigError(f"{where}: runtime: required, a mapping with type: adapter or process")
    kind = runtime.get("type")
    if kind not in ("adapter", "process"):
        raise ConfigError(f"{where}: runtime.type: must be adapter or process")
    allowed: tuple[str, ...] = ("type", "command", "workdir", "timeout_seconds")
    if kind == "process":
        allowed += PROCESS_RUNTIME_KEYS
    for key in runtime:
        if key not in allowed:
            raise ConfigError(f"{where}: runtime.{key}: unknown key for runtime.type: {kind}")
    if "command" not in runtime:
        raise ConfigError(f"{where}: runtime.command: required (the argv of the {kind})")
    _check_argv(runtime["command"], "runtime.command", where)
    if "workdir" in runtime and (not isinstance(runtime["workdir"], str) or not runtime["workdir"]
                                 or "\0" in runtime["workdir"]):
        raise ConfigError(f"{where}: runtime.workdir: must be a path")
    if "timeout_seconds" in runtime:
        _check_timeout(runtime["timeout_seconds"], "runtime.timeout_seconds", where)


def _check_settings(settings: Any, where: str) -> None:
    if settings is None:
        return
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}: settings: must be a mapping with schema: and defaults:")
    for key in settings:
        if key not in ("schema", "defaults"):
            raise ConfigError(f"{where}: settings.{key}: unknown key (schema, defaults)")
    items = settings.get("schema", [])
    if not isinstance(items, list) or len(items) > MAX_SETTINGS:
        raise ConfigError(f"{where}: settings.schema: must be a list of at most {MAX_SETTINGS} items")
    seen = set()
    for index, item in enumerate(items):
        _check_setting_item(item, f"{where}: settings.schema[{index}]")
        if item["key"] in seen:
            raise ConfigError(f"{where}: settings.schema[{index}].key: '{item['key']}' is declared twice")
        seen.add(item["key"])
    defaults = settings.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"{where}: settings.defaults: must be a mapping of key: value")

    by_key = {i["key"]: i for i in items}
    for key, value in defaults.items():
        if key not in by_key:
            raise ConfigError(f"{where}: settings.defaults.{key}: not declared in settings.schema")
        problem = value_problem(by_key[key], value)
        if problem:
            raise ConfigError(f"{where}: settings.defaults.{key}: {problem}")


def _check_setting_item(item: Any, at: str) -> None:
    if not isinstance(item, dict):
        raise ConfigError(f"{at}: must be a mapping {{key, label, type, …}}")
    for key in item:
        if key not in SETTING_KEYS:
            raise ConfigError(f"{at}.{key}: unknown key")
    if not isinstance(item.get("key"), str) or not is_key(item["key"]):
        raise ConfigError(f"{at}.key: required, a letter or '_' then letters, digits or '_' (at most 64)")
    if item.get("type") not in SETTING_TYPES:
        raise ConfigError(f"{at}.type: one of {', '.join(SETTING_TYPES)}")
    for key in ("label", "description"):
        if key in item and not isinstance(item[key], str):
            raise ConfigError(f"{at}.{key}: must be a string")
    kind = item["type"]
    for key in ("min", "max", "step"):
        if key in item:
            if kind not in ("percent", "number", "integer"):
                raise ConfigError(f"{at}.{key}: only for percent, number or integer settings")
            if not (_is_int(item[key]) if kind == "integer" else _is_num(item[key])):
                raise ConfigError(f"{at}.{key}: must be a {'whole ' if kind == 'integer' else ''}number")
    if "step" in item and item["step"] <= 0:
        raise ConfigError(f"{at}.step: must be above 0")
    if kind == "percent":
        for key in ("min", "max"):
            if key in item and not 0 <= item[key] <= 1:
                raise ConfigError(f"{at}.{key}: a percent is a fraction from 0 to 1 (0.95 is 95 %)")
    if "min" in item and "max" in item and item["min"] > item["max"]:
        raise ConfigError(f"{at}: min is above max")
    if "options" in item or kind == "enum":
        options = item.get("options")
        if kind != "enum":
            raise ConfigError(f"{at}.options: only for enum settings")
        if (not isinstance(options, list) or not options or len(options) > 100
                or not all(isinstance(o, str) for o in options) or len(set(options)) != len(options)):
            raise ConfigError(f"{at}.options: required for enum, a list of 1 to 100 distinct strings")
    if "max_length" in item:
        if kind != "string":
            raise ConfigError(f"{at}.max_length: only for string settings")
        if not _is_int(item["max_length"]) or not 1 <= item["max_length"] <= 8192:
            raise ConfigError(f"{at}.max_length: a whole number from 1 to 8192")


def _check_controls(doc: dict[str, Any], where: str) -> None:
    if "controls" not in doc:
        return
    controls = doc["controls"]
    if not isinstance(controls, list) or not all(isinstance(c, str) for c in controls):
        raise ConfigError(f"{where}: controls: must be a list, a subset of {', '.join(CONTROLS)}")
    for control in controls:
        if control not in CONTROLS:
            raise ConfigError(f"{where}: controls: '{control}' is not one of {', '.join(CONTROLS)}")
    if len(set(controls)) != len(controls):
        raise ConfigError(f"{where}: controls: a control is named twice")


def _check_health(health: Any, where: str) -> None:
    if health is None:
        return
    if not isinstance(health, dict):
        raise ConfigError(f"{where}: health: must be a mapping with command:, interval_seconds:, timeout_seconds:")
    for key in health:
        if key not in ("command", "interval_seconds", "timeout_seconds"):
            raise ConfigError(f"{where}: health.{key}: unknown key")
    if "command" not in health:
        raise ConfigError(f"{where}: health.command: required (an argv list)")
    _check_argv(health["command"], "health.command", where)
    if "interval_seconds" in health:
        value = health["interval_seconds"]
        if not _is_int(value) or not 10 <= value <= 86400:
            raise ConfigError(f"{where}: health.interval_seconds: a whole number from 10 to 86400")
    if "timeout_seconds" in health:
        _check_timeout(health["timeout_seconds"], "health.timeout_seconds", where)


# ---------------------------------------------------------------- process mode's keys (SPEC 7b)

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


def _match(pattern: str, text: str) -> bool:
    import re  # deferred: only a process manifest's keys pay for regexes (docs/performance.md)

    return re.match(pattern, text) is not None


def _fail(where: str, text: str) -> NoReturn:
    raise ConfigError(f"{where}: {text}")


def path_value(doc: dict[str, Any], key: str, where: str) -> str | None:
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


def check_process_runtime(runtime: dict[str, Any], where: str) -> None:
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


def check_process_keys(doc: dict[str, Any], where: str) -> None:
    """status, logs, state, secrets, bindings, instructions, mcp, env, account (as a user name)."""
    for key in PATH_FORMS:
        path_value(doc, key, where)
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
    if isinstance(account, str) and not _match(ACCOUNT_RE, account):
        _fail(where, "account: true, false, or a system user name to run the agent as")


def _check_names(value: Any, key: str, limit: int, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > limit:
        _fail(where, f"{key}: a list of at most {limit} variable names")
    for item in value:
        if not isinstance(item, str) or not _match(ENV_NAME_RE, item):
            _fail(where, f"{key}: {item!r} is not a variable name (letters, digits, '_')")
        if item in RESERVED_ENV:
            _fail(where, f"{key}: {item} is set by the runtime itself")
        if item in TOKENS:
            _fail(where, f"{key}: {item} is the runtime's own token; it never reaches the agent")
    if len(set(value)) != len(value):
        _fail(where, f"{key}: a name is listed twice")


def _check_env(env: Any, where: str) -> None:
    if env is None:
        return
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        _fail(where, f"env: a mapping of at most {MAX_ENV} NAME: value pairs")
    for name, value in env.items():
        if not isinstance(name, str) or not _match(ENV_NAME_RE, name):
            _fail(where, f"env: {name!r} is not a variable name")
        if name in RESERVED_ENV or name.startswith(("CLAWMANAGER_", "CALDERA_TOKEN")):
            _fail(where, f"env.{name}: set by the runtime or a binding, not by the manifest")
        if not isinstance(value, str) or "\0" in value or len(value) > VALUE_MAX:
            _fail(where, f"env.{name}: a plain string value (quote numbers), at most {VALUE_MAX} characters")


def _check_mcp(mcp: Any, where: str) -> None:
    if mcp is None:
        return
    if not isinstance(mcp, dict) or len(mcp) > MAX_MCP:
        _fail(where, f"mcp: a mapping of at most {MAX_MCP} servers, name: {{command: [...]}} or {{url: ...}}")
    for name, server in mcp.items():
        if not isinstance(name, str) or not _match(MCP_NAME_RE, name):
            _fail(where, f"mcp: {name!r} is not a server name")
        check_mcp_server(name, server, where)


def check_mcp_server(name: str, server: Any, where: str) -> None:
    at = f"mcp.{name}"
    if not isinstance(server, dict) or len(server) != 1 or next(iter(server)) not in ("command", "url"):
        _fail(where, f"{at}: exactly one of command: [argv] or url: https://…")
    if "command" in server:
        argv = server["command"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a and "\0" not in a for a in argv):
            _fail(where, f"{at}.command: a non-empty argv list, never a shell string")
    else:
        url = server["url"]
        if not isinstance(url, str) or not _match(r"^https?://[^\s]+$", url) or len(url) > VALUE_MAX:
            _fail(where, f"{at}.url: an http(s) URL")
