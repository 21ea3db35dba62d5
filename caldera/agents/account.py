"""Which account runs an agent (SPEC section 11), chosen at `caldera init` and realised in a drop-in.

Two kinds of agent:

- a **bundle** agent (the default) is installed into `<config-dir>/agents/NAME/bundle/`
  and runs as the system user `caldera`, under the unit as shipped;
- a **home** agent lives in its owner's home (seed 000's `/home/agent/task-agent`):
  nothing is copied, and its runtime (so its adapter) runs as that account. `caldera
  init` writes `/etc/systemd/system/caldera@NAME.service.d/caldera-account.conf`
  (User=, Group=, and a home made writable for this instance only: ProtectHome=tmpfs
  hides every other home, BindPaths= brings back the account's own).

The account is named (`caldera init … --user ACCOUNT`) or derived from the owner of an
absolute `runtime.workdir` that lies in its owner's home. Refused, each with a sentence:
an account that does not exist, a workdir that does not belong to it, a system account
(or root) for a home agent, a home agent whose workdir is not an absolute path.
"""
from __future__ import annotations

import grp
import os
import pwd
import re
from pathlib import Path

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import StrPath

SERVICE_USER = "caldera"
UNIT_DIR = Path("/etc/systemd/system")
DROP_IN = "caldera-account.conf"
LOGIN_DEFS = "/etc/login.defs"
NOBODY_UID = 65534


class AccountRefused(Exception):
    """The account cannot run this agent; the message says why."""


class Account:
    """The account an agent runs as: `caldera` (a bundle agent) or its owner (a home agent)."""

    __slots__ = ("name", "uid", "gid", "group", "home", "kind")

    def __init__(self, name: str, uid: int, gid: int, group: str, home: str, kind: str) -> None:
        self.name, self.uid, self.gid, self.group, self.home, self.kind = name, uid, gid, group, home, kind

    @property
    def is_home(self) -> bool:
        return self.kind == "home"

    def __repr__(self) -> str:
        return f"Account({self.name!r}, uid={self.uid}, kind={self.kind!r})"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _from_entry(entry: pwd.struct_passwd, kind: str) -> Account:
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, _group_name(entry.pw_gid), entry.pw_dir, kind)


