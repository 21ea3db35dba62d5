"""One `opencode serve` process: its private dirs, its start (a request never goes out
before it says it listens), its HTTP API, its event stream, its stop.

Dirs: `<runs>/.opencode-<hex>/` (a run id never starts with a dot, so no run dir can be
it), 0700: `home`, `config`, `data`, `cache`, `state`, `tmp` (HOME, XDG_*_HOME, TMPDIR)
and `opencode.json` (0600, OPENCODE_CONFIG, absolute); `server.json` names the server's
and its owner's pid and start time, so that a later owner can stop a server whose owner
died; `.owner` is the same claim as a run's (`leftovers.claim`): the sweep at the daemon's start
and at each `caldera turn` stops a server whose owner is gone (killed -9) even when no OpenCode
turn follows. All of it is removed when the server stops.

The process: argv `[binary, "serve", "--hostname", "127.0.0.1", "--port", "0", "--pure"]`
(behind `bwrap … --` where bubblewrap nests: confine.Confinement.server_argv; its pid is then bwrap's),
its own process group, an environment built from nothing (no variable of the runtime's
own reaches it: not its tokens, not a ClawManager OPENCODE_CONFIG_CONTENT), the password
(`OPENCODE_SERVER_PASSWORD`) random per start. Stop: TERM to the group, grace, KILL, and
KILL to every process group its descendants made (an agent's command started by OpenCode).

The provider's secrets stay in this process: the server's config points each provider at
its route on the runtime's loopback forwarder (`backends/forwarder.py` with `route.ProviderRoutes`),
started before the server and closed after it, so one forwarder serves the server's whole life.

Threads: `opencode-stdout`/`opencode-stderr` keep bounded tails of the server's output
(its log goes to its own data dir); `opencode-events` per open event stream; the forwarder's
`opencode-forwarder` and `opencode-forwarder-conn` (one per OpenCode connection).
"""
from __future__ import annotations

import base64
import collections
import http.client
import json
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from caldera.backends import failures as fk
from caldera.backends import leftovers
from caldera.backends.forwarder import Forwarder
from caldera.backends.opencode.confine import Admitted, Confinement, unconfined_wrapper
from caldera.backends.opencode.provider import ServerSpec
from caldera.backends.opencode.route import ProviderRoutes, forwarder, process_secret
from caldera.host import jsonlimits, proc
from caldera.host.fsutil import atomic_write_bytes

START_TIMEOUT = 60.0  # "listening" took 1.3-5.5 s on this 2-core machine (docs/backends.md)
STOP_GRACE = 3.0
CALL_TIMEOUT = 30.0
HEALTH_TIMEOUT = 5.0  # a server that cannot say it is healthy in 5 s is recycled (owner.py)
MAX_ANSWER = 16 * 1024 * 1024
MAX_EVENT_LINE = 32 * 1024 * 1024
EVENT_QUEUE = 4096
TAIL_LINES = 40
USERNAME = "opencode"
_LISTENING = re.compile(r"opencode server listening on http://127\.0\.0\.1:(\d+)")
# OpenCode's own outside lookups, all off (code-agents-notes.md, OpenCode "Offline").
OFFLINE_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1", "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    "OPENCODE_DISABLE_EMBEDDED_WEB_UI": "1",
    "npm_config_registry": "http://127.0.0.1:9/",  # a plugin install that still starts fails here
}
DIRS = ("home", "config", "data", "cache", "state", "tmp")
# OpenCode 1.18.33's, which it writes into its config dir when missing (only then: measured)
GITIGNORE = "node_modules\npackage.json\npackage-lock.json\nbun.lock\n.gitignore"


class ServerError(Exception):
    """An API call failed: no answer, or a status other than 2xx. str() is a sentence."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Launch:
    """Everything a server is started from; two launches with one fingerprint share a server."""
    binary: str
    spec: ServerSpec
    path: str
    tz: str | None = None
    sandbox: Confinement | None = None  # its commands' bubblewrap (None: Bash is denied to its turns)
    external: bool = False  # no sandbox, Bash allowed: the container is the sandbox (CALDERA_RUN_SANDBOX)

    @property
    def fingerprint(self) -> str:
        return f"{self.binary}\0{self.path}\0{self.tz}\0{self.spec.fingerprint}\0{self.sandbox!r}\0{self.external}"


def render_config(spec: ServerSpec, routes: ProviderRoutes, forwarder_url: str) -> dict[str, Any]:
    """The config OpenCode reads: the spec's providers pointed at their routes on the
    forwarder, their secrets replaced by placeholders, and the runtime's settings."""
    providers = {}
    for pid, entry in spec.providers.items():
        entry = _placeholders(json.loads(json.dumps(entry)), routes)
        entry.setdefault("options", {})["baseURL"] = forwarder_url + routes.path_for(pid)
        providers[pid] = entry
    return {"provider": providers, "enabled_providers": sorted(providers), "model": spec.default_model,
            "small_model": spec.default_model, "autoupdate": False, "share": "disabled", "snapshot": False,
            "formatter": False, "lsp": False, "mcp": {}, "plugin": []}


