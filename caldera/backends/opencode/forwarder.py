"""The loopback forwarder between OpenCode and its provider: the provider's secrets never
enter OpenCode's process, so its tools (Bash) and the agent's commands cannot read them.

OpenCode's config points each provider at `http://127.0.0.1:PORT/r/<route token>` and
carries placeholders where the secrets were (`apiKey`, header values). Each request to a
route is sent to the provider's real base URL with every placeholder in its header values
and its query replaced by the real value; the answer is streamed back as it comes (SSE).
A request to anything but a route is refused (404), so the forwarder is no open relay.

What it saw of each provider answer that failed is kept per OpenCode session (the
`x-session-id` header OpenCode sends): the status wins over OpenCode's text when a
failure is classified. A provider that cannot be reached is answered 502 with a sentence.

Threads: the accept loop `opencode-forwarder` and one per request (ThreadingHTTPServer,
daemon threads), all ended by `close()`.
"""
from __future__ import annotations

import base64
import collections
import functools
import http.client
import json
import secrets
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONNECT_TIMEOUT = 15.0
READ_TIMEOUT = 300.0  # between two reads of a provider's answer (OpenCode's own header timeout is 300 s)
MAX_BODY = 64 * 1024 * 1024  # a request body OpenCode sends (the conversation); more is refused
ERROR_BODY_CAP = 16 * 1024
FAILURES_KEPT = 256
_HOP = {"accept-encoding", "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "host", "content-length"}


@dataclass(frozen=True)
class Upstream:
    """One failed provider answer as the forwarder saw it."""
    status: int | None  # None: no answer (connection refused, timeout, TLS)
    message: str


@dataclass(frozen=True)
class Route:
    token: str
    base_url: str  # the provider's real base URL (may hold credentials: never shown)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass  # the driver logs what matters, redacted

    def do_POST(self) -> None:
        self._forward()

    def do_GET(self) -> None:
        self._forward()

    def _forward(self) -> None:
        forwarder = self.server.forwarder
        route, rest = forwarder.route_for(self.path)
        if route is None:
            return self._answer(404, "no such route")
        try:
            body = self._body()
        except ValueError as exc:
            return self._answer(400, str(exc))
        session = self.headers.get("x-session-id") or ""
        target = urllib.parse.urlsplit(route.base_url)
        path = forwarder.fill(target.path.rstrip("/") + rest)
        headers = {k: forwarder.fill(v) for k, v in self.headers.items() if k.lower() not in _HOP}
        headers["Accept-Encoding"] = "identity"  # what the forwarder records of a failure stays readable
        if target.username is not None and "authorization" not in {k.lower() for k in headers}:
            headers["Authorization"] = forwarder.basic(target)
        conn = _connection(target)
        sock: socket.socket | None = None
        try:
            try:
                conn.connect()
                sock = conn.sock  # kept: http.client lets go of it once an answer says "close"
                if sock is not None:
                    sock.settimeout(READ_TIMEOUT)
                    forwarder.opened(session, sock)
                conn.request(self.command, path, body=body, headers=headers)
                answer = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                reason = _reason(exc)
                forwarder.record(session, Upstream(None, f"cannot reach the provider at {_host(target)}: {reason}"))
                return self._answer(502, f"caldera forwarder: cannot reach the provider at {_host(target)}: {reason}")
            self._relay(answer, session)
        finally:
            if sock is not None:
                forwarder.closed(session, sock)
            conn.close()

    def _body(self) -> bytes:
        """The request body: by Content-Length, or chunked; at most MAX_BODY bytes."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts: list[bytes] = []
            size = 0
            while True:
                line = self.rfile.readline(1024).split(b";")[0].strip()
                chunk = int(line or b"0", 16)
                if chunk == 0:
                    self.rfile.readline(1024)  # the empty line after the last chunk (no trailers sent)
                    return b"".join(parts)
                size += chunk
                if size > MAX_BODY:
                    raise ValueError("request body too large")
                parts.append(self.rfile.read(chunk))
                self.rfile.readline(8)  # CRLF after each chunk
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY or length < 0:
            raise ValueError("request body too large")
        return self.rfile.read(length) if length else b""

    def _relay(self, answer: http.client.HTTPResponse, session: str) -> None:
        forwarder = self.server.forwarder
        if answer.status >= 400:
            body = answer.read(ERROR_BODY_CAP)
            forwarder.record(session, Upstream(answer.status, body.decode("utf-8", "replace")))
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in _HOP:
                self.send_header(key, value)
        self.send_header("Connection", "close")  # the body ends when the connection does
        self.end_headers()
        self.close_connection = True
        while True:
            try:
                chunk = answer.read1(65536)
            except (OSError, http.client.HTTPException) as exc:
                forwarder.record(session, Upstream(None, f"the provider's answer broke off: {_reason(exc)}"))
                return  # closing our side tells OpenCode the stream was cut
            if not chunk:
                return
            self.wfile.write(chunk)
            self.wfile.flush()

    def _answer(self, status: int, message: str) -> None:
        raw = json.dumps({"error": {"message": message, "type": "caldera_forwarder"}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


def _connection(target: urllib.parse.SplitResult) -> http.client.HTTPConnection:
    host, port = target.hostname or "", target.port
    if target.scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=CONNECT_TIMEOUT, context=ssl.create_default_context())
    return http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT)


def _host(target: urllib.parse.SplitResult) -> str:
    return f"{target.hostname}:{target.port}" if target.port else str(target.hostname)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    forwarder: Forwarder

    def handle_error(self, request: Any, client_address: Any) -> None:
        # OpenCode hung up (an aborted turn, a stopped server): nothing to print; the
        # request's own failure, if any, was recorded for its session.
        self.forwarder.note_error()


@functools.cache
def process_secret() -> str:
    """A random prefix, one per process, of every server password, route token and
    placeholder it makes: the Redactor masks it once, and with it every one of them (their
    random rest alone opens nothing). Masking each whole value instead would add three
    values to the daemon's one Redactor at every server start, for ever: every log line
    and event would get slower the longer the daemon ran."""
    return secrets.token_hex(16)


class Forwarder:
    """Routes (one per provider) and the secrets their placeholders stand for."""

    def __init__(self, base_urls: dict[str, str], secret_values: Iterable[str]):
        self._routes = {process_secret() + secrets.token_hex(8): url for url in set(base_urls.values())}
        by_url = {url: token for token, url in self._routes.items()}
        self.route_of = {pid: by_url[url] for pid, url in base_urls.items()}  # provider id -> token
        self.placeholders = {f"caldera-secret-{process_secret()}{secrets.token_hex(8)}": value
                             for value in sorted(set(secret_values)) if value}
        self._failures: collections.OrderedDict[str, Upstream] = collections.OrderedDict()
        self._open: dict[str, set[socket.socket]] = {}  # session -> its provider connections
        self.errors = 0  # requests that ended in an exception (the client went away, mostly)
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.forwarder = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="opencode-forwarder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def url_for(self, provider: str) -> str:
        return f"http://127.0.0.1:{self.port}/r/{self.route_of[provider]}"

    def placeholder_for(self, value: str) -> str | None:
        return next((p for p, v in self.placeholders.items() if v == value), None)

    def route_for(self, path: str) -> tuple[Route | None, str]:
        parts = path.split("/", 3)  # "", "r", token, rest
        if len(parts) < 3 or parts[1] != "r" or parts[2] not in self._routes:
            return None, ""
        return Route(parts[2], self._routes[parts[2]]), "/" + (parts[3] if len(parts) > 3 else "")

    def fill(self, text: str) -> str:
        for placeholder, value in self.placeholders.items():
            if placeholder in text:
                text = text.replace(placeholder, value)
        return text

    def basic(self, target: urllib.parse.SplitResult) -> str:
        pair = f"{urllib.parse.unquote(target.username or '')}:{urllib.parse.unquote(target.password or '')}"
        return "Basic " + base64.b64encode(pair.encode()).decode()

    def record(self, session: str, failure: Upstream) -> None:
        with self._lock:
            self._failures[session] = failure
            self._failures.move_to_end(session)
            while len(self._failures) > FAILURES_KEPT:
                self._failures.popitem(last=False)

    def last_failure(self, session: str) -> Upstream | None:
        with self._lock:
            return self._failures.get(session)

    def note_error(self) -> None:
        with self._lock:
            self.errors += 1

    def opened(self, session: str, sock: socket.socket) -> None:
        with self._lock:
            self._open.setdefault(session, set()).add(sock)

    def closed(self, session: str, sock: socket.socket) -> None:
        with self._lock:
            left = self._open.get(session)
            if left is not None:
                left.discard(sock)
                if not left:
                    del self._open[session]

    def cut(self, session: str | None = None) -> None:
        """Shut the provider connections of `session` (all when None): a request thread
        blocked on a silent provider ends now, not after READ_TIMEOUT."""
        with self._lock:
            socks = [c for s, group in self._open.items() if session is None or s == session for c in group]
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
        self.cut()