def uid_min(login_defs: StrPath = LOGIN_DEFS) -> int:
    """The first uid of a regular account (login.defs' UID_MIN; 1000 as Debian's default)."""
    try:
        with open(login_defs, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                match = re.match(r"\s*UID_MIN\s+(\d+)\s*$", line)
                if match:
                    return int(match.group(1))
    except OSError:
        pass
    return 1000


def is_system_account(entry: pwd.struct_passwd, login_defs: StrPath = LOGIN_DEFS) -> bool:
    return entry.pw_uid == 0 or entry.pw_uid < uid_min(login_defs) or entry.pw_uid >= NOBODY_UID


def _within(path: Path, parent: str) -> bool:
    parent_path = Path(parent)
    return parent_path != Path("/") and (path == parent_path or parent_path in path.parents)


def _owner_entry(workdir: Path) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(os.stat(workdir).st_uid)
    except (OSError, KeyError):
        return None


def choose(workdir: str | None, user: str | None, *, login_defs: StrPath = LOGIN_DEFS) -> Account | None:
    """The account for an agent whose manifest says `runtime.workdir: workdir`.

    None: a bundle agent and no `caldera` user here (a checkout, a test, a container):
    the files keep the installer's owner. Raises AccountRefused with the sentence.
    """
    if user is None:
        derived = _derived(workdir)
        if derived is None:
            return _bundle_account()
        return _home_account(derived, workdir, login_defs)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise AccountRefused(f"--user {user}: no such account on this host (create it first, "
                             f"or install the agent into its bundle without --user)") from None
    if user == SERVICE_USER:
        return _from_entry(entry, "bundle")
    return _home_account(entry, workdir, login_defs)


def for_owner(owner: str) -> Account | None:
    """`caldera init --owner USER` (a name or a uid): a container image's user, who runs
    `caldera run` itself (docs/container.md): a bundle agent whose files are USER's. None when
    the installer is not root: what it writes is its own already."""
    try:
        entry = pwd.getpwuid(int(owner)) if owner.isdigit() else pwd.getpwnam(owner)
    except KeyError:
        raise AccountRefused(f"--owner {owner}: no such user here (create it before `caldera init`)") from None
    euid = os.geteuid()
    if euid != 0 and entry.pw_uid != euid:
        raise AccountRefused(f"--owner {owner}: only root can give the agent's files to another user")
    return _from_entry(entry, "bundle") if euid == 0 else None


def _derived(workdir: str | None) -> pwd.struct_passwd | None:
    """The owner of an absolute workdir in that owner's home (seed 000's checkout), else None."""
    if not workdir or not Path(workdir).is_absolute():
        return None
    path = Path(os.path.normpath(workdir))
    entry = _owner_entry(path)
    if entry is None or entry.pw_name == SERVICE_USER or not _within(path, entry.pw_dir):
        return None
    return entry


def _bundle_account() -> Account | None:
    if os.geteuid() != 0:
        return None
    try:
        return _from_entry(pwd.getpwnam(SERVICE_USER), "bundle")
    except KeyError:
        return None  # no system user (a container without the package): root keeps it


def _home_account(entry: pwd.struct_passwd, workdir: str | None, login_defs: StrPath) -> Account:
    name = entry.pw_name
    if is_system_account(entry, login_defs):
        raise AccountRefused(f"{name} (uid {entry.pw_uid}) is a system account: an agent that lives in a home "
                             f"runs as that home's regular account (an agent for the system user {SERVICE_USER} "
                             "is installed into its bundle, without --user)")
    if not workdir or not Path(workdir).is_absolute():
        raise AccountRefused(f"runtime.workdir {workdir or '(none)'}: an agent that runs as {name} lives where it is, "
                             f"so its manifest names its checkout by an absolute path (e.g. {entry.pw_dir}/NAME)")
    path = Path(os.path.normpath(workdir))
    try:
        owner = os.stat(path).st_uid
    except FileNotFoundError:
        raise AccountRefused(f"runtime.workdir {path} does not exist") from None
    except OSError as exc:
        raise AccountRefused(f"runtime.workdir {path}: {exc.strerror}") from None
    if owner != entry.pw_uid:
        try:
            owner_name = pwd.getpwuid(owner).pw_name
        except KeyError:
            owner_name = f"uid {owner}"
        raise AccountRefused(f"runtime.workdir {path} belongs to {owner_name}, not {name}: the account that runs "
                             f"the agent owns its checkout (chown -R {name}: {path}, or --user {owner_name})")
    return _from_entry(entry, "home")


# ------------------------------------------------------------ the drop-in

def drop_in_path(name: str, unit_dir: StrPath = UNIT_DIR) -> Path:
    return Path(unit_dir) / f"caldera@{name}.service.d" / DROP_IN


def drop_in_text(account: Account) -> str:
    """The [Service] lines for a home agent: its account, and its home writable for this instance only."""
    return (f"# Written by `caldera init` (docs/packaging.md, \"An agent that lives in a user's home\").\n"
            f"# This agent lives in {account.home}: its runtime and adapter run as {account.name}.\n"
            "# Every other home is hidden (an empty tmpfs); the account's own is bound back, writable.\n"
            "[Service]\n"
            f"User={account.name}\n"
            f"Group={account.group}\n"
            "ProtectHome=tmpfs\n"
            f"BindPaths={account.home}\n")


def installed_user(name: str, unit_dir: StrPath = UNIT_DIR) -> str:
    """The account an installed agent runs as: its drop-in's User=, else `caldera`."""
    try:
        text = drop_in_path(name, unit_dir).read_text(encoding="utf-8")
    except OSError:
        return SERVICE_USER
    for line in text.splitlines():
        if line.startswith("User="):
            return line[len("User="):].strip()
    return SERVICE_USER


def write_drop_in(name: str, account: Account | None, unit_dir: StrPath = UNIT_DIR) -> Path | None:
    """A home agent's drop-in written (0644, root's); a bundle agent's removed. The path written, or None."""
    path = drop_in_path(name, unit_dir)
    if account is None or not account.is_home:
        try:
            path.unlink()
            path.parent.rmdir()
        except OSError:
            pass
        return None
    if not Path(unit_dir).is_dir():
        return None  # no systemd here (a container, a test without one): nothing to realise
    path.parent.mkdir(mode=0o755, exist_ok=True)
    tmp = path.with_name(f".{DROP_IN}.tmp")
    tmp.write_text(drop_in_text(account), encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


# ------------------------------------------------------------ owners

def give_config(config_dir: Path, account: Account) -> None:
    """agent.env root:GROUP 0640, secrets.env (and the secret projection) ACCOUNT:GROUP 0600."""
    os.chown(config_dir / "agent.env", 0, account.gid)
    os.chmod(config_dir / "agent.env", 0o640)
    os.chown(config_dir / "secrets.env", account.uid, account.gid)
    os.chmod(config_dir / "secrets.env", 0o600)
    secrets = config_dir / "secrets"
    if secrets.is_dir():
        give_tree(secrets, account)


def give_tree(root: Path, account: Account) -> None:
    """Everything under root (root too) to the account, links not followed: no file the
    account cannot use is left behind (a kind switch, root's earlier runs)."""
    os.lchown(root, account.uid, account.gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            os.lchown(os.path.join(dirpath, entry), account.uid, account.gid)
