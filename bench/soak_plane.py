"""The soak's control plane: the repo's embedded plane (caldera.plane) that records what it
was sent, behind a fault-injecting HTTP proxy on loopback whose behaviour the soak switches.

`RecordingPlane` is the real PlaneServer; it keeps, per command, every finish request it got
(the status it carried, the HTTP answer, and whether that request changed the command's
state), every session token it issued and every register it took.

`FaultProxy` listens on the port the runtime is given and forwards to the plane. Its mood
(`set_mode`) is one of MODES; the plane's own answer is only replaced where the request was
idempotent at the plane (heartbeat, report, start, finish, inventory): a command the plane
handed out (`commands/next`) or a session it issued (`register`) is never thrown away by the
proxy, since no runtime could recover those (the server hands a command out once) and
losing them would be the harness's fault, not the runtime's. For the same reason the soak's
kills and the port_closed cut wait for `HandOuts.when_quiet`: a runtime killed (or cut off)
while the plane's hand-out is still on the wire, or before it has the command durably, loses
a command no runtime could keep.
"""
from __future__ import annotations

import http.client
import http.server
import json
import os
import random
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caldera.plane import api
from caldera.plane.server import PlaneServer

CLIENT_TOTAL = 30.0  # caldera.protocol.client.TOTAL: a hang must outlast it
HANG_SECONDS = CLIENT_TOTAL + 4
TRICKLE_SECONDS = 6.0  # a trickled answer arrives whole well inside the client's deadline
MISMATCH = "Agent ID does not match session"
# A kill (or the port_closed cut) waits at most this long for a quiet wire: well inside the
# client's deadline, so a poll held behind it is still wanted when it goes on.
KILL_HOLD_LIMIT = 20.0
QUIET_STEP = 0.1  # how often a wait for a quiet wire looks at the plane and the state dir again

# The proxy's moods (the soak's episode kinds, but disk_full, which is the soak's own).
MODES = ("healthy", "503", "finish500", "finish500_taken", "hang_heartbeat", "401", "403", "garbage",
         "429", "trickle", "port_closed")


@dataclass
class FinishSeen:
    at: float
    status: str | None  # the finish body's status
    error: str | None
    http: int  # the plane's answer
    changed: bool  # this request moved the command to a terminal state


@dataclass
class Ledger:
    """What the plane saw, for the accounting."""

    finishes: dict[int, list[FinishSeen]] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)  # every session token issued
    registers: list[float] = field(default_factory=list)  # when each register was taken
    heartbeats: list[float] = field(default_factory=list)  # when each heartbeat was taken


