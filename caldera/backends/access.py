"""Whether the agent's account can use a backend's secret projection, said as one sentence
that names the path, what is wrong and the `chown`/`chmod` that fixes it (issue 39: a
projection the account could not read ended the run as `internal error: PermissionError`).

The rules (SPEC section 2; docs/backends.md, "The projection: owner and modes"): the agent's
`secrets/` and everything in it belong to the agent's account (`caldera`, or a home agent's
owner) or to root (the agent cannot change what root owns), the account can enter every
directory and read every file; and no other account can read a file of it (a directory on the
way that is the account's alone, `secrets/` 0700, is enough). The run checks them before its
backend reads anything (`base.run_turn`), and `caldera check` and `caldera backends --agent
NAME` say the same sentence before any run (`readiness`). For a reader that is root (a runtime
in a container), a file others could read is a warning of `caldera check`, not a refusal: a
Kubernetes Secret is 0644 by default. systemd's `$CREDENTIALS_DIRECTORY` is systemd's to make
and is not looked at here.

Permissions are read from the modes, so that root can tell what the agent's account will meet;
root itself reads everything. An entry with an ACL counts its group bits (the ACL's mask) as
other accounts' always. Where others can walk to is computed on where each entry really is (a
symlink's target), not on the path of the link.
"""
from __future__ import annotations

import errno
import grp
import os
import pwd
import shlex
import stat
from pathlib import Path
from typing import NamedTuple

from caldera.host.jsonlimits import terminal_safe

MAX_ENTRIES = 256  # entries of a projection looked at, at most (a projection holds a handful)
MAX_DEPTH = 3  # <backend>/env/NAME


class Reader(NamedTuple):
    """The account that reads the projection: its name, uid, primary group and every group."""

    name: str
    uid: int
    gid: int
    group: str
    groups: frozenset[int]

    @classmethod
    def current(cls) -> Reader:
        """This process (the daemon runs as the agent's account)."""
        uid, gid = os.geteuid(), os.getegid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return cls(name, uid, gid, _group_name(gid), frozenset({gid, *os.getgroups()}))

    @classmethod
    def named(cls, name: str) -> Reader | None:
        """An account by name (root telling what the agent's account will meet), None if unknown."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, _group_name(entry.pw_gid),
                   frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid)))


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _allowed(st: os.stat_result, reader: Reader, bits: int) -> bool:
    """Whether the mode's class that applies to `reader` grants all of `bits` (4 read, 1 search)."""
    if reader.uid == 0:
        return True
    shift = 6 if st.st_uid == reader.uid else 3 if st.st_gid in reader.groups else 0
    return st.st_mode & (bits << shift) == bits << shift


def _has_acl(path: str | os.PathLike[str]) -> bool:
    try:
        os.getxattr(path, "system.posix_acl_access")
    except OSError as exc:
        # none, or a file system without ACLs; any other error: count one as there
        return exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.ENOENT)
    return True


def _others(st: os.stat_result, reader: Reader, bits: int, acl: bool = False) -> bool:
    """Whether another account gets any of `bits` (others; the group too unless it is the
    reader's own primary group, as `chown caldera:caldera` makes it, and there is no ACL: with
    one, the group bits are the mask of its named users' and groups' entries)."""
    mask = bits | (bits << 3 if acl or st.st_gid != reader.gid else 0)
    return bool(st.st_mode & mask)


def _reached_by_others(path: Path, reader: Reader) -> bool:
    """Whether another account can walk from / down into `path` (every directory searchable)."""
    for step in [*reversed(path.parents), path]:
        try:
            if not _others(os.stat(step), reader, 0o1, _has_acl(step)):
                return False
        except OSError:
            return False
    return True


class Findings(NamedTuple):
    problem: str | None  # what refuses the run
    warning: str | None  # what `caldera check` says and the run goes on with (a root reader's)


def problem(secrets_dir: str | os.PathLike[str] | None, backend: str, reader: Reader) -> str | None:
    """The first thing in the way of `reader` using `<secrets_dir>/<backend>/` (the secrets dir
    itself, then that backend's part of it), as one sentence; None when there is none, or no
    secrets dir at all (what a backend then lacks, it says itself)."""
    return findings(secrets_dir, backend, reader).problem


