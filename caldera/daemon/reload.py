"""SIGHUP / `systemctl reload caldera@NAME`: re-read agent.env and secrets.env.

The daemon compares the files' settings with those it runs on and logs the
names that changed, never their values. Nothing changed: the auth path is
unblocked (the control plane may have been fixed) and the daemon goes on. A
name changed: the daemon stops as on SIGTERM (drain, flush, final report) and
then restarts itself in place with the same PID (`os.execv`, in caldera.cli.run),
so that every part (client, session, adapter environment) starts from the new
settings. A file that no longer loads is logged and the running settings are
kept: a reload never stops a working agent.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from caldera.config import changed_names, load_settings
from caldera.errors import ConfigError

if TYPE_CHECKING:
    from caldera.daemon.wiring import Parts

log = logging.getLogger("caldera.daemon.reload")


def reread(parts: Parts) -> bool:
    """True when the configuration changed and the daemon must restart in place."""
    paths = parts.paths
    try:
        fresh = load_settings(paths)
    except (ConfigError, OSError) as exc:
        log.error("reload: %s; keeping the running configuration", _sentence(exc))
        return False
    changed = changed_names(parts.settings.env, fresh.env)
    if not changed:
        log.info("reload: %s and %s unchanged", paths.agent_env, paths.secrets_env)
        if parts.auth is not None:
            parts.auth.unblock()
            parts.wake.heartbeat.set()
        return False
    log.info("reload: changed %s; restarting in place with the new configuration", ", ".join(changed))
    return True


def _sentence(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)
