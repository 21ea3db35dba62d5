"""systemd's notification protocol (sd_notify), stdlib only.

The unit is `Type=notify` with `WatchdogSec=`: systemd passes `$NOTIFY_SOCKET`
(a filesystem path, or `@name` for an abstract socket) and, with a watchdog,
`$WATCHDOG_USEC` and `$WATCHDOG_PID`. A state is one datagram of
newline-separated `KEY=VALUE` assignments. Outside systemd (a terminal, cron,
tests) there is no socket and every call is a cheap no-op returning False.

Who sends what is the daemon's business (docs/packaging.md, "sd_notify"):
`READY=1` once its loops run, `WATCHDOG=1` from its own liveness check only,
`STOPPING=1` when it starts draining, `EXTEND_TIMEOUT_USEC=` while a process
agent's graceful stop outlasts the unit's `TimeoutStopSec`.
"""
from __future__ import annotations

import logging
import os
import socket

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger("caldera.host.sdnotify")
SEND_TIMEOUT = 2.0  # seconds


def _address(raw: str) -> str | bytes | None:
    """The socket address systemd gave, or None when it is not one we can use."""
    if raw.startswith("@"):
        # Abstract namespace: a leading NUL byte, the rest verbatim (no trailing NUL).
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    return None  # e.g. "vsock:…" (systemd >= 254): not used on the hosts we target


def by_systemd(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether systemd runs this process as a notify unit (caldera@NAME): what the daemon's
    advice depends on (`systemctl reload`, or a signal to a process started by hand)."""
    return bool(environ.get("NOTIFY_SOCKET"))


def notify(state: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Send `state` (e.g. "READY=1") to systemd; True when the datagram was sent.

    False when there is no `$NOTIFY_SOCKET`, its address is not usable, or the
    send failed (logged at debug level: a missing notification must never stop
    the daemon, and systemd itself reports a unit that never became ready).
    """
    raw = environ.get("NOTIFY_SOCKET")
    if not raw or not state:
        return False
    address = _address(raw)
    if address is None:
        log.debug("NOTIFY_SOCKET=%r is not a unix socket address; not notifying", raw)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # A listener whose queue is full would block a datagram send forever;
            # the daemon's main thread sends these, so bound the wait.
            sock.settimeout(SEND_TIMEOUT)
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.debug("sd_notify %r to %s failed: %s", state, raw, exc)
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """The watchdog timeout in seconds when systemd expects pings from this process, else None.

    Ping at half of it. `$WATCHDOG_PID`, when set, names the process the
    watchdog is meant for: a child that inherited the environment must not
    ping on the daemon's behalf, so for any other pid the answer is None.
    """
    raw = environ.get("WATCHDOG_USEC")
    if not raw:
        return None
    try:
        usec = int(raw)
    except ValueError:
        log.debug("WATCHDOG_USEC=%r is not a number; no watchdog", raw)
        return None
    if usec <= 0:
        return None
    wanted = environ.get("WATCHDOG_PID")
    if wanted:
        try:
            if int(wanted) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            log.debug("WATCHDOG_PID=%r is not a number; no watchdog", wanted)
            return None
    return usec / 1_000_000
