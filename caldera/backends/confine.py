"""caldera's own bubblewrap: what hides the runtime's roots from a backend's processes.

Every agent on a host runs as the same account, which can read every agent's `secrets.env`,
projection and `session.json`; a CLI's own sandbox (Codex's) cannot deny reads, so caldera puts
the CLI's process itself (Codex's `app-server`; OpenCode's `serve` and each of its commands,
opencode/confine.py) in a mount namespace where those trees are empty:

- `/` read-only, a fresh `/dev`, a pid namespace with its own `/proc` (the runtime's and other
  runs' `/proc/PID/environ`, same uid, hold their tokens), its own IPC namespace;
- covered by an empty tmpfs (`COVERED`): `/tmp`, `/var/tmp`, `/run` (other runs' private dirs
  and unix sockets) and the runtime's roots (`runtime_roots`: the config root with every
  agent's agent.env, secrets.env and projection; the state root with every session.json,
  outbox and run dir; a ClawManager instance's persistent dir; Claude Code's private dirs);
- covered too: the other agents' workspace roots (`other_workspace_roots`: those the agent.env
  of every agent installed under the config root names), wherever they lie;
- hidden (an empty tmpfs; a file: /dev/null) the agent's own private paths (`private_paths`),
  wherever they lie, and again after the binds where a bound dir holds them;
- bound back: what the process needs of those trees (the run's own dir, its workspace, its
  binary, resolv.conf's target in /run).

This module builds those arguments and probes whether bubblewrap starts (`works`) and whether a
CLI's own sandbox starts inside it (`nests`); each backend adds its own binds.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caldera import config
from caldera.backends import failures as fk
from caldera.backends import leftovers
from caldera.errors import ConfigError
from caldera.host import proc

log = logging.getLogger("caldera.backends")
PROBE_TIMEOUT = 10.0
# what backend_status says of CALDERA_RUN_SANDBOX=external (no box, no pid namespace: docs/container.md)
PROC1_READABLE = ("; its commands can read the runtime's environment in /proc/1/environ (its token "
                  "CALDERA_TOKEN or CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN, the AI gateway's CLAWMANAGER_LLM_API_KEY)")
SHARED = ("/tmp", "/var/tmp", "/run")  # every account's: other runs' files and sockets
# `/` read-only, a fresh /dev, and a pid namespace with its own /proc: the host's processes
# (their /proc/PID/environ) are not there to read
FILESYSTEM = ("--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--proc", "/proc")
# ... and, for a command (never for a process a CLI's own sandbox must nest in): no capability,
# its own IPC, a new session (no TIOCSTI into a terminal)
BASE = (*FILESYSTEM, "--unshare-ipc", "--new-session", "--cap-drop", "ALL", "--die-with-parent")


def hide(paths: Iterable[str]) -> list[str]:
    """What hides `paths` as they are now (one not there: nothing): a dir under an empty
    tmpfs, a file under /dev/null."""
    args: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            args += ["--tmpfs", path]
        elif os.path.lexists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def within(path: str, roots: Iterable[str]) -> str | None:
    """The first of `roots` that `path` is or lies under, else None."""
    return next((root for root in roots if path == root or inside(path, root)), None)


def refuse_exposing(binds: Iterable[str], guarded: Iterable[str]) -> None:
    """BackendFailure where a bind IS one of `guarded` (a covered root, a hidden path): binding
    it back would show it whole, since only what lies inside a bind is hidden again (issue 43's
    review: a workspace that was the state root showed every agent's session.json)."""
    guarded = set(guarded)
    for path in binds:
        if path in guarded:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED, f"{path} is one of the runtime's roots or private "
                                    "paths, which no run may read: it is not bound into the sandbox")


def outermost(paths: Iterable[str]) -> list[str]:
    """`paths` without those another of them holds (one tmpfs covers them), shortest first."""
    ordered = sorted(set(paths), key=len)
    return [p for p in ordered if not any(inside(p, q) for q in ordered)]


def runtime_roots(config_root: str | None, state_root: str | None, persistent_dir: str | None) -> list[str]:
    """The runtime's roots (as a run's Environment names them): the config and state roots,
    the instance's persistent dir, and every private dir of this uid's Claude Code runs."""
    found = [config_root, state_root, persistent_dir, str(leftovers.private_root())]
    return sorted({os.path.realpath(p) for p in found if p} - {"/"})


