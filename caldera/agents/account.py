"""Which account runs an agent (SPEC section 11), chosen at `caldera init` and realised in a drop-in.

Two kinds of agent:

- a **bundle** agent (the default) is installed into `<config-dir>/agents/NAME/bundle/`
  and runs as the system user `caldera`, under the unit as shipped;
- a **home** agent lives in its owner's home (seed 000's `/home/agent/task-agent`):
  nothing is copied, and its runtime (so its adapter) runs as that account. `caldera
  init` writes `/etc/systemd/system/caldera@NAME.service.d/caldera-account.conf`
  (User=, Group=, and a home made writable for this instance only: ProtectHome=tmpfs
  hides every other home, BindPaths= brings back the account's own).

A home agent's account is named (`caldera init … --user ACCOUNT`), never derived from
the manifest (its writer controls it). Refused, each with a sentence: an account that does
not exist, a system account (or root), a home that does not exist or is `/`, a workdir that
is not an absolute path inside that home or does not belong to the account, a checkout or
manifest that is not the account's (or a link). Root opens what it hands over with
O_NOFOLLOW and walks it by fd: a link planted in the state dir changes nothing outside.
"""
from __future__ import annotations

import errno
import grp
import os
import pwd
import re
import stat
from pathlib import Path

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import StrPath

SERVICE_USER = "caldera"
UNIT_DIR = Path("/etc/systemd/system")
DROP_IN = "caldera-account.conf"
LOGIN_DEFS = "/etc/login.defs"
NOBODY_UID = 65534
MAX_MANIFEST = 1024 * 1024


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


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def choose(workdir: str | None, user: str | None, *, login_defs: StrPath = LOGIN_DEFS) -> Account | None:
    """The account for an agent whose manifest says `runtime.workdir: workdir`.

    A home agent is named (`--user ACCOUNT`), never derived: the workdir comes from the
    manifest, which its writer controls, so its owner says nothing about who may run it.
    None: a bundle agent and no `caldera` user here (a checkout, a test, a container):
    the files keep the installer's owner. Raises AccountRefused with the sentence.
    """
    if user is None:
        return _bundle_account()
    entry = named(user)
    if user == SERVICE_USER:
        return _from_entry(entry, "bundle")
    return _home_account(entry, workdir, login_defs)


def named(user: str) -> pwd.struct_passwd:
    """`--user ACCOUNT`'s passwd entry, or AccountRefused."""
    try:
        return pwd.getpwnam(user)
    except KeyError:
        raise AccountRefused(f"--user {user}: no such account on this host (create it first, "
                             f"or install the agent into its bundle without --user)") from None


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


def _bundle_account() -> Account | None:
    if os.geteuid() != 0:
        return None
    try:
        return _from_entry(pwd.getpwnam(SERVICE_USER), "bundle")
    except KeyError:
        return None  # no system user (a container without the package): root keeps it


def _unsafe_path(path: str) -> bool:
    """A path no drop-in line can carry (a newline, a control character)."""
    return any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path)


def refuse_system(entry: pwd.struct_passwd, login_defs: StrPath = LOGIN_DEFS) -> None:
    """AccountRefused for a system account (or root) named for a home agent."""
    if is_system_account(entry, login_defs):
        raise AccountRefused(f"{entry.pw_name} (uid {entry.pw_uid}) is a system account: an agent that lives in a "
                             f"home runs as that home's regular account (an agent for the system user {SERVICE_USER} "
                             "is installed into its bundle, without --user)")


def _home_account(entry: pwd.struct_passwd, workdir: str | None, login_defs: StrPath) -> Account:
    """A home agent's account, once its home, its workdir and their owners fit (SPEC section 11)."""
    name = entry.pw_name
    refuse_system(entry, login_defs)
    home = entry.pw_dir
    if (not home or not os.path.isabs(home) or _unsafe_path(home)
            or os.path.realpath(home) == "/" or os.path.normpath(home) == "/"):
        raise AccountRefused(f"{name}'s home is {home or '(none)'}: an agent that runs as {name} lives in a "
                             "home of its own (the unit makes only that home writable), not in / or nowhere")
    if not os.path.isdir(home):
        raise AccountRefused(f"{name}'s home {home} does not exist: create it (and the checkout in it) first")
    if not workdir or not Path(workdir).is_absolute():
        raise AccountRefused(f"runtime.workdir {workdir or '(none)'}: an agent that runs as {name} lives where it is, "
                             f"so its manifest names its checkout by an absolute path (e.g. {home}/NAME)")
    path = Path(os.path.normpath(workdir))
    if not (_within(path, home) and _within(Path(os.path.realpath(path)), os.path.realpath(home))):
        raise AccountRefused(f"runtime.workdir {path} is not inside {name}'s home {home}: the unit makes only "
                             f"that home writable for this agent, so its checkout lives there")
    try:
        owner = os.stat(path).st_uid
    except FileNotFoundError:
        raise AccountRefused(f"runtime.workdir {path} does not exist") from None
    except OSError as exc:
        raise AccountRefused(f"runtime.workdir {path}: {exc.strerror}") from None
    if owner != entry.pw_uid:
        owner_name = _owner_name(owner)
        raise AccountRefused(f"runtime.workdir {path} belongs to {owner_name}, not {name}: the account that runs "
                             f"the agent owns its checkout (chown -R {name}: {path}, or --user {owner_name})")
    return _from_entry(entry, "home")


