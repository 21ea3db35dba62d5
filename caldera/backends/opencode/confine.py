"""What keeps the agent's commands inside the execution policy: OpenCode has no sandbox.

The pieces every backend's bubblewrap shares (the covered roots, the hidden private paths, the
probes, the process's `Box`) are backends/confine.py's; this module adds OpenCode's: the
commands' wrapper and its workspaces list, the server's own dir.

OpenCode runs each Bash command with the shell `$SHELL` names (an absolute path to a file:
measured on 1.18.33, called as `SHELL -c COMMAND` in the command's directory). The agent's
server is started with `SHELL=<server dir>/bin/bash`, a wrapper that drops the server's
credentials from its own environment and execs the real bash under bubblewrap:

- `/` read-only (`--ro-bind / /`), a fresh `/dev`, a pid namespace and its own `/proc` (the
  server's and the runtime's `/proc/PID/environ` are not there to read; the sandbox's own
  pid 1 is bwrap's, whose environment no longer holds the server's password), its own IPC
  namespace, a new session (no TIOCSTI into a terminal), and no capability at all
  (`--cap-drop ALL`: as root, bubblewrap would keep them and a command could remount `/`);
- hidden (an empty tmpfs; a file: /dev/null): `/tmp`, `/var/tmp`, `/run` (their unix sockets,
  other runs' private dirs), the runtime's config and state roots, the instance's persistent
  dir, Claude Code's private dirs, the agent's config and state dirs, `$CREDENTIALS_DIRECTORY`,
  and the server's own dir (its wrapper, its config, its HOME and XDG dirs, `opencode.db`: a
  command writing there would run outside the sandbox at the server's next look);
- read-only: the agent's workspace roots (`CALDERA_WORKSPACE_ROOTS`, else the run's workspace);
- writable: only the workspace of the turn whose command it is (`workspace-write`; read-only
  for `read-only`), found by the command's directory in the server's `workspaces` file, which
  the runtime keeps (`Admitted`); a command in no admitted workspace is refused;
- `OPENCODE_SERVER_PASSWORD` (and the username) unset before bwrap starts;
- `network: false`: `--unshare-net`, a command reaches nothing, not even the host's loopback
  (the forwarder, the server).

The network is part of the server's launch: a turn whose `network` differs from the running
server's waits for it to be free and gets a new one (docs/backends.md, "OpenCode").

The server itself runs under bubblewrap too where it nests (`server_argv`): its own file tools
follow a symlink in the workspace, and must find there no more than a command would.

Where bubblewrap is missing or cannot start here (no user namespaces), nothing confines a
command: Bash is then denied to every run (policy.rules), never run unconfined. The same where
it starts but cannot nest in the server's sandbox: the server, unconfined, could rewrite the
wrapper in its own dir through a symlink (its write tool follows one).
"""
from __future__ import annotations

import collections
import os
import shlex
import shutil
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from caldera.backends.confine import (
    BASE,
    SHARED,
    Box,
    hide,
    inside,
    nests,
    outermost,
    private_paths,
    refuse_exposing,
    resolv_binds,
    userns_here,
    works,
)
from caldera.host.fsutil import atomic_write_bytes

__all__ = ["Admitted", "Confinement", "plan", "private_paths", "works", "nests"]
UNSET = ("OPENCODE_SERVER_PASSWORD", "OPENCODE_SERVER_USERNAME")
SANDBOX_DIR = "bin"  # in the server's dir: the $SHELL wrapper and the workspaces list, read-only to the server
WORKSPACES = os.path.join(SANDBOX_DIR, "workspaces")  # the admitted workspaces, one `w:PATH`/`r:PATH` a line
# What the server's own sandbox keeps read-only in its dir: its file tools follow a symlink a
# command (or the workspace) made, so a `write` through one would rewrite the wrapper or the
# workspaces list (its next command unconfined), plant a plugin or config it loads later, or
# forge its owner's claim (`.owner`, `server.json`: the pids a later sweep would kill).
SERVER_READ_ONLY = (SANDBOX_DIR, "config", "home", "opencode.json", ".owner", "server.json")
# The wrapper: `@UNSET@`, `@LIST@`, `@BEFORE@` and `@AFTER@` filled in (quoted) by `wrapper()`.
WRAPPER = """#!/bin/sh
# caldera (backends/opencode/confine.py): OpenCode's $SHELL, every command under bubblewrap
unset @UNSET@
here=$(pwd -P) || exit 126
ws=
mode=
while IFS= read -r line; do
  path=${line#?:}
  case "$here/" in
    "$path"/*) if [ ${#path} -gt ${#ws} ]; then ws=$path; mode=${line%%:*}; fi ;;
  esac
done < @LIST@
if [ -z "$ws" ]; then
  echo "caldera: $here is not the workspace of a turn of this agent: the command is refused" >&2
  exit 126
fi
bind=--ro-bind
[ "$mode" = w ] && bind=--bind
exec @BEFORE@ "$bind" "$ws" "$ws" @AFTER@ "$@"
"""