def other_workspace_roots(config_root: str | None, own: Iterable[str],
                          programs: Iterable[str | None] = ()) -> list[str]:
    """The workspace roots of the other agents on this host, real paths of dirs there: every
    `CALDERA_WORKSPACE_ROOTS` the agent.env of an agent installed under `config_root`
    (`<root>/agents/NAME/`) names, less `own` (this agent's roots and the run's workspace: a
    root two agents share stays theirs to share). No list of other agents is kept: one
    installed later is found at the next run (OpenCode's: the set is part of its server's launch,
    so a changed one gives the next turn a fresh server once the running turns end). An agent
    run from a manifest outside the config root is not found.

    Another agent's agent.env is another account's file: read with a limit, never blocking
    (config.read_foreign_env_file); one that cannot be read is passed over with a warning (once
    per file and process: its roots are not hidden then), and so is a root that is a system dir
    or holds one of `programs` (the run's binary) or the interpreter (`kept`)."""
    if not config_root:
        return []
    try:
        dirs = sorted(p for p in (Path(config_root) / "agents").iterdir() if p.is_dir())
    except OSError:
        return []
    kept = _programs([*programs, sys.executable])
    found = {root for agent in dirs for root in _named_roots(agent / "agent.env", kept)}
    mine = {os.path.realpath(p) for p in own}
    return sorted(p for p in found - mine if os.path.isdir(p))


# never hidden as another agent's root: what every command needs (dir, inside, or above it)
SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/dev", "/proc",
          "/sys")
SYSTEM_TOPS = ("/var", "/opt", "/run", "/srv", "/home")  # the dir itself (a root below is a workspace's)
_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


