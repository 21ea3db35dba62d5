"""The parts skill and revision handlers use: real outbox, state file, wake-ups and
publisher, the real control-plane client (against the `wire` fixture's fake plane)."""
import hashlib
import io
import os
import posixpath
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from caldera.agents.current import Current
from caldera.daemon.live import LiveStatus
from caldera.daemon.wakeups import Wakeups
from caldera.host.statefile import StateFile
from caldera.protocol.outbox import Outbox
from caldera.redact import Redactor
from caldera.skills import md5
from caldera.skills.publish import Publisher

BASE = "http://127.0.0.1:9"
API = BASE + "/api/v1/agent"


class FakeAuth:
    bootstrap_token = "boot-token-for-tests-1234"
    agent_id = None  # bodies go out as built

    def token(self):
        return "agt_sess_test_token_1234"

    def renew(self, token):
        return token

    def forbidden(self, exc):
        pass


@dataclass
class Paths:
    state_dir: Path
    config_dir: Path
    name: str = "demo"

    @property
    def manifest_path(self):
        return self.config_dir / "caldera.agent.yaml"

    @property
    def agent_env(self):
        return self.config_dir / "agent.env"

    @property
    def secrets_env(self):
        return self.config_dir / "secrets.env"


@dataclass
class Settings:
    env: dict = field(default_factory=dict)
    runtime_type: str = "caldera"
    agent_id: str = "caldera-7-main"


class CountingWakeups(Wakeups):
    """The real wake-ups, counting report_now() calls."""

    reports = 0

    def report_now(self):
        self.reports += 1
        super().report_now()


class FakeRuntime:
    """The parts a skill or revision handler uses, real except the Settings and Paths doubles."""

    def __init__(self, tmp: Path, env=None, client=True, driver=None, base_url: str | None = None):
        self.paths = Paths(tmp / "state", tmp / "config")
        self.paths.state_dir.mkdir(parents=True, exist_ok=True)
        self.paths.config_dir.mkdir(parents=True, exist_ok=True)
        self.current = Current(settings=Settings(env=dict(env or {})), driver=driver)
        self.wake = CountingWakeups()
        self.live = LiveStatus()
        self.outbox = Outbox(self.paths.state_dir / "outbox", wakeup=self.wake.outbox)
        self.state = StateFile(self.paths.state_dir / "state.json")
        self.redactor = Redactor()
        self.client = None
        if client:
            from caldera.protocol.client import ControlPlaneClient, Transport

            self.client = ControlPlaneClient(Transport(base_url or BASE), FakeAuth())
        self.publisher = Publisher(state_dir=self.paths.state_dir, env=lambda: self.current.settings.env,
                                   runtime_type="caldera", agent_id=self.agent_id, outbox=self.outbox,
                                   state=self.state, on_count=self.live.set_skill_count,
                                   report_now=self.wake.report_now)

    # what the tests read and change
    settings = property(lambda self: self.current.settings, lambda self, v: self.current.replace(settings=v))
    driver = property(lambda self: self.current.driver, lambda self, v: self.current.replace(driver=v))
    stop = property(lambda self: self.wake.stop)
    inventory_wakeup = property(lambda self: self.wake.inventory)
    skill_count = property(lambda self: self.live.skill_count)
    reports = property(lambda self: self.wake.reports)

    @property
    def agent_id(self):
        return self.current.settings.agent_id

    @property
    def identity(self):
        return SimpleNamespace(agent_id=self.agent_id)

    def inventory_changed(self):
        self.wake.inventory_changed()

    def inventories(self):
        return [item["body"] for _, item in self.outbox.items() if item["kind"] == "inventory"]


def call(command_type):
    import threading

    from caldera.protocol.command import parse_command
    from caldera.protocol.handlers import Call

    return Call(parse_command({"id": 1, "command_type": command_type}), threading.Event(), 0.0)


def ctx(runtime, command_type):
    """The context the daemon's route builds for this command type from the runtime's parts."""
    from caldera.daemon import dispatch

    return dispatch.routes()[command_type].context(runtime, call(command_type))