def _placeholders(value: Any, routes: ProviderRoutes) -> Any:
    if isinstance(value, dict):
        return {k: _placeholders(v, routes) for k, v in value.items()}
    if isinstance(value, list):
        return [_placeholders(v, routes) for v in value]
    if isinstance(value, str):
        for placeholder, secret in routes.placeholders.items():
            if secret in value:
                value = value.replace(secret, placeholder)
    return value


class OpenCodeServer:
    def __init__(self, launch: Launch, runs_dir: str | os.PathLike[str]):
        self.launch = launch
        self.dir = Path(runs_dir) / f".opencode-{secrets.token_hex(6)}"
        self.password = process_secret() + secrets.token_urlsafe(24)  # random per start; masked by its prefix
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.routes: ProviderRoutes | None = None
        self.forwarder: Forwarder | None = None  # the shared loopback forwarder with OpenCode's routes
        self.started_at = 0.0
        self.listening_after: float | None = None
        self.leases = 0  # turns using it now (the owner's count, under the owner's lock)
        self.turns = 0  # turns it has served or serves (the owner's count: its recycle)
        self.poisoned = False  # a turn left it in a state it cannot vouch for: stop when free
        self._ready = threading.Event()
        self._tails: dict[str, collections.deque[str]] = {
            "stdout": collections.deque(maxlen=TAIL_LINES), "stderr": collections.deque(maxlen=TAIL_LINES)}
        self._readers: list[threading.Thread] = []
        self._stopped = False
        self.admitted: Admitted | None = None  # the turns' workspaces its commands may use (sandbox only)
        self._serving: int | None = None  # serving_pid() found: checked, not searched, at every turn's end

    # ------------------------------------------------------------ start

    def start(self, should_stop: Callable[[], bool] | None = None) -> None:
        """Spawn and wait until it says it listens. BackendFailure (spawn-failed) when it
        cannot start, exits first, or stays silent START_TIMEOUT s; _Stopped when
        `should_stop()` turns true meanwhile. Nothing is left behind on failure."""
        try:
            self._prepare_dirs()
            spec = self.launch.spec
            self.routes = ProviderRoutes({pid: e["options"]["baseURL"] for pid, e in spec.providers.items()},
                                         spec.secrets)
            self.forwarder = forwarder(self.routes)
            url = self.forwarder.start()
            config = json.dumps(render_config(spec, self.routes, url), indent=1).encode()
            atomic_write_bytes(self.dir / "opencode.json", config, mode=0o600, durable=False)
            self._spawn()
            self._wait_listening(should_stop)
        except BaseException:
            self.stop()
            raise

    def _prepare_dirs(self) -> None:
        self.dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700)
        os.chmod(self.dir, 0o700)
        leftovers.claim(self.dir)  # an owner killed -9: the next start's sweep stops the server
        self._write_pidfile()  # the owner's claim now (the server's pid once it runs): read-only to it
        for name in DIRS:
            (self.dir / name).mkdir(mode=0o700)
        # OpenCode writes this file at its start when missing; made here, its config dir can be read-only
        # in its sandbox (confine.SERVER_READ_ONLY: no plugin or config planted there)
        (self.dir / "config" / "opencode").mkdir(mode=0o700)
        (self.dir / "config" / "opencode" / ".gitignore").write_text(GITIGNORE)
        if self.launch.sandbox is not None:  # SHELL: OpenCode's Bash runs every command through it
            (self.dir / "bin").mkdir(mode=0o700)
            self.admitted = Admitted(self.dir)
            atomic_write_bytes(self.dir / "bin" / "bash", self.launch.sandbox.wrapper(str(self.dir)).encode(),
                               mode=0o700, durable=False)
        elif self.launch.external:  # the same SHELL, without bubblewrap: the server's password still dropped
            (self.dir / "bin").mkdir(mode=0o700)
            atomic_write_bytes(self.dir / "bin" / "bash", unconfined_wrapper(self.launch.path).encode(),
                               mode=0o700, durable=False)

    def environment(self) -> dict[str, str]:
        d = self.dir
        env = {"PATH": self.launch.path, "LANG": "C.UTF-8", "HOME": str(d / "home"),
               "XDG_CONFIG_HOME": str(d / "config"), "XDG_DATA_HOME": str(d / "data"),
               "XDG_CACHE_HOME": str(d / "cache"), "XDG_STATE_HOME": str(d / "state"), "TMPDIR": str(d / "tmp"),
               "OPENCODE_CONFIG": str(d / "opencode.json"), "OPENCODE_SERVER_USERNAME": USERNAME,
               "OPENCODE_SERVER_PASSWORD": self.password}
        if self.launch.tz:
            env["TZ"] = self.launch.tz
        if self.launch.sandbox is not None or self.launch.external:
            env["SHELL"] = str(d / "bin" / "bash")
        env.update(OFFLINE_ENV)
        return env

    def _spawn(self) -> None:
        argv = [self.launch.binary, "serve", "--hostname", "127.0.0.1", "--port", "0", "--pure"]
        sandbox = self.launch.sandbox
        if sandbox is not None and sandbox.server:  # its own file tools see what its commands see
            argv = [*sandbox.server_argv(str(self.dir), self.launch.binary), *argv]
        self.started_at = time.monotonic()
        try:
            self.proc = subprocess.Popen(argv, cwd=str(self.dir), env=self.environment(), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED,
                                    f"cannot start {self.launch.binary}: {exc.strerror or exc}") from None
        self._write_pidfile()
        for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            reader = threading.Thread(target=self._pump, args=(name, stream), name=f"opencode-{name}", daemon=True)
            reader.start()
            self._readers.append(reader)

    def _write_pidfile(self) -> None:
        mine = proc.proc_stat(os.getpid())
        theirs = proc.proc_stat(self.proc.pid) if self.proc is not None else None
        doc = {"pid": self.proc.pid if self.proc is not None else None,
               "start_time": theirs["start_time"] if theirs else None,
               "owner_pid": os.getpid(), "owner_start_time": mine["start_time"] if mine else None}
        atomic_write_bytes(self.dir / "server.json", json.dumps(doc).encode(), mode=0o600, durable=False)

    def _pump(self, name: str, stream: IO[bytes] | None) -> None:
        """Read one pipe to EOF: lines into a bounded tail; stdout's "listening" line sets the port."""
        if stream is None:
            return
        tail = self._tails[name]
        for raw in iter(lambda: stream.readline(64 * 1024), b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            tail.append(line[:2000])
            if name == "stdout" and not self._ready.is_set():
                found = _LISTENING.search(line)
                if found:
                    self.port = int(found.group(1))
                    self._ready.set()
        stream.close()

    def _wait_listening(self, should_stop: Callable[[], bool] | None) -> None:
        assert self.proc is not None
        limit = time.monotonic() + START_TIMEOUT
        while not self._ready.wait(0.05):
            if should_stop is not None and should_stop():
                raise Stopped()
            if self.proc.poll() is not None:
                for reader in self._readers:
                    reader.join(2.0)  # the stderr that explains it
                if self._ready.is_set():
                    break
                raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED, (
                    f"opencode serve exited (rc {self.proc.returncode}) before it listened: "
                    f"{self.output_tail() or 'no output'}"))
            if time.monotonic() >= limit:
                raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED,
                                        f"opencode serve did not say it listens within {START_TIMEOUT:.0f} s")
        self.listening_after = time.monotonic() - self.started_at

    def output_tail(self, lines: int = 3, chars: int = 500) -> str:
        """The last lines of stderr (else stdout), ANSI stripped: raw; the caller redacts."""
        for name in ("stderr", "stdout"):
            kept = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", x).strip() for x in self._tails[name]]
            kept = [x for x in kept if x and not _LISTENING.search(x)]
            if kept:
                return " | ".join(kept[-lines:])[-chars:]
        return ""

    # ------------------------------------------------------------ state

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and not self._stopped

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code once it has exited (waiting up to `timeout` s), else None."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def serving_pid(self) -> int | None:
        """The `opencode serve` process itself: `pid` is bubblewrap's where the server has its
        sandbox (the bench measures the server's CPU and memory, a test kills the server)."""
        if self.proc is None:
            return None
        # The one found before, while the server lives and that pid still is it (one read, where
        # the search walks all of /proc: 3-4 ms of CPU at every turn's end, the recycle's RSS check).
        if self._serving is not None and self.alive() and self._serves(self._serving):
            return self._serving
        for pid in _descendants(self.proc.pid):
            if self._serves(pid):
                self._serving = pid
                return pid
        return self.proc.pid

    def _serves(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read(4096).split(b"\0")
        except OSError:
            return False  # gone
        return argv[:2] == [self.launch.binary.encode(), b"serve"]

    def rss_bytes(self) -> int | None:
        """VmRSS of the `opencode serve` process (not its commands'), None when it is gone."""
        pid = self.serving_pid()
        if pid is None:
            return None
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                for line in fh.read(8192).splitlines():
                    if line.startswith(b"VmRSS:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    def healthy(self, timeout: float = HEALTH_TIMEOUT) -> bool:
        """OpenCode's own health check (`GET /global/health` says `healthy: true`) within `timeout` s."""
        try:
            answer = self.call("GET", "/global/health", timeout=timeout)
        except ServerError:
            return False
        return isinstance(answer, dict) and answer.get("healthy") is True

    # ------------------------------------------------------------ the API

    def _headers(self) -> dict[str, str]:
        token = base64.b64encode(f"{USERNAME}:{self.password}".encode()).decode()
        return {"Authorization": f"Basic {token}", "Content-Type": "application/json", "Accept": "application/json"}

    def target(self, path: str, directory: str | None) -> str:
        if directory:
            path += ("&" if "?" in path else "?") + urllib.parse.urlencode({"directory": directory})
        return path

    def call(self, method: str, path: str, body: Any = None, directory: str | None = None,
             timeout: float = CALL_TIMEOUT) -> Any:
        """One request; the parsed JSON answer (None when empty). ServerError otherwise."""
        if self.port is None or not self.alive():
            raise ServerError("the OpenCode server is not running")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, self.target(path, directory), body=payload, headers=self._headers())
            answer = conn.getresponse()
            raw = answer.read(MAX_ANSWER + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(f"{method} {path}: no answer from the OpenCode server ({type(exc).__name__})") from None
        finally:
            conn.close()
        if not 200 <= answer.status < 300:
            text = raw[:500].decode("utf-8", "replace")
            raise ServerError(f"{method} {path}: HTTP {answer.status}: {text}", answer.status)
        if not raw.strip():
            return None
        try:
            return jsonlimits.loads(raw, max_bytes=MAX_ANSWER, what=f"the answer to {method} {path}")
        except ValueError as exc:
            raise ServerError(f"{method} {path}: the answer is not JSON ({exc})") from None

    def events(self, directory: str) -> EventStream:
        if self.port is None or not self.alive():
            raise ServerError("the OpenCode server is not running")
        stream = EventStream(self.port, self.target("/event", directory), self._headers())
        stream.open()
        return stream

    # ------------------------------------------------------------ stop

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """TERM -> grace -> KILL the group and every group its descendants made; close the
        forwarder; remove the dirs. Idempotent."""
        self._stopped = True
        rc = None
        if self.forwarder is not None:
            self.forwarder.cut()
        if self.proc is not None:
            groups = _descendant_groups(self.proc.pid)
            if self.proc.poll() is None:
                rc = proc.kill_group(self.proc, grace, reap=5.0)
            else:
                proc.signal_group(self.proc, signal.SIGKILL)  # commands left in its group
                rc = self.proc.returncode
            for pgid in groups:
                proc.signal_pgid(pgid, signal.SIGKILL)
            for reader in self._readers:
                reader.join(2.0)  # a pipe still held by a process outside the groups: left behind
        if self.forwarder is not None:
            self.forwarder.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


class Stopped(Exception):
    """The caller's stop (cancel, deadline) came while the server was starting."""


class EventStream:
    """`GET /event` (SSE) of one directory, read by its own thread into a bounded queue:
    items ("event", (dict, raw text)), ("bad", (reason, raw text)) for data that is not JSON,
    ("invalid", (reason, raw text)) for an event without its `type` and `properties`, and,
    last, ("end", reason).
    Token deltas and heartbeats are dropped unparsed (the whole part follows)."""

    def __init__(self, port: int, path: str, headers: Mapping[str, str]):
        self._port, self._path, self._headers = port, path, dict(headers, Accept="text/event-stream")
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=EVENT_QUEUE)
        self._conn: http.client.HTTPConnection | None = None
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._read, name="opencode-events", daemon=True)

    def open(self) -> None:
        # No read timeout: heartbeats come every 10 s, and close() shuts the socket.
        self._conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=10.0)
        try:
            self._conn.request("GET", self._path, headers=self._headers)
            self._sock = self._conn.sock  # kept: http.client lets go of it when the answer has no length
            answer = self._conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            raise ServerError(f"GET /event: no answer from the OpenCode server ({type(exc).__name__})") from None
        if answer.status != 200:
            self._conn.close()
            raise ServerError(f"GET /event: HTTP {answer.status}", answer.status)
        if self._sock is not None:
            self._sock.settimeout(None)
        self._answer = answer
        self._thread.start()

    def _read(self) -> None:
        reason = "the OpenCode server closed its event stream"
        parse = jsonlimits.line_parser(max_bytes=MAX_EVENT_LINE, what="an OpenCode event")
        try:
            for raw in iter(lambda: self._answer.readline(MAX_EVENT_LINE + 1), b""):
                if not raw.startswith(b"data:"):
                    continue
                if b'"type":"message.part.delta"' in raw[:200] or b'"type":"server.heartbeat"' in raw[:200]:
                    continue  # token deltas: the whole part follows in message.part.updated
                text = raw[5:].decode("utf-8", "replace").strip()
                try:
                    event = parse(text)
                except ValueError as exc:
                    self._put(("bad", (str(exc), text)))
                    continue
                problem = _malformed(event)
                if problem is not None:
                    self._put(("invalid", (problem, text)))
                    continue
                if event.get("type") == "server.connected":
                    self.connected.set()
                self._put(("event", (event, text)))
        except Exception as exc:  # noqa: BLE001 - any end of the stream is reported as its end
            if not self._closed.is_set():
                reason = f"the OpenCode server's event stream broke ({type(exc).__name__})"
        finally:
            if self._conn is not None:
                self._conn.close()
        self._put(("end", reason))

    def _put(self, item: tuple[str, Any]) -> None:
        while not self._closed.is_set():
            try:
                self.queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def next(self, timeout: float) -> tuple[str, Any]:
        return self.queue.get(timeout=timeout)

    def close(self) -> None:
        """Shut the socket: the reader thread sees the end, closes the connection and ends."""
        self._closed.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone
        if self._thread.is_alive():
            self._thread.join(2.0)


