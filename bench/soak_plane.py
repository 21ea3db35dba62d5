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
kills wait for `HandOuts.when_quiet`: a runtime killed while the plane's hand-out is still on
the wire, or before it had a moment to journal it, loses a command no runtime could keep.
"""
from __future__ import annotations

import http.client
import http.server
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from caldera.plane import api
from caldera.plane.server import PlaneServer

CLIENT_TOTAL = 30.0  # caldera.protocol.client.TOTAL: a hang must outlast it
HANG_SECONDS = CLIENT_TOTAL + 4
TRICKLE_SECONDS = 6.0  # a trickled answer arrives whole well inside the client's deadline
MISMATCH = "Agent ID does not match session"
HANDOUT_SETTLE = 1.5  # after a hand-out's last byte: the runtime's time to journal it
KILL_HOLD_LIMIT = 30.0  # a kill waits at most this long for a quiet wire

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

class HandOuts:
    """The `commands/next` answers on the wire. The plane marks a command dispatched as it
    answers and never hands it out again (SPEC §5), so between that answer and the runtime's
    journal a kill loses the command whatever the runtime does; `when_quiet` lets an action
    (the soak's SIGKILL) run only outside that window, holding new hand-outs back meanwhile."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._on_wire = 0
        self._last = 0.0  # monotonic: when the last hand-out carrying a command was delivered

    def begin(self) -> None:
        with self._cond:
            self._on_wire += 1

    def end(self, carried: bool) -> None:
        with self._cond:
            self._on_wire -= 1
            if carried:
                self._last = time.monotonic()
            self._cond.notify_all()

    def when_quiet(self, action: Callable[[], None], stop: threading.Event) -> float:
        """Run `action` once no hand-out is on the wire and the last one was delivered
        HANDOUT_SETTLE ago (at most KILL_HOLD_LIMIT later); how long it waited."""
        start = time.monotonic()
        with self._cond:
            while time.monotonic() - start < KILL_HOLD_LIMIT and not stop.is_set():
                settle = self._last + HANDOUT_SETTLE - time.monotonic()
                if self._on_wire == 0 and settle <= 0:
                    break
                self._cond.wait(max(0.05, settle) if self._on_wire == 0 else 0.5)
            action()
        return time.monotonic() - start


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1:`port` (0: a free one) in front of `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int], rng: random.Random, stop: threading.Event, port: int = 0):
        self.upstream, self.rng, self.stop = upstream, rng, stop
        self.mode = "healthy"
        self.stale_token: str | None = None  # 403 mode: requests carrying it are refused
        self.counts: dict[str, int] = {}  # (mode, what was done) -> how often
        self.handouts = HandOuts()
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

    def set_mode(self, mode: str, stale_token: str | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}")
        with self._lock:
            was, self.mode, self.stale_token = self.mode, mode, stale_token
        if mode == "port_closed" and was != "port_closed":
            self._close()
        elif was == "port_closed" and mode != "port_closed":
            self._server = self._listen(self.port)

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
        """Forward a poll, its answer counted on the wire until written whole (or failed)."""
        self.owner.handouts.begin()
        carried = False
        try:
            carried = self._pass(mode, headers, body)
        finally:
            self.owner.handouts.end(carried)

    def _pass(self, mode: str, headers: dict[str, str], body: bytes) -> bool:
        """Forward to the plane and relay its answer as the mood says; True when the answer
        handed out a command."""
        status, resp_headers, data = self.owner.forward(self.command, self.path, headers, body)
        carried = b'"command":{' in data.replace(b" ", b"")
        if mode == "garbage":
            self._garbage(status)
        elif mode == "trickle":
            self._trickle(status, resp_headers, data)
        else:
            self._relay(status, resp_headers, data)
        return carried

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
