"""`status.json`: what `caldera status` shows, for users who may not read the state dir.

The state directory is 0711 and its files 0600 (user caldera): an admin
without sudo can reach this one file by name and nothing else. The daemon
writes it before READY=1, after every state report and once after the stop
(the outbox as the final flush left it): the adapter's status as last
reported, the connection, the outbox depth and its own PID, through
the Redactor (no secret in it, like everything `caldera status` prints).
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from caldera.daemon.heartbeat import CONNECTION_KEY
from caldera.daemon.life import RECENT_KEY
from caldera.daemon.live import DROPS_KEY
from caldera.host.fsutil import atomic_write_json
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from caldera.daemon.wiring import Parts

log = logging.getLogger("caldera.daemon.snapshot")
NAME = "status.json"


def write_snapshot(parts: Parts) -> None:
    doc = {
        "written_at": rfc3339(),
        "daemon_pid": os.getpid(),
        "agent_status": (parts.live.last_section or {}).get("agent_status"),
        "connection": parts.state.get(CONNECTION_KEY) or {},
        "outbox": {"items": parts.outbox.depth(), "dropped": parts.state.get(DROPS_KEY) or {}},
        "recent_commands": parts.state.get(RECENT_KEY) or [],
        "storage": parts.state.storage.failure(),  # a failing write the daemon saw (status.json may still fit)
        # no control plane (CALDERA_AGENT_ENABLED not true): `caldera status` says so, not "never connected"
        "local": not parts.settings.enabled or parts.client is None,
    }
    process = ((parts.live.last_section or {}).get("health") or {}).get("agent_process")
    if process is not None:  # process mode: pid, uptime, restarts, last exit, hold (agents/process)
        doc["process"] = process
    path = parts.paths.state_dir / NAME
    try:
        atomic_write_json(path, parts.redactor(doc), mode=0o644)
    except OSError as exc:  # the report went out; only this local view is stale
        log.warning("could not write %s: %s", path, exc)