@dataclass(frozen=True)
class Confinement:
    """The bubblewrap sandbox of the agent's commands on one server (real paths)."""
    bwrap: str
    shell: str  # the real bash
    roots: tuple[str, ...]  # the agent's workspace roots: read-only (the turn's workspace aside)
    covered: tuple[str, ...]  # dirs an empty tmpfs covers (the runtime's roots); a workspace in one is bound back
    hidden: tuple[str, ...]  # dirs (an empty tmpfs) and files (/dev/null) a command must not read, ever
    network: bool
    extra: tuple[str, ...] = ()  # read-only binds back into a covered dir (resolv.conf's target)
    server: bool = False  # `opencode serve` itself runs in a sandbox of its own (bubblewrap nests here)
    userns: tuple[str, ...] = ()  # one of confine.USERNS_CHOICES: the one that starts and nests here

    def argv(self, server_dir: str) -> tuple[list[str], list[str]]:
        """bwrap's arguments before and after the turn's workspace bind (the wrapper adds it
        and the shell's own arguments). In order: `/` read-only; the covered dirs, the hidden
        paths and the server's dir hidden; what resolv.conf needs; the workspace roots
        read-only; [the workspace]; a hidden path inside a root hidden again (the binds
        uncovered it); the server's HOME and TMPDIR made again, empty."""
        server_dir = os.path.realpath(server_dir)
        refuse_exposing(self.roots, [*SHARED, *self.covered, *self.hidden])  # one of them bound whole
        covered = outermost([*SHARED, *self.covered, server_dir])  # one tmpfs covers those inside another
        args = [self.bwrap, *self.userns, *BASE, *hide([p for p in covered if os.path.isdir(p)]), *hide(self.hidden)]
        for path in self.extra:
            args += ["--ro-bind-try", path, path]
        for path in self.roots:
            args += ["--ro-bind", path, path]
        # a covered root inside a workspace root (one above the runtime's roots) as well as a
        # hidden path: the root's bind uncovered it
        again = outermost(p for p in (*self.covered, *self.hidden) if any(inside(p, root) for root in self.roots))
        after = hide(again)
        for name in ("home", "tmp"):  # last: a hidden path may hold them
            after += ["--dir", os.path.join(server_dir, name)]
        for name in UNSET:
            after += ["--unsetenv", name]
        if not self.network:
            after.append("--unshare-net")
        return args, [*after, "--", self.shell]

    def server_argv(self, server_dir: str, binary: str) -> list[str]:
        """bwrap's arguments that run `opencode serve` itself (up to `--`), so that its own file
        tools, which follow a symlink in the workspace, find no more than the commands do: the
        same roots and shared dirs covered and secrets hidden; writable its own dir and the
        workspace roots (its edit tools obey the session's rules); its binary read-only where a
        covered dir holds it; its own pid namespace (the runtime's `/proc/PID/environ` out of
        reach); the host's network (the forwarder and its API are on the host's loopback); its
        capabilities kept, so the commands' bubblewrap can nest in it (and drops them). Read-only in
        its dir (SERVER_READ_ONLY): the wrapper and the workspaces list, its config dirs."""
        server_dir = os.path.realpath(server_dir)
        binaries = sorted({binary, os.path.realpath(binary)})
        box = Box(self.bwrap, self.covered, self.hidden, readable=(*self.extra, *binaries), userns=self.userns)
        return box.argv([*self.roots, server_dir], [os.path.join(server_dir, name) for name in SERVER_READ_ONLY])

    def wrapper(self, server_dir: str) -> str:
        """The text of `<server dir>/bin/bash` (WRAPPER)."""
        before, after = self.argv(server_dir)
        text = WRAPPER.replace("@UNSET@", " ".join(UNSET))
        text = text.replace("@LIST@", shlex.quote(os.path.join(os.path.realpath(server_dir), WORKSPACES)))
        text = text.replace("@BEFORE@", " ".join(shlex.quote(a) for a in before))
        return text.replace("@AFTER@", " ".join(shlex.quote(a) for a in after))