def check_checkout(directory: Path, manifest_name: str, entry: pwd.struct_passwd) -> bytes:
    """The manifest of a home agent's checkout, read as root without following links.

    The checkout directory must be the account's, the manifest a regular file (not a link)
    owned by it or by root: else AccountRefused, and nothing outside the checkout is read.
    """
    name = entry.pw_name
    refuse_system(entry)
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise AccountRefused(f"{directory}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise AccountRefused(f"{directory}: an agent that lives in a home is installed from its checkout, "
                             "a directory (not a link, not an archive)")
    if st.st_uid != entry.pw_uid:
        raise AccountRefused(f"{directory} belongs to {_owner_name(st.st_uid)}, not {name}: the account that runs "
                             "the agent owns its checkout")
    manifest = directory / manifest_name
    try:
        fd = os.open(manifest, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "a link (refused: root reads only the checkout's own file)" if exc.errno == errno.ELOOP else exc.strerror
        raise AccountRefused(f"{manifest}: {why}") from None
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode):
            raise AccountRefused(f"{manifest}: not a regular file")
        if fst.st_uid not in (entry.pw_uid, 0):
            raise AccountRefused(f"{manifest} belongs to {_owner_name(fst.st_uid)}, not {name}: the account that "
                                 "runs the agent owns its manifest")
        if fst.st_size > MAX_MANIFEST:
            raise AccountRefused(f"{manifest}: over {MAX_MANIFEST // 1024} KiB, not a manifest")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(MAX_MANIFEST + 1)
    finally:
        os.close(fd)


# ------------------------------------------------------------ the drop-in

def drop_in_path(name: str, unit_dir: StrPath = UNIT_DIR) -> Path:
    return Path(unit_dir) / f"caldera@{name}.service.d" / DROP_IN


def unit_path(path: str) -> str:
    """A path as one word of a systemd unit setting (systemd.exec, BindPaths=): `%` doubled
    (specifiers expand even in quotes), `\\`, `"` and `:` (BindPaths' separator) backslash-escaped,
    the whole quoted when it holds a space. A control character cannot be carried: ValueError."""
    if _unsafe_path(path):
        raise ValueError(f"{path!r}: a control character cannot be written into a unit")
    word = (path.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"').replace(":", "\\:"))
    return f'"{word}"' if any(ch.isspace() for ch in word) else word


def drop_in_text(account: Account) -> str:
    """The [Service] lines for a home agent: its account, and its home writable for this instance only."""
    home = unit_path(account.home)
    return (f"# Written by `caldera init` (docs/packaging.md, \"An agent that lives in a user's home\").\n"
            f"# This agent lives in {home.replace('%%', '%')}: its runtime and adapter run as {account.name}.\n"
            "# Every other home is hidden (an empty tmpfs); the account's own is bound back, writable.\n"
            "[Service]\n"
            f"User={account.name}\n"
            f"Group={account.group}\n"
            "ProtectHome=tmpfs\n"
            f"BindPaths={home}\n")


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

def refuse_link(path: Path) -> AccountRefused:
    """The sentence for a path that is a link or not a directory where one is needed."""
    return AccountRefused(f"{path} is not a directory of its own (a link, or another kind of file): caldera init "
                          "follows no link as root and changed nothing there; remove it and run caldera init again")


def open_dir(path: Path, *, dir_fd: int | None = None, name: str | None = None) -> int:
    """A directory opened without following a link (O_DIRECTORY|O_NOFOLLOW): its fd, or
    AccountRefused. name: the entry to open under dir_fd (path then only names it)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name if name is not None else path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise refuse_link(path) from None
        raise


def give_file(dir_fd: int, name: str, uid: int, gid: int, mode: int) -> None:
    """dir_fd's regular file `name` to uid:gid with mode, through its own fd (no link followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AccountRefused(f"{name}: a link where a file is expected; caldera init follows no link as root"
                                 ) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AccountRefused(f"{name}: not a regular file")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def give_config(config_dir: Path, account: Account) -> None:
    """agent.env root:GROUP 0640, secrets.env (and the secret projection) ACCOUNT:GROUP 0600."""
    fd = open_dir(config_dir)
    try:
        give_file(fd, "agent.env", 0, account.gid, 0o640)
        give_file(fd, "secrets.env", account.uid, account.gid, 0o600)
        try:
            secrets = open_dir(config_dir / "secrets", dir_fd=fd, name="secrets")
        except FileNotFoundError:
            return
        try:
            give_tree_fd(secrets, account)
        finally:
            os.close(secrets)
    finally:
        os.close(fd)


def give_tree_fd(fd: int, account: Account) -> None:
    """Everything under the directory fd (it too) to the account, no path re-resolved and no
    link followed (os.fwalk from the fd, chown relative to each directory's own fd): no file
    the account cannot use is left behind (a kind switch, root's earlier runs), and a link
    planted inside hands over nothing outside."""
    os.fchown(fd, account.uid, account.gid)
    for _, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
        for entry in dirnames + filenames:
            os.chown(entry, account.uid, account.gid, dir_fd=dir_fd, follow_symlinks=False)