def findings(secrets_dir: str | os.PathLike[str] | None, backend: str, reader: Reader) -> Findings:
    """`problem`'s sentence, and the first warning (a root reader's file others can read)."""
    if not secrets_dir:
        return Findings(None, None)
    root = Path(secrets_dir)
    walk = _Walk(root, reader)
    found = walk.entry(root, only=backend)
    if found is None and walk.budget_spent:
        found = (f"{terminal_safe(str(root / backend))} has more than {MAX_ENTRIES} entries; not all checked "
                 "(a projection holds a few files: remove what its backend does not read)")
    return Findings(found, walk.warning)


class _Walk:
    """The projection, depth first and bounded: the first problem, and the first warning."""

    def __init__(self, root: Path, reader: Reader) -> None:
        self.root, self.reader = root, reader
        self.budget = iter(range(MAX_ENTRIES))  # each entry looked at takes one
        self.budget_spent = False
        self.warning: str | None = None

    def entry(self, path: Path, depth: int = 0, only: str | None = None) -> str | None:
        """`path` and what is below it; `only`: the one entry of it to go into (the secrets
        dir: the run's backend's)."""
        if next(self.budget, None) is None:
            self.budget_spent = True
            return None
        try:
            st = os.stat(path)  # a link is what it points to (the account reads through it)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._said(path, f"cannot be reached by {self.reader.name} ({exc.strerror})")
        is_dir = stat.S_ISDIR(st.st_mode)
        if not is_dir and path == self.root:
            return self._said(path, "is not a directory")
        real = Path(os.path.realpath(path))  # where others must walk to: a link's target, not the link
        wrong = self._wrong(path, st, is_dir, _has_acl(path), _reached_by_others(real.parent, self.reader))
        if wrong:
            return self._said(path, wrong)
        if not is_dir or depth >= MAX_DEPTH:
            return None
        try:
            names = [only] if only is not None else sorted(os.listdir(path))
        except OSError as exc:
            return self._said(path, f"cannot be listed by {self.reader.name} ({exc.strerror})")
        for name in names:
            found = self.entry(path / name, depth + 1)
            if found:
                return found
        return None

    def _said(self, path: Path, wrong: str) -> str:
        return sentence(self.root, path, self.reader, wrong)

    def _wrong(self, path: Path, st: os.stat_result, is_dir: bool, acl: bool, reach: bool) -> str | None:
        """What is wrong with one entry; `reach`: others can enter its directory. A root reader's
        file others can read is kept as the warning instead."""
        reader = self.reader
        mode = f"owner {_owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):o}{', an ACL' if acl else ''}"
        if not _allowed(st, reader, 0o5 if is_dir else 0o4):
            return f"cannot be {'opened' if is_dir else 'read'} by {reader.name} ({mode})"
        if reader.uid != 0 and st.st_uid not in (reader.uid, 0):  # root's: the agent cannot change it
            return f"belongs to {_owner_name(st.st_uid)}, not to {reader.name} or root ({mode})"
        if reach and not is_dir and _others(st, reader, 0o4, acl):
            wrong = f"can be read by other accounts ({mode}, in directories they can enter)"
            if reader.uid != 0:
                return wrong
            self.warning = self.warning or self._said(path, wrong)
        return None


def sentence(root: Path, path: Path, reader: Reader, wrong: str) -> str:
    """`PATH WRONG: FIX`: the fix gives the whole projection to the account, and to it alone.
    Paths as a terminal shows them safely (a file name may hold escapes), quoted in the fix."""
    where = shlex.quote(terminal_safe(str(root)))
    chown = f"chown -R {reader.name}:{reader.group} {where} && " if reader.uid != 0 else ""
    return (f"{terminal_safe(str(path))} {wrong}: the secret projection must be {reader.name}'s alone; "
            f"as root: {chown}chmod -R u=rwX,go= {where}")
