"""What keeps the agent's commands inside the execution policy: OpenCode has no sandbox.

OpenCode runs each Bash command with the shell `$SHELL` names (an absolute path to a file:
measured on 1.18.33, called as `SHELL -c COMMAND`). The agent's server is started with
`SHELL=<server dir>/bin/bash`, a wrapper that runs the real bash under bubblewrap:

- `/` read-only (`--ro-bind / /`), a fresh `/dev`;
- writable: the agent's workspace roots (`CALDERA_WORKSPACE_ROOTS`, else the run's
  workspace) and the server's own dir (its HOME and TMPDIR);
- hidden (an empty tmpfs): the agent's config dir (agent.env, secrets.env, the projection;
  its config root when it is `<root>/agents/NAME`), its state dir, `$CREDENTIALS_DIRECTORY`;
  and the server's `opencode.json` (the forwarder's routes and placeholders), `server.json`;
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


@dataclass(frozen=True)
class Confinement:
    """The bubblewrap sandbox of the agent's commands on one server (real paths)."""
    bwrap: str
    shell: str  # the real bash
    writable: tuple[str, ...]
    hidden: tuple[str, ...]
    network: bool

    def argv(self, server_dir: str) -> list[str]:
        """bwrap's arguments up to the shell (the wrapper adds the shell's own)."""
        server_dir = os.path.realpath(server_dir)
        writable = (*self.writable, server_dir)
        args = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--die-with-parent"]
        for path in self.hidden:
            args += ["--tmpfs", path]
        for path in writable:
            args += ["--bind", path, path]
        # a hidden dir inside a writable one was uncovered again by its bind: hidden once more
        for path in self.hidden:
            if any(_below(path, root) for root in writable):
                args += ["--tmpfs", path]
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


def _below(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def hidden_dirs(secrets_dir: str | None, logs_dir: str, credentials_dir: str | None) -> list[str]:
    """The runtime's own dirs an agent's command must not read: the agent's config dir (the
    projection's parent when it is `secrets/`; its root when that is `<root>/agents/NAME`), its
    state dir (the parent of `logs/`), `$CREDENTIALS_DIRECTORY`; real paths, those that exist."""
    found: list[str] = []
    if secrets_dir:
        secrets = Path(os.path.abspath(secrets_dir))
        config = secrets.parent if secrets.name == "secrets" else secrets
        found.append(str(config.parent.parent if config.parent.name == "agents" else config))
    found.append(os.path.dirname(os.path.abspath(logs_dir)))
    if credentials_dir:
        found.append(credentials_dir)
    real = {os.path.realpath(p) for p in found if os.path.isdir(p)}
    return sorted(p for p in real if p != "/")


@functools.cache
def works(bwrap: str, true: str) -> bool:
    """Whether bubblewrap can make the sandbox here (user namespaces, a network namespace):
    one probe per process and binary."""
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--die-with-parent", "--unshare-net", "--", true]
    return proc.run(argv, env={"PATH": "/usr/bin:/bin"}, timeout=PROBE_TIMEOUT, stdout_cap=1024).ok


def plan(roots: Iterable[str], hidden: Iterable[str], network: bool, path: str) -> Confinement | None:
    """The agent's commands' sandbox, or None when bubblewrap is not there or cannot start."""
    bwrap, shell, true = (shutil.which(name, path=path) for name in ("bwrap", "bash", "true"))
    if not (bwrap and shell and true) or not works(bwrap, true):
        return None
    writable = sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)})
    return Confinement(bwrap=bwrap, shell=shell, writable=tuple(writable), hidden=tuple(hidden), network=network)
