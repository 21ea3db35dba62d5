"""`caldera run [--agent NAME | --manifest PATH --state-dir DIR]`"""
from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from caldera.cli import add_agent_flags

if TYPE_CHECKING:
    import argparse

    from caldera.cli import Args
    from caldera.daemon.signals import Signals
    from caldera.daemon.wiring import Parts

# The flags are add_agent_flags' only: the daemon parses them without argparse
# (caldera/cli/fastpath.py, agent_args).
AGENT_FLAGS_ONLY = True


def configure(parser: argparse.ArgumentParser) -> None:
    add_agent_flags(parser)


def open_parts(args: Args, role: str) -> Parts:
    """Paths, settings, logging and the runtime's parts, for the commands that talk to the control plane."""
    # here, not at the top: the daemon's modules import the HTTP client; `caldera run --help` does without them
    from caldera.config import (
        agent_from_args,
        gateway_from_env,
        implicit_workspace_root,
        load_settings,
        workspace_roots_in_runtime_roots,
    )
    from caldera.daemon.wiring import build_parts
    from caldera.host import logsetup

    paths = agent_from_args(args)
    settings = load_settings(paths)
    # Only the daemon supervises a process-mode agent; a one-shot report reads its state.
    parts = build_parts(paths, settings, supervise=(role == "daemon"))
    logsetup.setup(settings.log_level, parts.redactor)
    if settings.plain_http_host:  # SPEC section 3: named once at start, the host only
        logging.getLogger("caldera").warning(
            "the control plane at %s is reached over plain http: nothing on the way is encrypted",
            settings.plain_http_host)
    gateway = gateway_from_env(settings.env)
    for warning in gateway.warnings() if gateway is not None else []:  # SPEC section 10: named once at start
        logging.getLogger("caldera").warning("%s", warning)
    unused_root = implicit_workspace_root(settings.env)[1]
    if unused_root:  # named once at start, as the gateway's
        logging.getLogger("caldera").warning("%s", unused_root)
    for warning in workspace_roots_in_runtime_roots(settings.env):  # as the gateway's
        logging.getLogger("caldera").warning("%s", warning)
    return parts


def main(args: Args) -> int:
    # As a container's PID 1 this process split into an orphan reaper and the runtime while
    # caldera.cli was imported (caldera/cli/__init__.py): here it is the runtime.
    # here, as above
    from caldera.daemon import run as daemon
    from caldera.daemon.signals import Signals
    from caldera.host.memtune import fix_mmap_threshold, limit_malloc_arenas

    # First: a SIGTERM during start-up is then a graceful stop, and one held across a
    # restart in place reaches a handler (caldera.daemon.signals).
    signals = Signals()
    signals.install()
    limit_malloc_arenas()  # before any thread starts: see caldera/host/memtune.py
    fix_mmap_threshold()
    code = daemon.run(open_parts(args, "daemon"), signals)
    if code == daemon.REEXEC:
        _restart_in_place(signals)  # returns only when a stop came at the last moment
        code = 0
    daemon.arm_exit_guard()  # nothing may hold the process at the interpreter's exit
    return code


def _restart_in_place(signals: Signals) -> None:
    """After a reload that changed the configuration: the same command again, same PID
    (systemd keeps tracking it; the new process says READY=1, which ends the reload).
    The signals are held (the kernel keeps them for the new process); a stop that a
    thread other than this one took meanwhile is counted by now, and wins; one it takes
    after this look leaves its byte in the pipe handed over to the new process."""
    logging.shutdown()
    sys.stderr.flush()
    if signals.count:
        return
    signals.hand_over()
    os.execv(sys.executable, restart_argv())


def restart_argv() -> list[str]:
    """The interpreter's own command line as it started this process (the console script's
    path and its words, or `-m caldera.cli …` with its options): the package comes from
    where it came from. Not `-m caldera.cli` always: `-m` puts the current directory first on
    sys.path, and a directory named `caldera` there (a clone in $HOME, where the console
    script was typed) would shadow the package and end the restarted daemon."""
    return [sys.executable, *sys.orig_argv[1:]]