class RecordingPlane(PlaneServer):
    """The embedded plane, recording finishes and registers (one finish at a time, so
    'which request changed the state' has one answer)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The accounting reads every command: the plane's own pruning of finished commands past
        # the newest 500 would hide most of an hour's (860 or so) from it.
        self.store.commands_kept = 1 << 30
        self.ledger = Ledger()
        self._finish_lock = threading.Lock()

    def handle(self, req: api.Request) -> api.Response | None:
        if req.method == "POST" and req.path.endswith("/finish"):
            with self._finish_lock:
                return self._finish(req)
        resp = super().handle(req)
        if resp is not None and req.path.endswith("/heartbeat") and resp.status == 200:
            self.ledger.heartbeats.append(time.time())
        if resp is not None and req.path.endswith("/agent/register") and resp.status == 200:
            token = json.loads(resp.body)["data"]["session_token"]
            with self._finish_lock:
                self.ledger.tokens.append(token)
                self.ledger.registers.append(time.time())
        return resp

    def _finish(self, req: api.Request) -> api.Response | None:
        command_id = _command_id(req.path)
        before = self._status(command_id)
        resp = super().handle(req)
        after = self._status(command_id)
        try:
            body = json.loads(req.body)
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        if command_id is not None:
            seen = FinishSeen(time.time(), body.get("status"), body.get("error_message"),
                              resp.status if resp is not None else 0,
                              before not in ("succeeded", "failed") and after in ("succeeded", "failed"))
            self.ledger.finishes.setdefault(command_id, []).append(seen)
        return resp

    def _status(self, command_id: int | None) -> str | None:
        if command_id is None:
            return None
        rows = self.store._read("SELECT status FROM commands WHERE id=?", (command_id,))
        return rows[0]["status"] if rows else None

    def drop_session(self, instance_id: int) -> bool:
        """The plane forgets the instance's session (as a plane restored from a backup would):
        the runtime's next call gets the plane's own 401. True when there was one."""
        with self.store._tx() as db:
            return db.execute("UPDATE agents SET session_token=NULL WHERE instance_id=? AND session_token IS NOT"
                              " NULL", (instance_id,)).rowcount > 0

    def session_token(self, instance_id: int) -> str | None:
        rows = self.store._read("SELECT session_token FROM agents WHERE instance_id=?", (instance_id,))
        return rows[0]["session_token"] if rows else None


def _command_id(path: str) -> int | None:
    parts = path.rstrip("/").split("/")
    return int(parts[-2]) if len(parts) >= 2 and parts[-2].isdigit() else None


# ---- the proxy -----------------------------------------------------------------------------

@dataclass
class Held:
    """What `HandOuts.when_quiet` waited for: its seconds, and the hand-outs it gave up on
    (the limit was hit): command ids not yet confirmed, answers still on the wire."""

    waited: float
    unconfirmed: list[int]
    on_wire: int


class HandOuts:
    """The `commands/next` answers on the wire and the commands they handed out. The plane
    marks a command dispatched as it answers and never hands it out again (SPEC §5), so from
    that answer until the runtime has the command durably a kill (or a cut connection) loses
    it whatever the runtime does. `when_quiet` runs an action (the soak's SIGKILL, the
    port_closed cut) only outside that window: no answer on the wire and every command
    handed out confirmed by `confirmed(id)` (durably kept: see `durably_kept`).

    `begin` and the action take the same lock, and `begin` forwards a poll only when its
    client is still connected: a poll the proxy counts after a kill finds its client gone and
    is never forwarded, one counted before it holds the kill until its command is confirmed."""

    def __init__(self, confirmed: Callable[[int], bool]) -> None:
        self._cond = threading.Condition()
        self._confirmed = confirmed
        self._on_wire = 0
        self._pending = 0  # actions waiting for a quiet wire: new polls wait behind them
        self._unconfirmed: set[int] = set()

    def begin(self, alive: Callable[[], bool], stop: threading.Event) -> bool:
        """A poll is about to be forwarded: False (not forwarded) when its client is gone.
        A poll that comes while an action waits for a quiet wire waits for that action."""
        with self._cond:
            while self._pending and not stop.is_set():
                self._cond.wait(QUIET_STEP)
            if not alive():
                return False
            self._on_wire += 1
            return True

    def end(self, command_id: int | None) -> None:
        """The poll's answer is written (or failed); `command_id`: the command it handed out."""
        with self._cond:
            self._on_wire -= 1
            if command_id is not None:
                self._unconfirmed.add(command_id)
            self._cond.notify_all()

    def _quiet(self) -> bool:
        self._unconfirmed = {cid for cid in self._unconfirmed if not self._confirmed(cid)}
        return self._on_wire == 0 and not self._unconfirmed

    def when_quiet(self, action: Callable[[], object], stop: threading.Event) -> Held:
        """Run `action` under the lock once no answer is on the wire and every command handed
        out is confirmed, or after KILL_HOLD_LIMIT (the ids given up on are in the result)."""
        start = time.monotonic()
        with self._cond:
            self._pending += 1
            try:
                while (not self._quiet() and time.monotonic() - start < KILL_HOLD_LIMIT
                       and not stop.is_set()):
                    self._cond.wait(QUIET_STEP)
                held = Held(time.monotonic() - start, sorted(self._unconfirmed), self._on_wire)
                self._unconfirmed.clear()  # given up on: the caller notes them
                action()
            finally:
                self._pending -= 1
                self._cond.notify_all()
        return held


def durably_kept(plane: RecordingPlane, state_dir: Path) -> Callable[[int], bool]:
    """A handed-out command is kept once the plane has it past `dispatched` (started or
    finished), or the runtime's state dir names it: a key of state.json's journal
    ("commands"), or an outbox item (its start or finish, written before the journal entry
    goes). Files read as they are: absent or half-written counts as not there."""

    def kept(command_id: int) -> bool:
        try:
            if plane._status(command_id) not in (None, "pending", "dispatched"):
                return True
        except sqlite3.Error:
            pass  # the plane is stopping: the state dir may still say
        return str(command_id) in _journal(state_dir / "state.json") or command_id in _outboxed(state_dir / "outbox")

    return kept


