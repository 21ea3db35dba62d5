"""Whether the agent's account can use a backend's secret projection, said as one sentence
that names the path, what is wrong and the `chown`/`chmod` that fixes it (issue 39: a
projection the account could not read ended the run as `internal error: PermissionError`).

The rules (SPEC section 2; docs/backends.md, "The projection: owner and modes"): the agent's
`secrets/` and everything in it belong to the agent's account (`caldera`, or a home agent's
owner), which can enter every directory and read every file; and no other account can read a
file of it (a directory on the way that is the account's alone, `secrets/` 0700, is enough).
The run checks them before its backend reads anything (`base.run_turn`), and `caldera check`
and `caldera backends --agent NAME` say the same sentence before any run (`readiness`).
systemd's `$CREDENTIALS_DIRECTORY` is systemd's to make and is not looked at here.

Permissions are read from the modes (owner, group, others; no ACL), so that root can tell what
the agent's account will meet; root itself reads everything.
"""
from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator

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


def _others(st: os.stat_result, reader: Reader, bits: int) -> bool:
    """Whether another account gets any of `bits` (others; the group too unless it is the
    reader's own primary group, as `chown caldera:caldera` makes it)."""
    mask = bits | (bits << 3 if st.st_gid != reader.gid else 0)
    return bool(st.st_mode & mask)


def _reached_by_others(path: Path, reader: Reader) -> bool:
    """Whether another account can walk from / down into `path` (every directory searchable)."""
    for step in [*reversed(path.parents), path]:
        try:
            if not _others(os.stat(step), reader, 0o1):
                return False
        except OSError:
            return False
    return True


def problem(secrets_dir: str | os.PathLike[str] | None, backend: str, reader: Reader) -> str | None:
    """The first thing in the way of `reader` using `<secrets_dir>/<backend>/` (the secrets dir
    itself, then that backend's part of it), as one sentence; None when there is none, or no
    secrets dir at all (what a backend then lacks, it says itself)."""
    if not secrets_dir:
        return None
    root = Path(secrets_dir)
    reach = _reached_by_others(Path(os.path.abspath(root)).parent, reader)
    budget = iter(range(MAX_ENTRIES))  # each entry looked at takes one
    return _walk(root, root, reader, reach, budget, only=backend)


def _walk(root: Path, path: Path, reader: Reader, reach: bool, budget: Iterator[int], depth: int = 0,
          only: str | None = None) -> str | None:
    """`path` and what is below it (bounded), depth first; `reach`: others can enter its parent;
    `only`: the one entry of it to go into (the secrets dir: the run's backend's)."""
    if next(budget, None) is None:
        return None
    try:
        st = os.stat(path)  # a link is what it points to (the account reads through it)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return sentence(root, path, reader, f"cannot be reached by {reader.name} ({exc.strerror})")
    is_dir = stat.S_ISDIR(st.st_mode)
    wrong = _entry(st, reader, reach, is_dir) if is_dir or path != root else "is not a directory"
    if wrong:
        return sentence(root, path, reader, wrong)
    if not is_dir or depth >= MAX_DEPTH:
        return None
    try:
        names = [only] if only is not None else sorted(os.listdir(path))
    except OSError as exc:
        return sentence(root, path, reader, f"cannot be listed by {reader.name} ({exc.strerror})")
    inner = reach and _others(st, reader, 0o1)
    for name in names:
        found = _walk(root, path / name, reader, inner, budget, depth + 1)
        if found:
            return found
    return None


def _entry(st: os.stat_result, reader: Reader, reach: bool, is_dir: bool) -> str | None:
    """What is wrong with one entry for `reader`; `reach`: others can enter its directory."""
    mode = f"owner {_owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):o}"
    if not _allowed(st, reader, 0o5 if is_dir else 0o4):
        return f"cannot be {'opened' if is_dir else 'read'} by {reader.name} ({mode})"
    if reader.uid != 0 and st.st_uid != reader.uid:
        return f"belongs to {_owner_name(st.st_uid)}, not to {reader.name} ({mode})"
    if reach and not is_dir and _others(st, reader, 0o4):
        return f"can be read by other accounts ({mode}, in directories they can enter)"
    return None


def sentence(root: Path, path: Path, reader: Reader, wrong: str) -> str:
    """`PATH WRONG: FIX`: the fix gives the whole projection to the account, and to it alone."""
    chown = f"chown -R {reader.name}:{reader.group} {root} && " if reader.uid != 0 else ""
    return (f"{path} {wrong}: the secret projection must be {reader.name}'s alone; as root: "
            f"{chown}chmod -R u=rwX,go= {root}")