def run(runtime, command_type, payload):
    """Validate the payload like the executor does, then call the handler the daemon binds."""
    from caldera.daemon import dispatch
    from caldera.protocol import schemas
    schemas.validate(dispatch.schema_name(command_type), payload)
    return dispatch.binder(runtime)(call(command_type))(payload)


def write_tree(root: Path, files: dict) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return root


def hand_md5(entries) -> str:
    """MD5 of an explicitly written stream: entries are ("dir", path) or ("file", path, bytes)."""
    stream = b""
    for entry in entries:
        if entry[0] == "dir":
            stream += entry[1].encode() + b"\ndir\n"
        else:
            stream += entry[1].encode() + b"\nfile\n" + entry[2] + b"\n"
    return hashlib.md5(stream).hexdigest()


def zip_bytes(members, *, compression=zipfile.ZIP_DEFLATED) -> bytes:
    """members: (name, bytes) or (name, bytes, unix_mode) or a ZipInfo-ready tuple."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as zf:
        for member in members:
            name, data = member[0], member[1]
            info = zipfile.ZipInfo(name)
            info.compress_type = compression
            default = stat.S_IFDIR | 0o755 if name.endswith("/") else stat.S_IFREG | 0o644
            mode = member[2] if len(member) > 2 else default
            info.external_attr = mode << 16
            info.create_system = 3
            zf.writestr(info, data)
    return buf.getvalue()


def snapshot(root: Path) -> dict:
    """Every path under root with its type and content digest (links not followed)."""
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(base) / name
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                out[str(path.relative_to(root))] = ("file", hashlib.md5(path.read_bytes()).hexdigest(), st.st_mode)
            elif stat.S_ISLNK(st.st_mode):
                out[str(path.relative_to(root))] = ("link", os.readlink(path))
            else:
                out[str(path.relative_to(root))] = ("dir",)
    return out


def multipart_fields(body: bytes, content_type: str) -> dict:
    import email.parser

    msg = email.parser.BytesParser().parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    out = {}
    for part in msg.get_payload():
        name = part.get_param("name", header="content-disposition")
        out[name] = (part.get_filename(), part.get_payload(decode=True))
    return out


# ---- the fingerprint as the server computes it, of an archive or of bytes in memory ----
# (the runtime only ever fingerprints a directory: md5.content_md5_dir, md5.hash_skill)

def content_md5_mapping(files: dict) -> str:
    """The fingerprint of {relative path: bytes} (hidden paths left out, as on disk)."""
    kept = {rel: data for rel, data in files.items() if not is_hidden(rel)}
    return md5.digest(kept, lambda rel: [kept[rel]])


def is_hidden(rel: str) -> bool:
    """Left out of the fingerprint: a hidden segment (this covers `._*` and `.DS_Store`) or an
    archive metadata name (`Thumbs.db`, `__MACOSX`), as the server drops them first."""
    return any(seg.startswith(".") or seg in md5.METADATA_NAMES for seg in rel.split("/"))


def clean_archive_path(name: str) -> str | None:
    """An archive member's path the way ClawManager's server cleans it; None to drop it."""
    value = name.strip().replace("\\", "/")
    while value.startswith("./"):
        value = value[2:]
    value = posixpath.normpath(value) if value else ""
    if value in ("", ".") or value.startswith("..") or value.startswith("/"):
        return None
    return value


def content_md5_zip(zip_path) -> str:
    """The fingerprint of a skill zip: its single top-level directory is stripped
    exactly once, directory entries are ignored (what the server computes)."""
    with zipfile.ZipFile(zip_path) as zf:
        members = {}
        for info in zf.infolist():
            if info.is_dir():
                continue
            cleaned = clean_archive_path(info.filename)
            if cleaned is None or md5.is_archive_metadata(cleaned):
                continue  # dropped before the top directory is found, as the server does
            members[cleaned] = info
        tops = {rel.split("/", 1)[0] for rel in members}
        strip = len(tops) == 1 and all("/" in rel for rel in members)
        files = {}
        for rel, info in members.items():
            inner = rel.split("/", 1)[1] if strip else rel
            if not is_hidden(inner):
                files[inner] = info
        return md5.digest(files, lambda rel: [zf.read(files[rel])])