def _malformed(event: Any) -> str | None:
    """Why `event` is not an OpenCode event (`{type: str, properties: object}`), else None."""
    if not isinstance(event, dict):
        return "an event that is not a JSON object"
    if not isinstance(event.get("type"), str):
        return "an event without a type"
    if not isinstance(event.get("properties"), dict):
        return f"a {event['type'][:100]} event without properties"
    return None


def _descendants(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """`root` and its descendants, parents first."""
    if children is None:
        children = _process_table()[0]
    found, frontier = [root], [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found


def _descendant_groups(root: int) -> set[int]:
    """Process groups of `root`'s descendants other than its own (commands that made their own)."""
    children, groups = _process_table()
    return {groups[pid] for pid in _descendants(root, children)[1:] if groups.get(pid) not in (None, root)}


def _process_table() -> tuple[dict[int, list[int]], dict[int, int]]:
    """(children of each pid, process group of each pid), from /proc."""
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read(4096).decode("ascii", "replace")
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        try:
            ppid, pgrp = int(fields[1]), int(fields[2])
        except (IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
        groups[int(entry)] = pgrp
    return children, groups


def reap_leftovers(runs_dir: str | os.PathLike[str]) -> list[str]:
    """Servers whose owner died (a killed daemon): their groups killed, their dirs removed.
    A server whose owner still runs (another `caldera turn`, the daemon) is left alone.
    Returns the dirs removed."""
    removed: list[str] = []
    root = Path(runs_dir)
    try:
        entries = [p for p in root.iterdir() if p.name.startswith(".opencode-")]
    except OSError:
        return removed
    for path in entries:
        try:
            doc = json.loads((path / "server.json").read_text())
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict):
            owner_pid, owner_start = doc.get("owner_pid"), doc.get("owner_start_time")
            if (isinstance(owner_pid, int) and isinstance(owner_start, int)
                    and proc.same_process(owner_pid, owner_start)):
                continue
            pid, start = doc.get("pid"), doc.get("start_time")
            if isinstance(pid, int) and isinstance(start, int) and proc.same_process(pid, start):
                proc.signal_pgid(pid, signal.SIGKILL)
        elif time.time() - _mtime(path) < 120:
            continue  # being set up right now by another owner (no server.json yet)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
