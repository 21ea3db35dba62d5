"""`PlaneServer`: the plane on a stdlib ThreadingHTTPServer (HTTP/1.1 keep-alive), for
`caldera plane serve`, the demo and integration tests.

`requests` records every request as (method, path, status). `preauth` and `handle` are
the two steps of a request a subclass may take over (the tests' plane that injects
faults: tests/plane/plane_helpers.py); a connection `handle` drops is recorded with status 0.
"""
from __future__ import annotations

import http.server
import logging
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from caldera.plane import api, page
from caldera.plane.store import Store
from caldera.plane.validation import BODY_MAX_BYTES

log = logging.getLogger("caldera.plane")

JSON_BODY_CAP = BODY_MAX_BYTES  # validation's cap: a larger JSON body is refused (413) unread
UPLOAD_BODY_CAP = 256 * 1024 * 1024
STRAY_BODY_CAP = 64 * 1024  # a request that matches no agent route (404s, the page)
IDLE_TIMEOUT = 300  # seconds a keep-alive connection may stay silent


class _BadRequest(Exception):
    status = 400


class _TooLarge(_BadRequest):
    status = 413


class PlaneServer:
    """The control plane on `host:port` (port 0: a free one). `start()` serves on a thread."""

    def __init__(self, db_path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0,
                 tokens: dict[str, int] | None = None, heartbeat_interval: int = 15, poll_interval: int = 5,
                 session_ttl: float = 86400, clock: Callable[[], float] = time.time,
                 collect_skill_packages: bool = True, history_bucket_seconds: int = 60,
                 history_days: float = 7) -> None:
        self.store = Store(db_path, clock=clock, session_ttl=session_ttl,
                           history_bucket_seconds=history_bucket_seconds, history_days=history_days)
        for token, instance_id in (tokens if tokens is not None else {"boot-secret-token": 1}).items():
            self.store.add_instance(instance_id, token)
        self.plane = api.Plane(self.store, heartbeat_interval, poll_interval, collect_skill_packages)
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        try:
            self._httpd = _HTTPServer((host, port), _make_handler(self))
        except BaseException:
            self.store.close()  # a port that cannot be had leaves no database open behind it
            raise
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        return int(self._httpd.socket.getsockname()[1])

    def start(self) -> PlaneServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="plane-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until `stop()` (from another thread or a signal handler)."""
        self._httpd.serve_forever(poll_interval=0.2)

    def stop(self) -> None:
        self._httpd.shutdown()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # wake handler threads parked on idle keep-alive connections
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.store.close()

    def __enter__(self) -> PlaneServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def preauth(self, method: str, path: str, headers: dict[str, str]) -> api.Response | None:
        """The 401/400 for a wrong token, before the body is read; None: read the body and `handle` it."""
        return api.preauth(self.plane, method, path, headers)

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def count(self, method: str, path_regex: str, status: int | None = None) -> int:
        """How many recorded requests match (a convenience over `requests`)."""
        pattern = re.compile(path_regex)
        with self._lock:
            return sum(1 for m, p, s in self.requests
                       if m == method and pattern.search(p) and (status is None or s == status))

    # ---- one request ------------------------------------------------------------------

    def handle(self, req: api.Request) -> api.Response | None:
        """The answer to `req`; None means: drop the connection (never here; a subclass may)."""
        if req.path == "/" or req.path.startswith(("/plane/", "/agents/")):
            return page.handle(self.plane, req)
        found = api.route(req.method, req.path)
        if found is None and req.path.endswith("/") and api.route(req.method, req.path.rstrip("/")):
            # gin's RedirectTrailingSlash: 301 for GET, 307 for other methods
            return api.Response(301 if req.method == "GET" else 307, b"",
                                headers={"Location": req.path.rstrip("/")})
        return api.dispatch(self.plane, req)


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def _make_handler(plane_server: PlaneServer) -> type[_Handler]:
    class Handler(_Handler):
        server_ref = plane_server

    return Handler


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "caldera-plane"
    sys_version = ""
    timeout = IDLE_TIMEOUT
    server_ref: PlaneServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server_ref._lock:
            self.server_ref._conns.add(self.connection)

    def finish(self) -> None:
        with self.server_ref._lock:
            self.server_ref._conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, fmt: str, *args: Any) -> None:  # the stdlib prints to stderr; keep it at debug
        log.debug("%s %s", self.address_string(), fmt % args)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def _serve(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        # Authenticate first, cap second, read last: a body is buffered only for a client
        # that holds a valid token, and only up to the cap its route allows.
        early = self.server_ref.preauth(self.command, url.path, headers)
        if early is not None:
            self._refuse_unread(url.path, early)
            return
        try:
            body = self._read_body(url.path)
        except _BadRequest as exc:
            self._refuse_unread(url.path, api.error(exc.status, str(exc)))
            return
        req = api.Request(self.command, url.path, headers, body,
                          self.client_address[0], query=dict(urllib.parse.parse_qsl(url.query)))
        try:
            resp = self.server_ref.handle(req)
        except Exception as exc:  # noqa: BLE001 -- gin's recovery middleware: 500 with the reason
            log.exception("plane: %s %s failed", self.command, url.path)
            resp = api.error(500, f"Internal server error: {exc}")
        if resp is None:
            self.server_ref._record(self.command, url.path, 0)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        # recorded before the answer goes out: a client holding the answer finds the record
        self.server_ref._record(self.command, url.path, resp.status)
        self._send(resp)

    def _refuse_unread(self, path: str, resp: api.Response) -> None:
        """Answer without reading (the rest of) the body; the connection can't be reused then."""
        self.close_connection = True
        resp.headers["Connection"] = "close"
        self.server_ref._record(self.command, path, resp.status)
        self._send(resp)

    def _read_body(self, path: str) -> bytes:
        # No route, no use for a body: a stranger can't make the plane buffer megabytes there
        # (a trailing-slash redirect is answered before any token check, as gin does).
        known = api.route(self.command, path) is not None
        cap = (UPLOAD_BODY_CAP if known and path.endswith("/skills/upload")
               else JSON_BODY_CAP if known else STRAY_BODY_CAP)
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(cap)  # HTTP/1.1: chunked wins over Content-Length
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        if not length.isdigit():
            raise _BadRequest(f"bad Content-Length {length!r}")
        if int(length) > cap:
            raise _TooLarge(f"request body of {length} bytes is over the {cap}-byte limit")
        return self.rfile.read(int(length))

    def _read_chunked(self, cap: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1024).strip()
            try:
                n = int(line.split(b";")[0], 16)
            except ValueError:
                raise _BadRequest(f"bad chunk size {line[:40]!r}") from None
            if n == 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return b"".join(parts)
            size += n
            if size > cap:
                raise _TooLarge(f"request body over the {cap}-byte limit")
            parts.append(self.rfile.read(n))
            self.rfile.readline(8)

    def _send(self, resp: api.Response) -> None:
        try:
            self.send_response(resp.status)
            if resp.body or resp.status != 404:
                self.send_header("Content-Type", resp.content_type)
            self.send_header("Content-Length", str(len(resp.body)))
            for key, value in resp.headers.items():
                self.send_header(key, value)
            # One write for head and body: two small writes meet Nagle and the peer's delayed
            # ACK, a stall of the ACK timer per answer. The head is still in the stdlib's
            # buffer (`_headers_buffer`, which typeshed leaves out); flush_headers writes it.
            head: list[bytes] = self._headers_buffer  # type: ignore[attr-defined]
            head.append(b"\r\n")
            if self.command != "HEAD":
                head.append(resp.body)
            self.flush_headers()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
