"""`status.json`: what `caldera status` shows, for users who may not read the state dir.

The state directory is 0711 and its files 0600 (user caldera): an admin
without sudo can reach this one file by name and nothing else. The daemon
rewrites it after every state report: the adapter's status as reported, the
connection, the outbox depth and its own PID, passed through the Redactor
(no secret in it, like everything `caldera status` prints).
"""
from __future__ import annotations

import logging
import os

from caldera.host.fsutil import atomic_write_json
from caldera.protocol.payloads import now_iso

log = logging.getLogger("caldera.daemon.snapshot")
NAME = "status.json"


def write_snapshot(runtime) -> None:
    doc = {
        "written_at": now_iso(),
        "daemon_pid": os.getpid(),
        "agent_status": (runtime.last_section or {}).get("agent_status"),
        "connection": runtime.state.get("connection") or {},
        "outbox": {"items": runtime.outbox.depth()},
    }
    try:
        atomic_write_json(runtime.paths.state_dir / NAME, runtime.redactor(doc), mode=0o644)
    except OSError as exc:  # the report went out; only the local view is stale
        log.warning("could not write %s: %s", runtime.paths.state_dir / NAME, exc)