def _named_roots(env: Path, kept: Sequence[str]) -> list[str]:
    """The real paths of the workspace roots another agent's `env` names, less those it may
    not hide (`kept_because`); [] where it cannot be read. Each left out is said once."""
    try:
        named = config.read_foreign_env_file(env).get("CALDERA_WORKSPACE_ROOTS", "")
    except (OSError, ConfigError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _warn_once((str(env), ""), f"{env} cannot be read ({why}): the workspace roots it names are "
                   "not hidden from this agent's commands (file modes are the fence: docs/backends.md)")
        return []
    roots: list[str] = []
    for real in (_real(p.strip()) for p in named.split(":")):
        kept_why = kept_because(real, kept) if real is not None else None
        if kept_why is not None:
            _warn_once((str(env), str(real)), f"{env} names {real} as a workspace root: not hidden from "
                       f"this agent's commands ({kept_why})")
        elif real is not None:
            roots.append(real)
    return roots


def _real(root: str) -> str | None:
    """`root`'s real path; None where it is not absolute or holds a NUL (another account's text)."""
    if not os.path.isabs(root) or "\0" in root:
        return None
    try:
        return os.path.realpath(root)
    except (OSError, ValueError):
        return None


def _programs(paths: Iterable[str | None]) -> list[str]:
    """The paths of `paths` (real and as named) that no other agent's root may hide."""
    return sorted({q for p in paths if p for q in (os.path.abspath(p), os.path.realpath(p))})


def kept_because(root: str, programs: Iterable[str]) -> str | None:
    """Why another agent's `root` (a real path) is not hidden, else None: `/`, a system dir,
    one inside or above one, or one that holds a program (the run's binary, the interpreter)."""
    if root == "/" or within(root, SYSTEM) or any(inside(s, root) for s in SYSTEM) or root in SYSTEM_TOPS:
        return "a system dir: an agent cannot hide the system from the others"
    held = next((p for p in programs if inside(p, root)), None)
    return f"it holds {held}, which the run needs" if held else None


def _warn_once(key: tuple[str, str], message: str) -> None:
    """A warning once per `key` in this process: each run reads the files again."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.warning("%s", message)


def own_roots_in(roots: Iterable[str], others: Sequence[str]) -> tuple[str, ...]:
    """This agent's workspace roots (real paths) that lie in one of `others` (another agent's
    root, covered): bound back read-only, as `/` shows them elsewhere."""
    return tuple(sorted({r for r in (os.path.realpath(p) for p in roots) if within(r, others) and os.path.isdir(r)}))


def private_paths(secrets_dir: str | None, state_dir: str, credentials_dir: str | None) -> list[str]:
    """The runtime's own files an agent's process must not read: the agent's config dir (the
    projection's parent when it is `secrets/`, its root when that is `<root>/agents/NAME`:
    agent.env, secrets.env, the projection), its state dir (logs, session.json, the journal),
    `$CREDENTIALS_DIRECTORY`; and each secret within them on its own, so that it stays hidden
    where a bound dir holds it. Real paths, there or not."""
    found = [state_dir, os.path.join(state_dir, "logs"), os.path.join(state_dir, "session.json")]
    if secrets_dir:
        secrets = Path(os.path.abspath(secrets_dir))
        config = secrets.parent if secrets.name == "secrets" else secrets
        found += [str(secrets), str(config / "secrets.env"), str(config / "agent.env"), str(config)]
        if config.parent.name == "agents":
            found.append(str(config.parent.parent))
    if credentials_dir:
        found.append(credentials_dir)
    real = {os.path.realpath(p) for p in found}
    return sorted(p for p in real if p != "/")


def resolv_binds(covered: Iterable[str]) -> tuple[str, ...]:
    """/etc/resolv.conf's target where a covered dir holds it (systemd-resolved's, in /run):
    bound back read-only, so that names still resolve."""
    resolv = os.path.realpath("/etc/resolv.conf")
    return tuple(p for p in (resolv,) if any(inside(p, c) for c in covered))


@dataclass(frozen=True)
class Box:
    """caldera's bubblewrap around one process (Codex's app-server, OpenCode's server): `argv`
    up to `--`.

    It keeps its capabilities (none for an account's process; as root, bubblewrap keeps them)
    and the host's network, so that the CLI's own sandbox (or caldera's for its commands) nests
    inside it and its provider stays reachable; that inner sandbox is what confines the agent's
    commands further (their writes, their network, their capabilities)."""
    bwrap: str
    covered: tuple[str, ...]  # an empty tmpfs each (the runtime's roots; SHARED added)
    hidden: tuple[str, ...]  # the agent's private paths: hidden first, and again inside a bind
    readable: tuple[str, ...] = ()  # bound back read-only where they exist (the binary, resolv.conf's target)
    flags: tuple[str, ...] = ()  # more of bwrap's options (Codex's: --unshare-ipc, --die-with-parent)
    userns: tuple[str, ...] = ()  # one of USERNS_CHOICES (`userns_here`)
    others: tuple[str, ...] = ()  # other agents' workspace roots: covered as `covered` is (a binary may lie in one)
    roots: tuple[str, ...] = ()  # this agent's roots inside one of `others`: bound back read-only

    @property
    def guarded(self) -> tuple[str, ...]:
        """What no bind may be, and what is hidden again inside one."""
        return (*SHARED, *self.covered, *self.others, *self.hidden)

    def argv(self, writable: Sequence[str], read_only: Sequence[str] = ()) -> list[str]:
        """`writable` and `read_only` (real paths) bound back over what hides them, the outer
        ones first: after each, the covered and hidden paths inside it are hidden again, and a
        bind inside one of those (the run's dir in a hidden state dir) comes after it. A bind
        that is a covered or hidden path itself: BackendFailure (`refuse_exposing`). `roots`
        are added to `read_only` (not where a bind of the same path is already asked)."""
        covered = outermost([*SHARED, *self.covered, *self.others])
        args = [self.bwrap, *self.userns, *FILESYSTEM, *self.flags, *hide(p for p in covered if os.path.isdir(p)),
                *hide(self.hidden)]
        for path in self.readable:
            args += ["--ro-bind-try", path, path]
        read_only = [*read_only, *(r for r in self.roots if r not in writable and r not in read_only)]
        refuse_exposing([*writable, *read_only], self.guarded)
        binds = [("--bind", p) for p in writable] + [("--ro-bind", p) for p in read_only]
        for flag, path in sorted(binds, key=lambda bind: bind[1].rstrip("/").count("/")):  # outer first
            again = outermost(p for p in self.guarded if inside(p, path))
            args += [flag, path, path, *hide(again)]
        return [*args, "--"]


def which(path: str, bundled: str | None = None) -> tuple[str, str] | None:
    """(bwrap, true): bubblewrap on `path`, else `bundled` (a CLI's own copy) where it is an
    executable file; None without either."""
    bwrap, true = shutil.which("bwrap", path=path), shutil.which("true", path=path)
    if bwrap is None and bundled and os.path.isfile(bundled) and os.access(bundled, os.X_OK):
        bwrap = bundled
    return (bwrap, true) if bwrap and true else None


# Root in a container: without a user namespace bubblewrap needs the container's CAP_SYS_ADMIN,
# and CAP_NET_ADMIN for `--unshare-net`, which a container's root seldom has (systemd-nspawn's:
# "loopback: Failed RTM_NEWADDR"; Docker's and Kubernetes' default: neither); in one, a nested
# sandbox cannot mount /proc where the host masks parts of it (Docker's own root: "Can't mount
# proc"). So root tries without first, then with `--unshare-user` (measured, bubblewrap 0.11);
# any other uid gets a user namespace from bubblewrap either way.
USERNS_CHOICES: tuple[tuple[str, ...], ...] = ((), ("--unshare-user",))


RETRY_FAILED_PROBE = 60.0  # seconds: a failed probe is asked again after that, not before


def successes_cached(probe: Callable[..., bool]) -> Callable[..., bool]:
    """`probe` with its successes kept for the process's life, and a failure for
    RETRY_FAILED_PROBE seconds only: one that a passing cause made (a probe timed out on a
    busy host, a namespace limit reached for a moment) does not unbox every later run."""
    found: dict[tuple[object, ...], tuple[bool, float]] = {}
    lock = threading.Lock()

    @functools.wraps(probe)
    def cached(*args: Any) -> bool:
        with lock:
            known = found.get(args)
        if known is not None and (known[0] or time.monotonic() - known[1] < RETRY_FAILED_PROBE):
            return known[0]
        ok = probe(*args)
        with lock:
            found[args] = (ok, time.monotonic())
        return ok
    return cached


@successes_cached
def works(bwrap: str, true: str, userns: tuple[str, ...] = ()) -> bool:
    """Whether bubblewrap can make a command's sandbox here (user namespaces, a network
    namespace): one probe per process, binary and USERNS_CHOICES entry (`successes_cached`)."""
    argv = [bwrap, *userns, *BASE, "--unshare-net", "--", true]
    return proc.run(argv, env={"PATH": "/usr/bin:/bin"}, timeout=PROBE_TIMEOUT, stdout_cap=1024).ok


@successes_cached
def nests(bwrap: str, true: str, userns: tuple[str, ...] = ()) -> bool:
    """Whether a command's sandbox can start inside a process's (a nested user, pid and mount
    namespace): one probe per process, binary and choice."""
    argv = [bwrap, *userns, *FILESYSTEM, "--", bwrap, *userns, *BASE, "--unshare-net", "--", true]
    return proc.run(argv, env={"PATH": "/usr/bin:/bin"}, timeout=PROBE_TIMEOUT, stdout_cap=1024).ok


def userns_here(bwrap: str, true: str) -> tuple[str, ...] | None:
    """The first of USERNS_CHOICES whose sandbox starts and nests here (root tries both), or None."""
    for userns in USERNS_CHOICES if os.geteuid() == 0 else USERNS_CHOICES[:1]:
        if works(bwrap, true, userns) and nests(bwrap, true, userns):
            return userns
    return None


def unavailable(path: str, bundled: str | None = None) -> str | None:
    """Why no Box can hold a CLI whose own sandbox must nest in it (None: one can): the
    sentence `backend_status` says. `bundled`: the CLI's own bubblewrap, used without one on
    `path`."""
    found = which(path, bundled)
    if found is None:
        return "bubblewrap (bwrap) is not on PATH"
    if not works(*found):
        return "bubblewrap cannot start here (no unprivileged user namespaces?)"
    if not nests(*found):
        return "bubblewrap cannot start inside its own sandbox here"
    return None
