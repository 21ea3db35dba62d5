"""`codex app-server` inside caldera's bubblewrap (backends/confine.py): its commands read
nothing of the runtime's roots.

Codex's own sandbox (its bubblewrap, nested inside ours) confines the agent's commands' writes
and network, and cannot deny a read: alone, a command of one agent read every agent's
`secrets.env`, projection and `session.json` (issue 43). So the app-server itself, and with it
every command, tool and helper it starts, runs in a mount namespace where the runtime's roots,
the other agents' workspace roots (confine.other_workspace_roots), `/tmp`, `/var/tmp` and `/run`
are empty and the agent's private paths hidden; bound back are only the run's own dir
(CODEX_HOME, HOME, TMPDIR: writable), the turn's workspace (writable for `workspace-write`,
else read-only), the agent's own workspace roots where another's holds them, the binary and
its bundled resources (read-only).

Where bubblewrap is missing, cannot start (no user namespaces) or Codex's own sandbox cannot
start inside it, the app-server runs as before, and `backend_status` `starting` says so
(`commands`): Codex's sandbox is then all there is, and it denies no read.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from caldera import config
from caldera.backends import confine, leftovers
from caldera.backends import failures as fk
from caldera.backends.codex.binary import bundled_bwrap

if TYPE_CHECKING:
    from caldera.backends.base import Environment, RunRequest

FLAGS = ("--unshare-ipc", "--die-with-parent")  # the app-server's own IPC; gone with the runtime's thread
RESOURCES = ("codex-resources", "codex-path")  # beside bin/ in the npm package's vendor dir: its bwrap


def plan(environment: Environment, binary: str | None, path: str, confined: bool = True,
         workspace: str | None = None) -> tuple[confine.Box | None, str]:
    """The app-server's Box (None: none) and what `backend_status` says of its commands.
    `workspace`: the run's, never covered as another agent's root.
    `confined` False leaves it out (CALDERA_RUN_SANDBOX=external: the operator's container is
    the sandbox, and Codex's own is off too: `externalSandbox`)."""
    if not confined:
        return None, "external (CALDERA_RUN_SANDBOX=external: the container is the sandbox)" + confine.PROC1_READABLE
    bundled = bundled_bwrap(binary)
    why = confine.unavailable(path, bundled)
    if why is not None:
        return None, (f"Codex's own sandbox only ({why}): its commands read every file this account can, "
                      "other agents' secrets.env, session.json and workspaces included")
    found = confine.which(path, bundled)
    assert found is not None  # unavailable() said it is there
    state_dir = os.path.dirname(os.path.abspath(environment.logs_dir))
    hidden = confine.private_paths(environment.secrets_dir, state_dir, environment.credentials_dir)
    covered = confine.runtime_roots(environment.config_root, environment.state_root, environment.persistent_dir)
    own = [*config.workspace_roots(environment.env), *([workspace] if workspace else [])]
    others = confine.other_workspace_roots(environment.config_root, own, [binary])
    box = confine.Box(bwrap=found[0], covered=tuple(covered), hidden=tuple(hidden),
                      readable=confine.resolv_binds((*confine.SHARED, *covered, *others, *hidden)), flags=FLAGS,
                      others=tuple(others), roots=confine.own_roots_in(own, others))
    return box, ("confined (caldera's bubblewrap: the runtime's roots and other agents' workspaces hidden; "
                 "Codex's own sandbox inside it)")


def argv(box: confine.Box | None, run: RunRequest, run_dir: Path, command: list[str]) -> list[str]:
    """`command` (the app-server's argv: its binary first) inside `box`, if any. Read-only: the
    binary's dir and its package's resources (a covered dir may hold them: the roots and
    secrets inside are hidden again), the workspace for `read-only`."""
    if box is None:
        return command
    workspace, own = os.path.realpath(run.workspace), os.path.realpath(run_dir)
    real = Path(os.path.realpath(command[0]))
    programs = {os.path.dirname(command[0]), str(real.parent), *(str(real.parent.parent / n) for n in RESOURCES)}
    read_only = sorted(p for p in programs if os.path.isdir(p))
    _refuse_programs(box, read_only)
    if run.policy.sandbox == "workspace-write":
        return [*box.argv([workspace, own], read_only), *command]
    return [*box.argv([own], [workspace, *read_only]), *command]


def _refuse_programs(box: confine.Box, programs: list[str]) -> None:
    """BackendFailure where a dir of the binary's lies in one of the runtime's roots: bound
    back, it would show what else that dir holds (a CALDERA_CODEX_BIN symlink in the state root
    bound the state root whole; one in <state root>/other would show its session.json). The
    temporary dir is the exception: it is covered for the private dirs other runs make in it,
    and a binary's own dir holds none of them. A dir that is a private path: Box.argv refuses."""
    tmp = os.path.realpath(leftovers.tmp_root())
    for path in programs:
        holder = confine.within(path, [p for p in box.covered if p != tmp])
        if holder is not None:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED, f"the Codex binary's dir {path} lies in {holder}, "
                                    "one of the runtime's roots: install Codex outside them")
