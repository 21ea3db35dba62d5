"""A small control plane on 127.0.0.1 (stdlib http.server, port 0) with faults injected
per endpoint: status, body, delay, trickle, redirect, size, headers.

It speaks enough of protocol v1 for the client, the sender and the executor (register,
heartbeat, state report, commands next/start/finish, inventory, upload, download) and
records every request. `fault(path_regex, ...)` queues one fault (or `times=None`: every
time) for the requests whose path matches; the first matching fault is used.

`FaultPlane(strict=True)` (the `wire` fixture of tests/conftest.py) answers only what a test
registers with `route()`, the way the `responses` library did before the client left requests
(issue 41): anything else gets 599 naming the request, and is kept in `unmatched`.
"""
from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API = "/api/v1/agent"


def ok(data=None) -> bytes:
    return json.dumps({"success": True, "message": "ok", "data": data}).encode()


@dataclass
class Fault:
    pattern: re.Pattern
    method: str | None = None
    status: int | None = None
    body: bytes | None = None
    delay: float | None = None  # seconds before answering (the plane's release() ends it)
    hang: bool = False  # never answer until release()
    trickle: float | None = None  # seconds between single bytes of the body
    redirect: str | None = None  # a Location (status 307 unless given)
    size: int | None = None  # a 200 body of this many bytes (the `body` as its head, padded)
    headers: dict = field(default_factory=dict)
    times: int | None = 1
    callback: Callable[[Seen], tuple] | None = None  # the answer: (status, headers, body)
    drop: bool = False  # close the connection without an answer
    required: bool = False  # `unfired()` names it until a request used it
    used: int = 0


@dataclass
class Seen:
    method: str
    path: str
    headers: Message  # looked up without regard to case, as HTTP's names are
    body: bytes
    status: int | None = None  # what the plane answered; 0: the connection was closed instead

    def json(self):
        return json.loads(self.body)


class FaultPlane:
    def __init__(self, strict: bool = False):
        self.strict = strict
        self.unmatched: list[Seen] = []  # strict: the requests no route answered
        self.requests: list[Seen] = []
        self.faults: list[Fault] = []
        self.commands: list[dict] = []
        self.downloads: dict[str, bytes] = {}
        self.registrations = 0
        self.released = threading.Event()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)

    def start(self) -> FaultPlane:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def fault(self, path: str, **kw) -> Fault:
        fault = Fault(re.compile(path), **kw)
        with self._lock:
            self.faults.append(fault)
        return fault

    def route(self, method: str, path: str | re.Pattern, *, status: int = 200, json=None, body: bytes | str = b"",
              headers: dict | None = None, callback: Callable[[Seen], tuple] | None = None, drop: bool = False,
              times: int | None = None, required: bool = True) -> Fault:
        """Answer `method` on `path` (exact, the query aside; a compiled pattern is searched) with
        `status` and `json` (encoded) or `body`, or `callback(seen)`'s (status, headers, body), or
        `drop` the connection; `times` answers, or for ever. Registered again, a route's earlier
        answer is used once, then the next (as `responses` did)."""
        if isinstance(path, str):
            path = re.compile("^" + re.escape(path.removeprefix(self.url)) + r"(?:\?|$)")
        data = body.encode() if isinstance(body, str) else body
        if json is not None:
            data = _json_bytes(json)
        with self._lock:
            for earlier in self.faults:
                if earlier.times is None and (earlier.method, earlier.pattern) == (method.upper(), path):
                    earlier.times = 1
        return self.fault(path.pattern, method=method.upper(), status=status, body=data, headers=dict(headers or {}),
                          callback=callback, drop=drop, times=times, required=required)

    def unfired(self) -> list[str]:
        """The required routes no request used yet."""
        return [f"{f.method} {f.pattern.pattern}" for f in self.faults if f.required and not f.used]

    def seen(self, path_regex: str = "") -> list[Seen]:
        return [r for r in self.requests if re.search(path_regex, r.path)]

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.pattern.search(path) and (fault.method in (None, method)):
                    fault.used += 1
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self.faults.remove(fault)
                    return fault
        return None

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, bytes, dict]:
        """The well-behaved answer (strict: 599, saying what was not registered)."""
        if self.strict:
            return 599, _json_bytes({"success": False, "error": f"the fake plane has no route for {method} {path}"}), {}
        if path == API + "/register":
            self.registrations += 1
            return 200, ok({"session_token": f"agt_sess_fault_{self.registrations}",
                            "heartbeat_interval_seconds": 15, "command_poll_interval_seconds": 5}), {}
        if path == API + "/heartbeat":
            return 200, ok({"has_pending_command": bool(self.commands)}), {}
        if path == API + "/commands/next":
            return 200, ok({"command": self.commands.pop(0) if self.commands else None}), {}
        match = re.fullmatch(API + r"/skills/versions/([^/]+)/download", path)
        if match:
            data = self.downloads.get(match.group(1))
            if data is None:
                return 404, b'{"success":false,"error":"skill version not found"}', {}
            return 200, data, {"Content-Type": "application/zip"}
        if path == API + "/skills/upload":
            return 201, ok({"id": 1, "external_skill_id": "skill_1"}), {}
        return 200, ok(None), {}


def _json_bytes(value) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


def _handler(plane: FaultPlane):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # head and body are two writes: no delayed-ACK wait between them

        def log_message(self, *args):
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""
            chunks = []  # a client streaming a body of unknown length (http.client does for an iterable)
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # the trailer
            return b"".join(chunks)

        def _serve(self):
            body = self._body()
            seen = Seen(self.command, self.path, self.headers, body)
            plane.requests.append(seen)
            fault = plane._take_fault(self.command, self.path)
            if fault is None and plane.strict:
                plane.unmatched.append(seen)
            status, data, headers = plane.answer(self.command, self.path, body)
            if fault is not None:
                status, data, headers = self._faulted(fault, seen, status, data, headers)
                if status is None:
                    seen.status, self.close_connection = 0, True
                    return
            seen.status = status
            self._send(status, data, headers, fault.trickle if fault else None)

        def _faulted(self, fault: Fault, seen: Seen, status, data, headers):
            if fault.drop:
                return None, b"", {}
            if fault.callback is not None:
                status, headers, data = fault.callback(seen)
                return status, data.encode() if isinstance(data, str) else _json_bytes(data), headers
            if fault.hang:
                plane.released.wait()
                return None, b"", {}
            if fault.delay:
                plane.released.wait(fault.delay)
            headers = {**headers, **fault.headers}
            if fault.redirect is not None:
                return fault.status or 307, b"", {**headers, "Location": fault.redirect}
            if fault.size is not None:
                head = fault.body or b""
                return fault.status or 200, head + b" " * (fault.size - len(head)), headers
            if fault.body is not None:
                data = fault.body
            return fault.status or status, data, headers

        def _send(self, status, data: bytes, headers: dict, trickle: float | None):
            self.send_response(status)
            headers = {"Content-Type": "application/json", **headers}
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                if trickle:
                    for i in range(len(data)):
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        if plane.released.wait(trickle):
                            return
                else:
                    self.wfile.write(data)
            except OSError:
                pass  # the client hung up (a deadline): that is the point of the fault

        do_GET = do_POST = _serve

    return Handler
