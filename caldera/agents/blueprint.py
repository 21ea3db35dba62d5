"""`caldera init BLUEPRINT [--name NAME] [--owner USER]`: install an agent from a blueprint.

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
Archive members are checked as for skills: no absolute paths, no `..`, no
links, nothing but files and directories, at most 10,000 members and 512 MiB.
"""
from __future__ import annotations

import grp
import os
import pwd
import shutil
import tarfile
import tempfile
from pathlib import Path

from caldera import TYPE_CHECKING, config
from caldera.agents.manifest import load_manifest
from caldera.agents.window import manifest_bytes_for_install
from caldera.errors import ConfigError
from caldera.host.fsutil import atomic_write_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from caldera.agents.manifest import Manifest

MANIFEST = "caldera.agent.yaml"
MAX_MEMBERS = 10_000
MAX_BYTES = 512 * 1024 * 1024
SYSTEMD_DIR = "/run/systemd/system"
DEFAULT_CONFIG_ROOT = Path("/etc/caldera")
SKIPPED = ("__pycache__", ".git")  # build leftovers, never part of a bundle
AGENT_ENV_TEMPLATE = """\
# Runtime settings for this agent (SPEC section 3). Secrets go to secrets.env.
# Owner root:{group}, mode 0640 (sudoedit keeps both). After a change:
# systemctl reload caldera@NAME
# CALDERA_AGENT_ENABLED=true
# CALDERA_BASE_URL=https://caldera.example.org
# CALDERA_INSTANCE_ID=123
"""
SECRETS_ENV_TEMPLATE = """\
# Secrets for this agent. Owner {user}:{group}, mode 0600 (sudoedit keeps both;
# the runtime refuses this file when others can read it).
# CALDERA_TOKEN=...
"""
SERVICE_USER = "caldera"


class Refused(Exception):
    """The blueprint can't be installed; nothing was written."""


def install(source: str | Path, *, name: str | None = None, environ: Mapping[str, str] = os.environ,
            systemd_dir: str | Path = SYSTEMD_DIR, owner: str | None = None) -> dict[str, Any]:
    """Install the blueprint at `source`; `owner`: the user (name or uid) the agent's files are
    given to instead of the service user (`caldera init --owner`)."""
    source = Path(source)
    account = _owner(owner)  # before anything is written: an unknown user refuses the install
    with tempfile.TemporaryDirectory(prefix="caldera-init-") as tmp:
        tree = _unpack(source, Path(tmp)) if source.is_file() else _checked_dir(source)
        root = _find_root(tree)
        manifest = _load(root)
        name = name or manifest.name
        if not config.valid_agent_name(name):
            raise ConfigError(f"--name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
        agents = config.config_root(environ) / "agents"
        config_dir = agents / name
        if (config_dir / MANIFEST).exists():
            raise Refused(f"an agent named {name!r} is already installed in {config_dir}; "
                          "pick another --name, or update its manifest through a blueprint update")
        bundled = _install_tree(root, agents, config_dir, account)
    state_dir = config.state_root(environ) / name
    _make_state_dir(state_dir, account)
    started = _next_steps(name, config_dir, config.config_root(environ), systemd_dir)
    what = f"manifest and bundle ({bundled} files)" if bundled else "manifest"
    if manifest.runtime_type == "process":
        # Process mode (SPEC 7b): no unit of its own for the agent; the runtime starts it.
        started += " Process mode: the runtime starts and supervises the agent (cron's report --once does not)."
    if owner is not None:
        started += f" Its files belong to {owner} (agent.env readable, secrets.env 0600): run it as {owner}."
    return {"message": f"Installed {name} ({what}) in {config_dir}; state in {state_dir}. {started}",
            "name": name, "config_dir": str(config_dir), "state_dir": str(state_dir), "bundle_files": bundled}


def _load(root: Path) -> Manifest:
    manifest = load_manifest(root / MANIFEST, validate_schema=True)
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


def _checked_dir(tree: Path) -> Path:
    if not tree.is_dir():
        raise Refused(f"{tree}: no such blueprint (a directory or a .tar.gz)")
    count = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED]
        for entry in dirnames + filenames:
            path = Path(dirpath) / entry
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

