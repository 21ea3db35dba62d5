"""What keeps the agent's commands inside the execution policy: OpenCode has no sandbox.

OpenCode runs each Bash command with the shell `$SHELL` names (an absolute path to a file:
measured on 1.18.33, called as `SHELL -c COMMAND`). The agent's server is started with
`SHELL=<server dir>/bin/bash`, a wrapper that runs the real bash under bubblewrap:

- `/` read-only (`--ro-bind / /`), a fresh `/dev`, a pid namespace and its own `/proc` (the
  server's and the runtime's `/proc/PID/environ` are not there to read);
- writable: the agent's workspace roots (`CALDERA_WORKSPACE_ROOTS`, else the run's
  workspace) and the server's own dir (its HOME and TMPDIR);
- hidden (an empty tmpfs, /dev/null for a file): the agent's config dir (agent.env, secrets.env,
  the projection; its config root when it is `<root>/agents/NAME`), its state dir,
  `$CREDENTIALS_DIRECTORY`, and the server's `opencode.json` (the forwarder's routes and
  placeholders) and `server.json`;
- `OPENCODE_SERVER_PASSWORD` (and the username) unset: a command cannot use the server's API;
- `network: false`: `--unshare-net`, a command reaches nothing, not even the host's loopback
  (the forwarder, the server).

The network is part of the server's launch: a turn whose `network` differs from the running
server's waits for it to be free and gets a new one (docs/backends.md, "OpenCode").

Where bubblewrap is missing or cannot start here (no user namespaces), nothing confines a
command: Bash is then denied to every run (policy.rules), never run unconfined.
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from caldera.host import proc

PROBE_TIMEOUT = 10.0
HIDDEN_FILES = ("opencode.json", "server.json")
UNSET = ("OPENCODE_SERVER_PASSWORD", "OPENCODE_SERVER_USERNAME")
# `/` read-only, a fresh /dev, and a pid namespace with its own /proc: the host's processes
# (the server, the runtime: their /proc/PID/environ hold the password, the runtime's own
# variables) are not there to read
BASE = ("--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--proc", "/proc", "--die-with-parent")


@dataclass(frozen=True)
class Confinement:
    """The bubblewrap sandbox of the agent's commands on one server (real paths)."""
    bwrap: str
    shell: str  # the real bash
    writable: tuple[str, ...]
    hidden: tuple[str, ...]  # dirs (an empty tmpfs) and files (/dev/null) a command must not read
    network: bool

    def argv(self, server_dir: str) -> list[str]:
        """bwrap's arguments up to the shell (the wrapper adds the shell's own). In order: `/`
        read-only; the hidden paths; the workspace roots writable; a hidden path inside a
        root hidden again (its bind uncovered it; one that holds a root stays hidden around
        it); the server's dir writable, its config and pid file hidden (there once it runs)."""
        server_dir = os.path.realpath(server_dir)
        args = [self.bwrap, *BASE, *_hide(self.hidden)]
        for path in self.writable:
            args += ["--bind", path, path]
        args += _hide([p for p in self.hidden if any(_inside(p, root) for root in self.writable)])
        args += ["--bind", server_dir, server_dir]
        for name in HIDDEN_FILES:
            args += ["--ro-bind", "/dev/null", os.path.join(server_dir, name)]
        for name in UNSET:
            args += ["--unsetenv", name]
        if not self.network:
            args.append("--unshare-net")
        return [*args, "--", self.shell]

    def wrapper(self, server_dir: str) -> str:
        """The text of `<server dir>/bin/bash`: exec bwrap … bash "$@"."""
        return "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in self.argv(server_dir)) + ' "$@"\n'


def _hide(paths: Iterable[str]) -> list[str]:
    """What hides `paths` as they are when the server starts (one not there yet: nothing)."""
    args: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            args += ["--tmpfs", path]
        elif os.path.lexists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def _inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def private_paths(secrets_dir: str | None, state_dir: str, credentials_dir: str | None) -> list[str]:
    """The runtime's own files an agent's command must not read: the agent's config dir (the
    projection's parent when it is `secrets/`, its root when that is `<root>/agents/NAME`:
    agent.env, secrets.env, the projection), its state dir (logs, session.json, the journal),
    `$CREDENTIALS_DIRECTORY`; and each secret within them on its own, so that it stays hidden
    where a workspace root holds the dir. Real paths, there or not (the same for every run of
    the agent: they are part of its server's launch; the wrapper hides those that are there)."""
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


@functools.cache
def works(bwrap: str, true: str) -> bool:
    """Whether bubblewrap can make the sandbox here (user namespaces, a network namespace):
    one probe per process and binary."""
    argv = [bwrap, *BASE, "--unshare-net", "--", true]
    return proc.run(argv, env={"PATH": "/usr/bin:/bin"}, timeout=PROBE_TIMEOUT, stdout_cap=1024).ok


def plan(roots: Iterable[str], hidden: Iterable[str], network: bool, path: str) -> Confinement | None:
    """The agent's commands' sandbox, or None when bubblewrap is not there or cannot start."""
    bwrap, shell, true = (shutil.which(name, path=path) for name in ("bwrap", "bash", "true"))
    if not (bwrap and shell and true) or not works(bwrap, true):
        return None
    writable = sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)})
    return Confinement(bwrap=bwrap, shell=shell, writable=tuple(writable), hidden=tuple(hidden), network=network)