class Admitted:
    """The workspaces of the turns on one server now (`<server dir>/workspaces`, 0600, which
    the wrapper reads): a command may write only in the workspace of its own turn. Read-only
    entries first: of two turns on one workspace, the read-only one wins."""

    def __init__(self, server_dir: str | os.PathLike[str]):
        self.path = Path(server_dir) / WORKSPACES
        self._lock = threading.Lock()
        self._held: collections.Counter[str] = collections.Counter()
        self._write()

    def admit(self, workspace: str, writable: bool) -> str:
        """Admit a turn's workspace; the entry to `dismiss` at its end. ValueError for a
        path the list cannot hold (a newline in it)."""
        real = os.path.realpath(workspace)
        if "\n" in real or real == "/":
            raise ValueError(f"workspace {workspace!r} cannot be confined (a newline in its path, or /)")
        entry = ("w:" if writable else "r:") + real
        with self._lock:
            self._held[entry] += 1
            self._write()
        return entry

    def dismiss(self, entry: str) -> None:
        with self._lock:
            self._held[entry] -= 1
            if self._held[entry] <= 0:
                del self._held[entry]
            self._write()

    def _write(self) -> None:
        lines = sorted(self._held, key=lambda e: (e[0] != "r", e))
        try:
            atomic_write_bytes(self.path, "".join(f"{e}\n" for e in lines).encode(), mode=0o600, durable=False)
        except FileNotFoundError:
            pass  # the server stopped and its dir is gone: nothing to admit any more


# CALDERA_RUN_SANDBOX=external (the container is the sandbox): OpenCode's $SHELL only drops
# the server's credentials and runs the real shell, confined by nothing of caldera's.
UNCONFINED = """#!/bin/sh
# caldera (backends/opencode/confine.py): OpenCode's $SHELL; CALDERA_RUN_SANDBOX=external
unset @UNSET@
exec @SHELL@ "$@"
"""


def unconfined_wrapper(path: str) -> str:
    """The $SHELL of a server whose commands run in the container as they are (external)."""
    shell = shutil.which("bash", path=path) or "/bin/sh"
    return UNCONFINED.replace("@UNSET@", " ".join(UNSET)).replace("@SHELL@", shlex.quote(shell))


def plan(roots: Iterable[str], covered: Iterable[str | None], hidden: Iterable[str], network: bool,
         path: str) -> Confinement | None:
    """The agent's commands' sandbox, or None when bubblewrap is not there, cannot start, or
    cannot nest in the server's own sandbox.
    `roots`: the agent's workspace roots; `covered`: the runtime's roots (config, state,
    persistent dir, Claude Code's private dirs); `hidden`: `private_paths`."""
    bwrap, shell, true = (shutil.which(name, path=path) for name in ("bwrap", "bash", "true"))
    # Where it starts but cannot nest, an unconfined server's write tool follows a symlink to the
    # wrapper in its own dir and rewrites it: its commands would run bare. None: Bash denied,
    # said in backend_status.
    userns = userns_here(bwrap, true) if bwrap and shell and true else None
    if not (bwrap and shell) or userns is None:
        return None
    real_roots = sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)})
    real_covered = sorted({os.path.realpath(c) for c in covered if c} - {"/"})
    extra = resolv_binds((*SHARED, *real_covered))  # /etc/resolv.conf may point into /run
    return Confinement(bwrap=bwrap, shell=shell, roots=tuple(real_roots), covered=tuple(real_covered),
                       hidden=tuple(hidden), network=network, extra=extra, server=True, userns=userns)
