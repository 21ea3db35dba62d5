"""`caldera init BLUEPRINT [--name NAME] [--user ACCOUNT | --owner USER]`: install an agent from a blueprint.

A blueprint is a directory or a `.tar.gz` holding `caldera.agent.yaml` (at its
top, or in its one top-level directory) and, optionally, the agent's adapter.
The manifest goes to `<config-dir>/agents/NAME/caldera.agent.yaml`; anything
else the blueprint ships is the bundle, copied to `<config-dir>/agents/NAME/bundle/`,
and a relative `runtime.workdir` is rebased into it. `agent.env` and
`secrets.env` are created from templates with the owners and modes the unit
needs (as root: root:caldera 0640 and caldera:caldera 0600), so that the
operator's `sudoedit` keeps them. The state dir is made (0711, caldera's).
`--owner USER` gives them to another user instead (root:USER's group 0640, USER 0600,
the state dir USER's): a container image's user, which runs `caldera run` itself
(docs/container.md). No
agent process is started here (in process mode, SPEC 7b, `caldera run` starts and
supervises the agent the manifest names) and the unit is not enabled: the printed next step
is `systemctl enable --now caldera@NAME`, once the configuration is complete.
An agent that lives in its owner's home (seed 000's `/home/agent/task-agent`; always named
by `--user ACCOUNT`, never derived from the manifest) is not copied: only its manifest is
installed (read once, without following a link, from the account's own checkout), the files
above and the state dir belong to that account, and the instance's drop-in runs it as that
account (caldera.agents.account). Root follows no link in the state dir: it is opened
O_NOFOLLOW and handed over by fd; a link there is refused before anything is written.
Re-running init for an installed agent that moves between the two kinds keeps its
agent.env, secrets.env, state and session, and gives them to the new account; it is
refused while caldera@NAME runs (stop it first).
Archive members are checked as for skills: no absolute paths, no `..`, no
links, nothing but files and directories, at most 10,000 members and 512 MiB.
Not part of a bundle: build leftovers, a `--manifest` run's `.caldera-state/`, and what
the blueprint's own `.calderaignore` lists (what its agent writes beside its code at run
time: the example task agent's `data/`, which a `--manifest` pause leaves there).
"""
from __future__ import annotations

import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

from caldera import TYPE_CHECKING, config
from caldera.agents import account
from caldera.agents.manifest import build, parse_text, schema_check
from caldera.agents.window import manifest_bytes_for_install
from caldera.errors import ConfigError
from caldera.host import stateformat
from caldera.host.fsutil import atomic_write_bytes

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from typing import Any

    from caldera.agents.manifest import Manifest

MANIFEST = "caldera.agent.yaml"
MAX_MEMBERS = 10_000
MAX_BYTES = 512 * 1024 * 1024
SYSTEMD_DIR = "/run/systemd/system"
DEFAULT_CONFIG_ROOT = Path("/etc/caldera")
DEFAULT_STATE_ROOT = Path("/var/lib/caldera")
# Build leftovers and a --manifest run's state (its session among it), never part of a bundle.
SKIPPED = ("__pycache__", ".git", config.STATE_BESIDE_MANIFEST)
# The blueprint's own list of what is not part of it: the files its agent writes at run time
# beside its code (the example task agent's data/), one pattern a line (docs/adapter.md).
IGNORE_FILE = ".calderaignore"
AGENT_ENV_TEMPLATE = """\
# Runtime settings for this agent (SPEC section 3). Secrets go to secrets.env.
# Owner {user}:{group}, mode 0640 (sudoedit keeps both). After a change:
# systemctl reload caldera@NAME (without systemd: kill -HUP the pid of caldera run)
# CALDERA_AGENT_ENABLED=true
# CALDERA_BASE_URL=https://caldera.example.org
# CALDERA_INSTANCE_ID=123
"""
SECRETS_ENV_TEMPLATE = """\
# Secrets for this agent. Owner {user}:{group}, mode 0600 (sudoedit keeps both;
# the runtime refuses this file when others can read it).
# CALDERA_TOKEN=...
"""


class Refused(Exception):
    """The blueprint can't be installed; nothing was written."""