def _journal(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    commands = doc.get("commands") if isinstance(doc, dict) else None
    return commands if isinstance(commands, dict) else {}


def _outboxed(outbox: Path) -> set[int]:
    ids = set()
    try:
        names = [n for n in os.listdir(outbox) if n.endswith(".json") and n[:1].isdigit()]
    except OSError:
        return ids
    for name in names:
        try:
            item = json.loads((outbox / name).read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(item, dict) and isinstance(item.get("command_id"), int):
            ids.add(item["command_id"])
    return ids


def handed_out_id(data: bytes) -> int | None:
    """The id of the command a `commands/next` answer carries (data.command.id), else None."""
    try:
        command = json.loads(data)["data"]["command"]
    except (ValueError, KeyError, TypeError):
        return None
    cid = command.get("id") if isinstance(command, dict) else None
    return cid if isinstance(cid, int) else None


def client_gone(sock: socket.socket) -> bool:
    """The client closed its end (EOF or reset), seen without reading: a peek that does not wait."""
    timeout = sock.gettimeout()
    try:
        sock.settimeout(0)  # with a timeout, Python waits for readability before the peek
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:  # ConnectionResetError, or the socket already shut down or closed
        return True
    finally:
        try:
            sock.settimeout(timeout)
        except OSError:
            pass


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1:`port` (0: a free one) in front of `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int], rng: random.Random, stop: threading.Event,
                 confirmed: Callable[[int], bool], port: int = 0):
        self.upstream, self.rng, self.stop = upstream, rng, stop
        self.mode = "healthy"
        self.stale_token: str | None = None  # 403 mode: requests carrying it are refused
        self.counts: dict[str, int] = {}  # (mode, what was done) -> how often
        self.handouts = HandOuts(confirmed)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._server = self._listen(port)
        self.port = self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _listen(self, port: int) -> http.server.ThreadingHTTPServer:
        server = _Server(("127.0.0.1", port), _handler_for(self))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="soak-proxy",
                         daemon=True).start()
        return server

    def set_mode(self, mode: str, stale_token: str | None = None) -> Held | None:
        """Switch the mood; closing the port waits for a quiet wire (`HandOuts.when_quiet`),
        as cutting a hand-out's connection loses its command: what it waited for then."""
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}")
        if mode == "port_closed" and self.mode != "port_closed":
            return self.handouts.when_quiet(lambda: (self._switch(mode, stale_token), self._close()), self.stop)
        was = self._switch(mode, stale_token)
        if was == "port_closed" and mode != "port_closed":
            self._server = self._listen(self.port)
        return None

    def _switch(self, mode: str, stale_token: str | None) -> str:
        with self._lock:
            was, self.mode, self.stale_token = self.mode, mode, stale_token
        return was

    def _close(self) -> None:
        """Stop listening (connection refused) and cut the connections that are open."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self.mode != "port_closed":
            self._close()

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(method, path, body=body or None, headers=sent)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()


_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
               "content-length", "host"}
_IDEMPOTENT = ("/heartbeat", "/state/report", "/start", "/finish", "/skills/inventory", "/events")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def _handler_for(proxy: FaultProxy) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_ProxyHandler):
        owner = proxy

    return Handler


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120
    owner: FaultProxy

    def setup(self) -> None:
        super().setup()
        self.owner.track(self.connection, True)

    def finish(self) -> None:
        self.owner.track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, fmt: str, *args: Any) -> None:
        pass  # the stdlib prints every request to stderr

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = self.headers.get("Content-Length")
        body = self.rfile.read(int(length)) if length and length.isdigit() else b""
        headers = dict(self.headers.items())
        mode, stale = self.owner.mode, self.owner.stale_token
        path = self.path.split("?")[0]
        try:
            self._act(mode, stale, path, headers, body)
        except (OSError, http.client.HTTPException) as exc:
            self.owner.count(f"{mode}: connection error {type(exc).__name__}")
            self.close_connection = True

    def _act(self, mode: str, stale: str | None, path: str, headers: dict[str, str], body: bytes) -> None:
        register = path.endswith("/agent/register")
        idempotent = path.endswith(_IDEMPOTENT)
        if mode == "503":
            return self._answer(503, _error("service unavailable (soak)"), "503")
        if mode == "429":
            wait = self.owner.rng.randint(1, 6)
            return self._answer(429, _error("too many requests (soak)"), "429", {"Retry-After": str(wait)})
        if mode == "hang_heartbeat" and path.endswith("/heartbeat"):
            self.owner.count("hang_heartbeat: held")
            self.owner.stop.wait(HANG_SECONDS)
            self.close_connection = True
            return None
        if mode == "403" and not register and stale and _bearer(headers) == stale:
            return self._answer(403, _error(MISMATCH), "403")
        if mode in ("finish500", "finish500_taken") and path.endswith("/finish"):
            if mode == "finish500_taken":
                self.owner.forward(self.command, self.path, headers, body)
            return self._answer(500, _error("internal server error (soak)"), mode)
        if mode == "garbage" and (register or not idempotent):
            return self._garbage(None)
        if path.endswith("/commands/next"):
            return self._hand_out(mode, headers, body)
        return self._pass(mode, headers, body)

    def _hand_out(self, mode: str, headers: dict[str, str], body: bytes) -> None:
        """Forward a poll whose client is still there, its answer counted on the wire until
        written whole (or failed), the command it carried recorded for confirmation."""
        if not self.owner.handouts.begin(lambda: not client_gone(self.connection), self.owner.stop):
            self.owner.count("client gone before its poll")
            self.close_connection = True
            return None
        command_id = None
        try:
            status, resp_headers, data = self.owner.forward(self.command, self.path, headers, body)
            command_id = handed_out_id(data)
            self._relay_as(mode, status, resp_headers, data)
        finally:
            self.owner.handouts.end(command_id)
        return None

    def _pass(self, mode: str, headers: dict[str, str], body: bytes) -> None:
        """Forward to the plane and relay its answer as the mood says."""
        status, resp_headers, data = self.owner.forward(self.command, self.path, headers, body)
        self._relay_as(mode, status, resp_headers, data)

    def _relay_as(self, mode: str, status: int, resp_headers: list, data: bytes) -> None:
        if mode == "garbage":
            self._garbage(status)
        elif mode == "trickle":
            self._trickle(status, resp_headers, data)
        else:
            self._relay(status, resp_headers, data)

    def _relay(self, status: int, resp_headers: list, data: bytes, what: str = "forwarded") -> None:
        self.owner.count(f"{self.owner.mode}: {what}")
        self._head(status, resp_headers, len(data))
        self.wfile.write(data)

    def _head(self, status: int, resp_headers: list, length: int) -> None:
        """The plane's status line and end-to-end headers, with the body's length."""
        self.send_response(status)
        for key, value in resp_headers:
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _answer(self, status: int, data: bytes, what: str, extra: dict[str, str] | None = None) -> None:
        self.owner.count(f"{what}: answered {status}")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _garbage(self, forwarded: int | None) -> None:
        """A 200 whose body is no usable JSON: garbage, or valid JSON cut short (declared
        whole, or with a Content-Length the connection never delivers)."""
        kind = self.owner.rng.choice(("garbage", "cut", "short"))
        self.owner.count(f"garbage: {kind}{' after forwarding' if forwarded else ''}")
        whole = b'{"success":true,"message":"ok","data":{"command":null,"server_time":"2030-01-01T00:00:00Z"}}'
        data = {"garbage": b"<html>\x00\xff soak garbage }{", "cut": whole[:37], "short": whole[:37]}[kind]
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(whole) if kind == "short" else len(data)))
        self.end_headers()
        self.wfile.write(data)
        if kind == "short":
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def _trickle(self, status: int, resp_headers: list, data: bytes) -> None:
        self.owner.count("trickle: trickled")
        self._head(status, resp_headers, len(data))
        self.wfile.flush()
        step = max(1, len(data) // 60)
        pause = TRICKLE_SECONDS / max(1, len(data) / step)
        for start in range(0, len(data), step):
            self.wfile.write(data[start:start + step])
            self.wfile.flush()
            if self.owner.stop.wait(pause):
                break


def _error(message: str) -> bytes:
    return json.dumps({"success": False, "error": message}).encode()


def _bearer(headers: dict[str, str]) -> str | None:
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None
