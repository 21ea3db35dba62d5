"""The caldera runtimes this host runs, as /proc shows them to this user.

The state-dir lock says whether a daemon runs *for one state dir*. A person who names
the agent with another state dir (a forgotten CALDERA_STATE_DIR, another --state-dir)
finds the lock free although the agent's daemon runs; "not running" would be false there,
and "start it" would start a second runtime for the same agent (in process mode, a second
copy of the agent). `caldera status` and process mode's verbs ask `runtime_elsewhere`
when the lock they look at is free. Read only: /proc/PID/cmdline (anyone may read it
unless /proc is mounted hidepid), and the cwd and environment where this user may read
them (its own processes, or root); what cannot be read is said as not known.
"""
from __future__ import annotations

import os

from caldera import TYPE_CHECKING, config
from caldera.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from caldera.config import AgentPaths

ROLES = ("run", "report")
FLAGS = {"--agent": "agent", "--manifest": "manifest", "--state-dir": "state_dir"}


class Runtime:
    """One `caldera run` (or `report --once`) process: its pid, role, agent flags, where its
    state is and (an installed agent) its config dir; None: not known to this user (another
    user's environment)."""

    __slots__ = ("pid", "role", "agent", "manifest", "state_dir", "config_dir")

    def __init__(self, pid: int, role: str, agent: str | None, manifest: str | None, state_dir: str | None,
                 config_dir: str | None = None) -> None:
        self.pid, self.role, self.agent, self.manifest = pid, role, agent, manifest
        self.state_dir, self.config_dir = state_dir, config_dir

    def __repr__(self) -> str:
        return f"Runtime(pid={self.pid}, role={self.role!r}, agent={self.agent!r}, state_dir={self.state_dir!r})"


def _read(path: str, limit: int = 64 * 1024) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None  # gone meanwhile, or another user's (hidepid, environ)


def command_words(argv: list[str]) -> tuple[str, list[str]] | None:
    """(role, the words after it) when argv is `caldera run|report …` as the console script
    (`…/caldera run`, `python3 …/caldera run`) or `python3 -m caldera.cli run` runs it."""
    for index, word in enumerate(argv[:-1]):
        program = os.path.basename(word) == "caldera" or (word == "caldera.cli" and argv[index - 1:index] == ["-m"])
        if program and argv[index + 1] in ROLES:
            return argv[index + 1], argv[index + 2:]
    return None


def agent_flags(words: list[str]) -> dict[str, str]:
    """--agent, --manifest and --state-dir as given (`--flag VALUE` or `--flag=VALUE`; the last wins)."""
    found: dict[str, str] = {}
    for index, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag in FLAGS:
            if not eq:
                value = words[index + 1] if index + 1 < len(words) else ""
            if value:
                found[FLAGS[flag]] = value
    return found


def runtimes(proc_root: str = "/proc") -> Iterator[Runtime]:
    """Every caldera runtime but this process, as far as this user can see."""
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        raw = _read(f"{proc_root}/{entry}/cmdline")
        words = command_words([w.decode(errors="replace") for w in raw.split(b"\0")[:-1]]) if raw else None
        if words is None:
            continue
        runtime = _runtime(int(entry), *words, proc_root=proc_root)
        if runtime is not None:
            yield runtime


def _runtime(pid: int, role: str, words: list[str], proc_root: str) -> Runtime | None:
    flags = agent_flags(words)
    try:
        cwd: str | None = os.readlink(f"{proc_root}/{pid}/cwd")
    except OSError:
        cwd = None
    manifest = _absolute(flags.get("manifest"), cwd)
    if flags.get("manifest") and manifest is None:
        return None  # a relative --manifest of a process whose cwd this user cannot see
    agent = flags.get("agent")
    environ = _environ(pid, proc_root) if agent and not manifest else None
    state = _absolute(flags.get("state_dir"), cwd)
    if state is None and not flags.get("state_dir"):
        state = _default_state(agent, manifest, environ)
    config_dir = str(config.config_root(environ) / "agents" / agent) if agent and environ is not None else None
    return Runtime(pid, role, agent, manifest, state, config_dir)


def _absolute(path: str | None, cwd: str | None) -> str | None:
    if not path:
        return None
    if os.path.isabs(path):
        return os.path.normpath(path)
    return os.path.normpath(os.path.join(cwd, path)) if cwd else None


def _environ(pid: int, proc_root: str) -> dict[str, str] | None:
    """That process's CALDERA_* variables (nothing else is kept), when this user may read them."""
    raw = _read(f"{proc_root}/{pid}/environ", 1024 * 1024)
    if raw is None:
        return None
    found = {}
    for word in raw.split(b"\0"):
        if word.startswith(b"CALDERA_"):
            key, _, value = word.decode(errors="replace").partition("=")
            found[key] = value
    return found


def _default_state(agent: str | None, manifest: str | None, environ: dict[str, str] | None) -> str | None:
    """Where that process keeps its state without --state-dir: beside its manifest, or under its
    CALDERA_STATE_DIR (from its environment, when this user may read it)."""
    if manifest is not None:
        try:
            path = config.manifest_file(manifest)
            return str(path.parent / config.STATE_BESIDE_MANIFEST / config.manifest_name(path))
        except ConfigError:
            return None
    if agent is None or environ is None:
        return None
    return str(config.state_root(environ) / agent)


def _same_install(runtime: Runtime, paths: AgentPaths) -> bool:
    """That process runs this installed agent: its config dir is this one; or, when its
    environment is another user's (config dir not known), this agent is installed under the
    default root, where the units systemd starts as the agent's account keep theirs. An
    unknown process is never claimed for an agent installed elsewhere (a test tree, a
    user's own CALDERA_CONFIG_DIR): there, another user's runtime of the same name is
    another install's."""
    if runtime.config_dir is not None:
        return runtime.config_dir == str(paths.config_dir)
    return paths.config_dir == config.config_root({}) / "agents" / paths.name


def _installed(paths: AgentPaths) -> bool:
    return paths.config_dir.parent.name == "agents" and paths.manifest_path == paths.config_dir / config.MANIFEST_NAME


def naming(paths: AgentPaths, other: Runtime) -> str | None:
    """How a command names `other`'s state dir (None: not known): the variable an installed
    agent's state root is set by, else --state-dir (or none: the default beside the manifest)."""
    if other.state_dir is None:
        return None
    if _installed(paths):
        return f"CALDERA_STATE_DIR={os.path.dirname(other.state_dir)}"
    if other.state_dir == str(paths.manifest_path.parent / config.STATE_BESIDE_MANIFEST / paths.name):
        return "no --state-dir: the default, beside the manifest"
    return f"--state-dir {other.state_dir}"


def runtime_elsewhere(paths: AgentPaths, proc_root: str = "/proc") -> Runtime | None:
    """A runtime of this agent (its --agent name, or its manifest) whose state dir is not
    `paths.state_dir` (or not known to this user); None when there is none to be seen."""
    mine = str(paths.state_dir)
    manifest = str(paths.manifest_path)
    installed = _installed(paths)
    for runtime in runtimes(proc_root):
        if runtime.state_dir == mine:
            continue
        if runtime.manifest is not None:
            try:
                same = str(config.manifest_file(runtime.manifest)) == manifest
            except ConfigError:
                same = False
        else:
            same = installed and runtime.agent == paths.name and _same_install(runtime, paths)
        if same:
            return runtime
    return None