def install(source: str | Path, *, name: str | None = None, user: str | None = None,
            image_user: str | None = None, environ: Mapping[str, str] = os.environ,
            systemd_dir: str | Path = SYSTEMD_DIR, unit_dir: str | Path | None = None,
            program: str = "caldera") -> dict[str, Any]:
    """Install (or move between the two kinds, SPEC section 11) the agent a blueprint holds.

    user: `--user`, the account an agent living in its home runs as (systemd runs it so);
    image_user: `--owner`, a container image's user, who runs `caldera run` itself and gets
    the agent's files (docs/container.md). unit_dir: where the instance's drop-in goes; by
    default /etc/systemd/system when the agent is installed in /etc/caldera (the unit reads
    nothing else), else nowhere. program: how the printed next step calls caldera (the
    command that works from where init was typed: cli/init.py).

    All or nothing: whether this process may make the config dir and the state dir is
    checked before anything is written (PermissionError naming the first directory it may
    not write, as mkdir would). An agent whose config dir an earlier init wrote without its
    state dir (an init before that check) is completed: the state dir is made, the rest kept.
    """
    if user is not None and image_user is not None:
        raise Refused("--user and --owner: pick one (--user: an agent that lives in that account's home, "
                      "run by systemd as it; --owner: a container image's user, who runs caldera itself)")
    source = Path(source)
    if unit_dir is None and config.config_root(environ) == DEFAULT_CONFIG_ROOT:
        unit_dir = account.UNIT_DIR
    home = user is not None and user != account.SERVICE_USER
    with tempfile.TemporaryDirectory(prefix="caldera-init-") as tmp:
        try:
            if home:
                # Root reads the account's own checkout: its manifest at its top, read once,
                # without following a link, owned by the account (or root).
                root = source
                data = account.check_checkout(source, MANIFEST, account.named(str(user)))
            else:
                if source.is_file():
                    tree = _unpack(source, Path(tmp))
                elif source.is_dir():
                    tree = source
                else:
                    raise Refused(f"{source}: no such blueprint (a directory or a .tar.gz)")
                root = _checked_dir(_find_root(tree))  # the bundle is copied: links and special files refused
                data = (root / MANIFEST).read_bytes()
            manifest = _load(root, data)
            name = name or manifest.name
            if not config.valid_agent_name(name):
                raise ConfigError(f"--name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
            owner = (account.for_owner(image_user) if image_user is not None
                     else account.choose(manifest.doc["runtime"].get("workdir"), user))
            agents = config.config_root(environ).absolute() / "agents"
            config_dir = agents / name
            state_dir = config.state_root(environ).absolute() / name
            _check_state_dir(state_dir)
            for needed in (agents, state_dir):
                _may_make(needed)
            moved = completed = ""
            if (config_dir / MANIFEST).exists():
                before = account.installed_user(name, unit_dir) if unit_dir is not None else account.SERVICE_USER
                after = owner.name if owner is not None else account.SERVICE_USER
                if before == after and not os.path.lexists(state_dir):
                    completed = (f"{config_dir} was there without its state dir (an earlier caldera init stopped "
                                 "before it): made it now; its manifest, bundle, agent.env and secrets.env are "
                                 "kept as they were.")
                elif before == after:
                    # (run as …) only where an account runs it: without one (a checkout) it is whoever starts it
                    runs = f" (run as {before})" if owner is not None else ""
                    raise Refused(f"an agent named {name!r} is already installed in {config_dir}{runs}; "
                                  "pick another --name, or update its manifest through a blueprint update "
                                  "(re-running init only moves an agent between its bundle and a user's home)")
                if Path(systemd_dir).is_dir() and _instance_active(name):
                    raise Refused(f"caldera@{name} is running: stop it first (sudo systemctl stop caldera@{name}), "
                                  f"then re-run caldera init to move it from {before} to {after}, then start it; "
                                  "nothing was changed")
                moved = (f" Moved from {before} to {after}: agent.env, secrets.env, state and session kept. "
                         f"{before} could have kept a copy of secrets.env: rotate the token.")
            bundled = 0 if completed else _install_tree(root, data, agents, config_dir, owner, copy_bundle=not home)
            _make_state_dir(state_dir, owner)
        except account.AccountRefused as exc:
            raise Refused(str(exc)) from None
    drop_in = account.write_drop_in(name, owner, unit_dir) if unit_dir is not None else None
    if (moved or drop_in) and Path(systemd_dir).is_dir():
        _daemon_reload()  # a drop-in written or removed: systemd reads it now, the unit on its next start
    runs_as = owner.name if owner is not None else account.SERVICE_USER
    started = _next_steps(name, config_dir, systemd_dir, roots=_roots_named(environ),
                          moved_to=runs_as if moved else None, program=program)
    what = f"manifest and bundle ({bundled} files)" if bundled else "manifest"
    if home and owner is not None:
        what = f"manifest; the agent stays in {manifest.workdir} and runs as {owner.name}"
    if completed:
        return {"message": f"Completed the install of {name}: {completed} State in {state_dir}. {started}",
                "name": name, "config_dir": str(config_dir), "state_dir": str(state_dir), "bundle_files": None,
                "user": owner.name if owner is not None else None,
                "kind": owner.kind if owner is not None else "bundle", "drop_in": str(drop_in) if drop_in else None,
                "completed": True}
    if manifest.runtime_type == "process":
        # Process mode (SPEC 7b): no unit of its own for the agent; the runtime starts it.
        started += " Process mode: the runtime starts and supervises the agent (cron's report --once does not)."
    if image_user is not None and owner is not None:
        started += f" Its files belong to {owner.name} (agent.env readable, secrets.env 0600): run it as {owner.name}."
    return {"message": f"Installed {name} ({what}) in {config_dir}; state in {state_dir}.{moved} {started}",
            "name": name, "config_dir": str(config_dir), "state_dir": str(state_dir), "bundle_files": bundled,
            "user": owner.name if owner is not None else None, "kind": owner.kind if owner is not None else "bundle",
            "drop_in": str(drop_in) if drop_in else None}


def _load(root: Path, data: bytes) -> Manifest:
    """The blueprint's manifest from the bytes read once (never re-read through a path)."""
    path = root.absolute() / MANIFEST
    doc = parse_text(data, path)
    schema_check(doc, path)
    manifest = build(doc, path)
    if manifest.runtime_type not in ("adapter", "process"):
        raise Refused(f"runtime.type: {manifest.runtime_type}: not a mode this caldera knows")
    return manifest


# ------------------------------------------------------------ the blueprint's files

def _unpack(archive: Path, dest: Path) -> Path:
    if not archive.name.endswith((".tar.gz", ".tgz")):
        raise Refused(f"{archive}: a blueprint is a directory or a .tar.gz")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            _check_members(members)
            for member in members:
                _extract(tar, member, dest)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise Refused(f"{archive}: not a readable .tar.gz: {exc}") from None
    return dest


def _check_members(members: Sequence[tarfile.TarInfo]) -> None:
    if len(members) > MAX_MEMBERS:
        raise Refused(f"the archive has {len(members)} members, over {MAX_MEMBERS}")
    total = 0
    for member in members:
        name = member.name
        parts = Path(name).parts
        if name.startswith("/") or (parts and parts[0].endswith(":")):
            raise Refused(f"archive member {name!r}: an absolute path")
        if ".." in parts:
            raise Refused(f"archive member {name!r}: '..' leaves the blueprint")
        if member.issym() or member.islnk():
            raise Refused(f"archive member {name!r}: links are refused")
        if not (member.isfile() or member.isdir()):
            raise Refused(f"archive member {name!r}: only files and directories are allowed")
        total += member.size
        if total > MAX_BYTES:
            raise Refused(f"the archive unpacks to more than {MAX_BYTES // (1024 * 1024)} MiB")


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    target = dest / member.name
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    src = tar.extractfile(member)
    if src is None:  # _check_members let only files and directories through
        raise Refused(f"archive member {member.name!r}: not a regular file")
    with src, open(target, "wb") as out:
        shutil.copyfileobj(src, out)
    os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)


