"""A small control plane on 127.0.0.1 (stdlib http.server, port 0) with faults injected
per endpoint: status, body, delay, trickle, redirect, size, headers.

It speaks enough of protocol v1 for the client, the sender and the executor (register,
heartbeat, state report, commands next/start/finish, inventory, upload, download) and
records every request. `fault(path_regex, ...)` queues one fault (or `times=None`: every
time) for the requests whose path matches; the first matching fault is used.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
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


@dataclass
class Seen:
    method: str
    path: str
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)


class FaultPlane:
    def __init__(self):
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
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

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

    def seen(self, path_regex: str) -> list[Seen]:
        return [r for r in self.requests if re.search(path_regex, r.path)]

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.pattern.search(path) and (fault.method in (None, method)):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self.faults.remove(fault)
                    return fault
        return None

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, bytes, dict]:
        """The well-behaved answer."""
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


def _handler(plane: FaultPlane):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            plane.requests.append(Seen(self.command, self.path, dict(self.headers), body))
            fault = plane._take_fault(self.command, self.path)
            status, data, headers = plane.answer(self.command, self.path, body)
            if fault is not None:
                status, data, headers = self._faulted(fault, status, data, headers)
                if status is None:
                    return
            self._send(status, data, headers, fault.trickle if fault else None)

        def _faulted(self, fault: Fault, status, data, headers):
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
