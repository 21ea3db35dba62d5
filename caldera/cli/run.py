"""`caldera run [--agent NAME | --manifest PATH --state-dir DIR]`"""
from __future__ import annotations

from caldera.cli import add_agent_flags


def configure(parser) -> None:
    add_agent_flags(parser)


def open_runtime(args, role: str):
    """Paths, settings, logging and the Runtime, for the commands that talk to the control plane."""
    from caldera.host import logsetup
    from caldera.config import agent_from_args, load_settings
    from caldera.daemon.wiring import build_runtime

    paths = agent_from_args(args)
    settings = load_settings(paths)
    # The daemon validates adapter answers with jsonschema (imported once, then cheap);
    # a one-shot report uses the equivalent plain checks and skips the import.
    runtime = build_runtime(paths, settings, schema_checks=(role == "daemon"))
    logsetup.setup(settings.log_level, runtime.redactor)
    return runtime


def main(args) -> int:
    from caldera.daemon import run as daemon
    from caldera.host.memtune import limit_malloc_arenas

    limit_malloc_arenas()  # before any thread starts: see caldera/memtune.py
    runtime = open_runtime(args, "daemon")
    code = daemon.run(runtime)
    if code == daemon.REEXEC:
        _restart_in_place()
    return code


def _restart_in_place() -> None:
    """After a reload that changed the configuration: the same command again, same PID
    (systemd keeps tracking it; the new process says READY=1 again)."""
    import logging
    import os
    import sys

    logging.shutdown()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "caldera.cli", *sys.argv[1:]])