def ignore_patterns(root: Path) -> list[str]:
    """The blueprint's .calderaignore: one pattern a line (`#` comments), each a glob; one
    with a `/` inside is matched against the path from the blueprint's top, one without
    against each name at any depth; a trailing `/` matches directories only."""
    try:
        text = (root / IGNORE_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"{root / IGNORE_FILE}: cannot be read ({exc})") from None
    lines = (line.strip() for line in text.splitlines())
    return [line.lstrip("/") for line in lines if line and not line.startswith("#")]


def _left_out(rel: Path, is_dir: bool, patterns: Sequence[str]) -> bool:
    """Whether the entry at `rel` (from the blueprint's top) is not part of the bundle."""
    import fnmatch  # here: only a blueprint's install pays for it

    if rel.name in SKIPPED and is_dir or rel == Path(IGNORE_FILE):
        return True
    for pattern in patterns:
        if pattern.endswith("/") and not is_dir:
            continue
        bare = pattern.rstrip("/")
        if fnmatch.fnmatchcase(rel.as_posix() if "/" in bare else rel.name, bare):
            return True
    return False


def _walk(root: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """os.walk of the blueprint, sorted, without what it leaves out (SKIPPED, .calderaignore)."""
    patterns = ignore_patterns(root)
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel = here.relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not _left_out(rel / d, True, patterns))
        yield here, dirnames, sorted(f for f in filenames if not _left_out(rel / f, False, patterns))


