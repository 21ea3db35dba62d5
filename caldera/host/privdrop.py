"""Root running an agent verb becomes the agent's service user first.

An admin's `sudo caldera pause` (or status, report --once, run …) would
otherwise leave root-owned files in /var/lib/caldera/NAME/ (state.json, the
outbox, the manifest cache, the adapter's own files) that the unit, running as
`caldera`, then cannot write. So when root acts on the installed layout (the
state root belongs to the service user), the process switches to that user,
its groups and its HOME before it opens anything. Elsewhere (a checkout, a
test's temp dir, a host without the user) nothing changes.

That user is the agent's account (SPEC section 11): `caldera` for an agent installed
into its bundle, the owner for an agent that lives in a user's home. `caldera init`
gives the agent's state dir to that account (and systemd's StateDirectory= keeps it
so), so the state dir's owner says whom to become: the owner of a real directory (lstat),
never of what a link there points to (a link: stay the service user, with a sentence).
"""
from __future__ import annotations

import os
import pwd
import stat
import sys

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from _typeshed import StrPath

SERVICE_USER = "caldera"


def service_user_for(state_root: StrPath, user: str = SERVICE_USER, agent: str | None = None
                     ) -> pwd.struct_passwd | None:
    """The passwd entry to switch to, or None when this process should stay as it is.

    agent: the agent acted on; when its state dir belongs to another account than the
    service user (a home agent), that account is the one to become.
    """
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
    if owner != entry.pw_uid or entry.pw_uid == 0:
        return None
    return _agent_account(state_root, agent) or entry


def _agent_account(state_root: StrPath, agent: str | None) -> pwd.struct_passwd | None:
    """The owner of the agent's state dir (without a name: of the only one) when that is
    neither root nor unknown."""
    if agent is None:
        try:
            names = [n for n in os.listdir(state_root) if not n.startswith(".")]
        except OSError:
            return None
        agent = names[0] if len(names) == 1 else None
    if not agent or "/" in agent or agent in (".", ".."):
        return None
    path = os.path.join(state_root, agent)
    try:
        st = os.lstat(path)  # not stat: a link's target says nothing about the agent
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        # The state root is the service user's: whoever planted this chose the target's owner.
        sys.stderr.write(f"caldera: {path} is not a directory of its own (a link?): acting as the service "
                         f"user, not as the owner of what it points to; remove it and re-run caldera init\n")
        return None
    try:
        return pwd.getpwuid(st.st_uid) if st.st_uid != 0 else None
    except KeyError:
        return None


def become(entry: pwd.struct_passwd, environ: MutableMapping[str, str] = os.environ) -> None:
    """Switch groups, gid, then uid (the order that still has the right to), and HOME."""
    os.initgroups(entry.pw_name, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    environ["HOME"] = entry.pw_dir
    environ["USER"] = environ["LOGNAME"] = entry.pw_name
    os.umask(0o077)