def _install_tree(root: Path, agents: Path, config_dir: Path, account: pwd.struct_passwd | None) -> int:
    """Stage the config dir next to its place, then rename it in: all or nothing."""

    agents.mkdir(parents=True, exist_ok=True, mode=0o755)
    staging = Path(tempfile.mkdtemp(prefix=f".{config_dir.name}.", dir=agents))
    try:
        os.chmod(staging, 0o755)
        files = _copy_bundle(root, staging / "bundle")
        if not files:
            (staging / "bundle").rmdir()
        data, _ = manifest_bytes_for_install((root / MANIFEST).read_bytes(), staging)
        atomic_write_bytes(staging / MANIFEST, data, mode=0o644)
        user, group = _names(account)
        atomic_write_bytes(staging / "agent.env", AGENT_ENV_TEMPLATE.format(group=group).encode(), mode=0o640)
        atomic_write_bytes(staging / "secrets.env", SECRETS_ENV_TEMPLATE.format(user=user, group=group).encode(),
                           mode=0o600)
        _give_to(staging, account)
        os.rename(staging, config_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return files


def _copy_bundle(root: Path, bundle: Path) -> int:
    files = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED)
        rel = Path(dirpath).relative_to(root)
        for filename in sorted(filenames):
            if rel == Path(".") and filename == MANIFEST:
                continue
            src, dst = Path(dirpath) / filename, bundle / rel / filename
            dst.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755 if os.stat(src).st_mode & 0o111 else 0o644)
            files += 1
    return files


def _service_user() -> pwd.struct_passwd | None:
    """The `caldera` passwd entry when root installs for it; None otherwise (a test, a checkout)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        return None  # no system user (a container without the package): root keeps it


def _owner(owner: str | None) -> pwd.struct_passwd | None:
    """Whom the agent's files go to: `owner` (a name or a uid; --owner), else the service user
    when root installs for it; None: leave them to whoever runs this. Only root can give them
    to someone else."""
    if owner is None:
        return _service_user()
    try:
        entry = pwd.getpwuid(int(owner)) if owner.isdigit() else pwd.getpwnam(owner)
    except KeyError:
        raise Refused(f"--owner {owner}: no such user here (create it before `caldera init`)") from None
    euid = os.geteuid()
    if euid != 0 and entry.pw_uid != euid:
        raise Refused(f"--owner {owner}: only root can give the agent's files to another user")
    return entry if euid == 0 else None


def _names(account: pwd.struct_passwd | None) -> tuple[str, str]:
    """(user, group) for the templates' comments: the account's, else the service user's."""
    if account is None:
        return SERVICE_USER, SERVICE_USER
    try:
        group = grp.getgrgid(account.pw_gid).gr_name
    except KeyError:
        group = str(account.pw_gid)
    return account.pw_name, group


def _give_to(config_dir: Path, account: pwd.struct_passwd | None) -> None:
    """agent.env root:<its group> 0640, secrets.env <it>:<its group> 0600: the daemon (the
    service user caldera, or --owner's) reads both, and `sudoedit` keeps an existing file's
    owner and mode."""
    if account is None:
        return
    os.chown(config_dir / "agent.env", 0, account.pw_gid)
    os.chown(config_dir / "secrets.env", account.pw_uid, account.pw_gid)


def _make_state_dir(state_dir: Path, account: pwd.struct_passwd | None) -> None:
    # 0711, as systemd's StateDirectoryMode=: others reach status.json by name only.
    for sub, mode in (("", 0o711), ("logs", 0o700), ("cache", 0o700)):
        (state_dir / sub).mkdir(parents=True, exist_ok=True, mode=mode)
        os.chmod(state_dir / sub, mode)
    if account is not None:
        for sub in ("", "logs", "cache"):
            os.chown(state_dir / sub, account.pw_uid, account.pw_gid)


def _next_steps(name: str, config_dir: Path, config_root: Path, systemd_dir: str | Path) -> str:
    """How to start the agent once its configuration is complete. The unit is not enabled
    here: an agent enabled before agent.env and secrets.env are filled would start unconfigured."""
    unit = f"caldera@{name}"
    edit = f"Fill in {config_dir}/agent.env and secrets.env, then"
    by_hand = f"caldera run --agent {name}"
    if config_root != DEFAULT_CONFIG_ROOT:
        by_hand = f"CALDERA_CONFIG_DIR={config_root} {by_hand}"
    if not Path(systemd_dir).is_dir():
        return f"systemd is not running here. {edit} start it with `{by_hand}` (or `caldera report --once` from cron)."
    if config_root != DEFAULT_CONFIG_ROOT:
        return f"{edit} start it with `{by_hand}` (the {unit} unit reads {DEFAULT_CONFIG_ROOT}, not {config_root})."
    return f"{edit}: sudo systemctl enable --now {unit}"