def _checked_dir(tree: Path) -> Path:
    if not tree.is_dir():
        raise Refused(f"{tree}: no such blueprint (a directory or a .tar.gz)")
    count = 0
    for here, dirnames, filenames in _walk(tree):
        for entry in dirnames + filenames:
            path = here / entry
            if path.is_symlink():
                raise Refused(f"{path}: links are refused in a blueprint")
            if not (path.is_dir() or path.is_file()):
                raise Refused(f"{path}: only files and directories are allowed")
            count += 1
    if count > MAX_MEMBERS:
        raise Refused(f"the blueprint has {count} entries, over {MAX_MEMBERS}")
    return tree


def _find_root(tree: Path) -> Path:
    if (tree / MANIFEST).is_file():
        return tree
    subdirs = [p for p in tree.iterdir() if p.is_dir()]
    if len(subdirs) == 1 and (subdirs[0] / MANIFEST).is_file():
        return subdirs[0]
    raise Refused(f"the blueprint holds no {MANIFEST} (at its top or in its one top-level directory)")


# ------------------------------------------------------------ installing

def _install_tree(root: Path, data: bytes, agents: Path, config_dir: Path, owner: account.Account | None, *,
                  copy_bundle: bool = True) -> int:
    """Stage the config dir next to its place, then rename it in: all or nothing. An agent
    already installed (a kind switch) keeps its agent.env, secrets.env and secret projection."""

    agents.mkdir(parents=True, exist_ok=True, mode=0o755)
    staging = Path(tempfile.mkdtemp(prefix=f".{config_dir.name}.", dir=agents))
    old = config_dir.with_name(f".{config_dir.name}.old")
    try:
        os.chmod(staging, 0o755)
        files = _copy_bundle(root, staging / "bundle") if copy_bundle else 0
        installed, _ = manifest_bytes_for_install(data, staging)
        atomic_write_bytes(staging / MANIFEST, installed, mode=0o644)
        if config_dir.exists():
            for kept in ("agent.env", "secrets.env"):
                shutil.copy2(config_dir / kept, staging / kept)
            if (config_dir / "secrets").is_symlink():
                raise account.refuse_link(config_dir / "secrets")
            if (config_dir / "secrets").is_dir():
                shutil.copytree(config_dir / "secrets", staging / "secrets", symlinks=True)
        else:
            # the owner the daemon reads them as: the service user's, a home agent's or --owner's;
            # without one (no `caldera` user: a checkout, a container, a test), the installer's own
            user, group = (owner.name, owner.group) if owner is not None else _installer()
            agent_user = "root" if owner is not None else user
            atomic_write_bytes(staging / "agent.env", AGENT_ENV_TEMPLATE.format(user=agent_user, group=group).encode(),
                               mode=0o640)
            atomic_write_bytes(staging / "secrets.env", SECRETS_ENV_TEMPLATE.format(user=user, group=group).encode(),
                               mode=0o600)
        if owner is not None:
            account.give_config(staging, owner)
        if config_dir.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(config_dir, old)
            os.rename(staging, config_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, config_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return files


def _installer() -> tuple[str, str]:
    """(user, group) of this process: the owners of what it writes for itself."""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    try:
        group = grp.getgrgid(os.getegid()).gr_name
    except KeyError:
        group = str(os.getegid())
    return user, group


def _copy_bundle(root: Path, bundle: Path) -> int:
    files = 0
    for here, _, filenames in _walk(root):
        rel = here.relative_to(root)
        for filename in filenames:
            if rel == Path(".") and filename == MANIFEST:
                continue
            src, dst = here / filename, bundle / rel / filename
            dst.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755 if os.stat(src).st_mode & 0o111 else 0o644)
            files += 1
    return files


STATE_SUBDIRS = (("logs", 0o700), ("cache", 0o700))


def _may_make(path: Path) -> None:
    """This process may make `path` (or write in it, when it exists): else PermissionError
    naming the directory it may not write (the missing one it would make first, as mkdir -p
    names it), before anything is written. Root passes (os.access, effective ids)."""
    existing, first_missing = path, path
    while not os.path.lexists(existing) and existing.parent != existing:
        existing, first_missing = existing.parent, existing
    if not os.access(existing, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        import errno  # here: only a refused init pays for it

        denied = existing if existing == path else first_missing
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(denied))


