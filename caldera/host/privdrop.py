"""Root running an agent verb becomes the agent's service user first.

An admin's `sudo caldera pause` (or status, report --once, run …) would
otherwise leave root-owned files in /var/lib/caldera/NAME/ (state.json, the
outbox, the manifest cache, the adapter's own files) that the unit, running as
`caldera`, then cannot write. So when root acts on the installed layout (the
state root belongs to the service user), the process switches to that user,
its groups and its HOME before it opens anything. Elsewhere (a checkout, a
test's temp dir, a host without the user) nothing changes.
"""
from __future__ import annotations

import os
import pwd

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from _typeshed import StrPath

SERVICE_USER = "caldera"


def service_user_for(state_root: StrPath, user: str = SERVICE_USER) -> pwd.struct_passwd | None:
    """The passwd entry to switch to, or None when this process should stay as it is."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    try:
        owner = os.stat(state_root).st_uid
    except OSError:
        return None
    return entry if owner == entry.pw_uid and entry.pw_uid != 0 else None


def become(entry: pwd.struct_passwd, environ: MutableMapping[str, str] = os.environ) -> None:
    """Switch groups, gid, then uid (the order that still has the right to), and HOME."""
    os.initgroups(entry.pw_name, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    environ["HOME"] = entry.pw_dir
    environ["USER"] = environ["LOGNAME"] = entry.pw_name
    os.umask(0o077)
