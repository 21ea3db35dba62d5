"""`caldera report --once [--deadline S]`: one report for cron hosts (see caldera.daemon.report_once)."""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from caldera.cli import add_agent_flags
from caldera.errors import UsageError

if TYPE_CHECKING:
    import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true", required=True, help="one report, then exit")
    parser.add_argument("--deadline", type=float, default=50.0, metavar="S",
                        help="stop running commands after S seconds (default 50)")
    add_agent_flags(parser)


def main(args: argparse.Namespace) -> int:
    # here, not at the top: the daemon's modules import the HTTP client; `caldera report --help` does without them
    from caldera.cli.run import open_parts
    from caldera.daemon.report_once import report_once, take_lock
    from caldera.daemon.startnotes import start_warnings
    from caldera.host.fsutil import StateLock

    if args.deadline <= 0:
        raise UsageError("--deadline must be a positive number of seconds")
    started = time.monotonic()
    deadline = started + args.deadline
    parts = open_parts(args, "report")
    start_warnings(parts)
    if parts.client is None:
        print(f"caldera report: the control plane is not enabled (CALDERA_AGENT_ENABLED is not true): set it, "
              f"CALDERA_BASE_URL and CALDERA_INSTANCE_ID in {parts.paths.agent_env} and CALDERA_TOKEN in "
              f"{parts.paths.secrets_env}", file=sys.stderr)
        return 1
    lock = StateLock(parts.paths.state_dir, "report")
    why = take_lock(lock, deadline, parts.wake.stop)
    if why == "daemon":
        print(f"caldera report: the daemon ({lock.holder()}) runs agent {parts.paths.name} and reports itself")
        return 0
    if why:
        print(f"caldera report: {why}", file=sys.stderr)
        return 1
    with lock:
        return report_once(parts, deadline)