def _check_state_dir(state_dir: Path) -> None:
    """Before anything is written: the state dir and its logs/ and cache/, where they exist,
    are real directories. Their parent belongs to the service user, so a link planted there
    (NAME -> /etc) would otherwise have root chown and chmod what it points to."""
    for path in (state_dir, *(state_dir / sub for sub, _ in STATE_SUBDIRS)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise account.refuse_link(path)
    # A newer caldera's state: a re-init (a move between bundle and home) would chown it and
    # make logs/ and cache/ in a layout this caldera does not know; refused, nothing changed.
    stateformat.check(state_dir)


def _open_or_make(parent_fd: int, path: Path, mode: int) -> int:
    """parent_fd's entry path.name made (mode) when missing, then opened without following a link."""
    try:
        os.mkdir(path.name, mode, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = account.open_dir(path, dir_fd=parent_fd, name=path.name)
    os.fchmod(fd, mode)
    return fd


def _make_state_dir(state_dir: Path, owner: account.Account | None) -> None:
    """The state dir (0711, as systemd's StateDirectoryMode=: others reach status.json by name
    only), its logs/ and cache/ (0700), everything in it given to the owner: each opened
    O_NOFOLLOW and walked by fd, so no planted link is followed and no path re-resolved."""
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    parent = os.open(state_dir.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        top = _open_or_make(parent, state_dir, 0o711)
    finally:
        os.close(parent)
    try:
        for sub, mode in STATE_SUBDIRS:
            os.close(_open_or_make(top, state_dir / sub, mode))
        if owner is not None:
            # Everything, not just these three: a kind switch keeps the state and session of the
            # account before, and root's earlier runs may have left files too.
            account.give_tree_fd(top, owner)
    finally:
        os.close(top)


def _instance_active(name: str) -> bool:
    """`systemctl is-active --quiet caldera@NAME` says it runs (a kind switch waits for a stop)."""
    import subprocess  # here: only a kind switch under systemd pays for it

    try:
        return subprocess.run(["systemctl", "is-active", "--quiet", f"caldera@{name}"], check=False, timeout=30,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _roots_named(environ: Mapping[str, str]) -> str:
    """The variables that put this agent where the unit and a bare `caldera` do not look:
    every later command needs them too, the state dir's above all (without it, `caldera
    run` makes a second state dir in the default place)."""
    named = [(var, root) for var, root, default in (
        ("CALDERA_CONFIG_DIR", config.config_root(environ).absolute(), DEFAULT_CONFIG_ROOT),
        ("CALDERA_STATE_DIR", config.state_root(environ).absolute(), DEFAULT_STATE_ROOT)) if root != default]
    return " ".join(f"{var}={_quoted(str(root))}" for var, root in named)


def _quoted(text: str) -> str:
    import shlex  # here: only an init outside the default roots pays for it

    return shlex.quote(text)


def _next_steps(name: str, config_dir: Path, systemd_dir: str | Path, *, roots: str = "",
                moved_to: str | None = None, program: str = "caldera") -> str:
    """How to start the agent once its configuration is complete. The unit is not enabled
    here: an agent enabled before agent.env and secrets.env are filled would start unconfigured.
    roots: the variables every later command needs (_roots_named), spelled out; program:
    how to call caldera from where init was typed."""
    unit = f"caldera@{name}"
    edit = f"Fill in {config_dir}/agent.env and secrets.env, then"
    by_hand = f"{roots} {program} run --agent {name}".lstrip()
    cron = (f"`{program} report --once` with the same variables" if roots
            else f"`{program} report --once --agent {name}`")
    local = f"it stays local, with no control plane, until {config_dir}/agent.env sets CALDERA_AGENT_ENABLED=true"
    if not Path(systemd_dir).is_dir():
        return (f"systemd is not running here: start it with `{by_hand}`; {local}, and from then on cron can run "
                f"{cron} instead of a daemon (docs/runtime.md).")
    if roots:
        return (f"Start it with `{by_hand}` (the {unit} unit reads {DEFAULT_CONFIG_ROOT} and {DEFAULT_STATE_ROOT}, "
                f"not these); {local} (docs/runtime.md).")
    if moved_to:
        return f"Its configuration is kept: sudo systemctl start {unit} runs it as {moved_to}."
    return f"{edit}: sudo systemctl enable --now {unit}"


def _daemon_reload() -> None:
    import subprocess  # here: only an init that wrote a drop-in pays for it

    if os.geteuid() != 0:
        return
    try:
        subprocess.run(["systemctl", "daemon-reload"], check=False, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass  # the admin's own daemon-reload (or the next boot) reads it
