"""The run's loopback forwarder: the one place the Claude credential is used.

Claude Code's Bash tool inherits the CLI's environment, so a key in that environment is a
key the agent's commands can print (docs/backends.md, "Claude Code"). The CLI is given
instead `ANTHROPIC_BASE_URL=http://127.0.0.1:<port>` and, as its key, a random token of
this run; this forwarder (a thread of the runtime, bound to 127.0.0.1, alive only during
the run) accepts only requests that carry that token, only `POST /v1/messages…`, puts the
real key in their place and streams the provider's answer back as it comes (bounded
reads, nothing buffered whole), TLS verified, with its own timeout. The one listening
socket besides `caldera plane` (SPEC section 11): loopback only, per run, closed after it.

A `Retry-After` longer than RETRY_AFTER_CAP is shortened to it: a failing provider must
end the turn within a minute with its kind (the CLI honours the header as it is).
"""
from __future__ import annotations

import hmac
import http.client
import json
import logging
import socket
import ssl
import sys
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from caldera.errors import unexpected

if TYPE_CHECKING:
    from caldera.backends.claude_code.config import Proxy

log = logging.getLogger("caldera.backends")

MAX_BODY = 32 * 1024 * 1024  # one request (the CLI's are ~50 KB; a long conversation more)
CHUNK = 64 * 1024
UPSTREAM_TIMEOUT = 300.0  # connect, and any silence of the provider's answer
MAX_CONNECTIONS = 8
RETRY_AFTER_CAP = 5
PATHS = ("/v1/messages",)
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length", "x-api-key", "authorization",
        "accept-encoding"}


class Forwarder:
    """start() -> url; close() ends the listener and every request still going."""

    def __init__(self, upstream: str, key_var: str, key: str, token: str, note: Callable[[str], None],
                 timeout: float = UPSTREAM_TIMEOUT, proxy: Proxy | None = None):
        parts = urllib.parse.urlsplit(upstream)
        self.proxy = proxy  # config.upstream_proxy: the HTTPS_PROXY requests would use, or None
        self.scheme, self.host = parts.scheme, parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        self.key_header = ("x-api-key", key) if key_var == "ANTHROPIC_API_KEY" else ("authorization", f"Bearer {key}")
        self.token = token.encode()
        self.note = note
        self.timeout = timeout
        self.requests = 0
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._open: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.forwarder = self
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="claude-forwarder", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> str:
        self.thread.start()
        return self.url

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._open)
        for conn in conns:  # a stalled provider: the handler's read ends now
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=2.0)

    def authorised(self, headers: Any) -> bool:
        offered = headers.get("x-api-key") or ""
        bearer = headers.get("authorization") or ""
        if bearer.lower().startswith("bearer "):
            offered = offered or bearer[7:]
        return hmac.compare_digest(offered.strip().encode(), self.token)

    def connect(self) -> http.client.HTTPConnection:
        """A connection to the provider (not yet opened): TLS verified for the provider's own
        name, through the proxy's CONNECT tunnel when there is one (the proxy sees the host
        and port, never the key: it travels inside the tunnel's TLS)."""
        conn: http.client.HTTPConnection
        if self.scheme == "https" and self.proxy is not None:
            conn = http.client.HTTPSConnection(self.proxy.host, self.proxy.port, timeout=self.timeout,
                                               context=ssl.create_default_context(), blocksize=CHUNK)
            auth = self.proxy.authorization
            conn.set_tunnel(self.host, self.port, headers={"Proxy-Authorization": auth} if auth else None)
        elif self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                               context=ssl.create_default_context(), blocksize=CHUNK)
        else:  # plain http: a loopback provider (config.check_base_url), never through a proxy
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout, blocksize=CHUNK)
        with self._lock:
            if self._closed:
                raise OSError("the run is over")
            self._open.add(conn)
        return conn

    def release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._open.discard(conn)
        conn.close()

    def upstream_headers(self, headers: Any, length: int) -> dict[str, str]:
        out = {k: v for k, v in headers.items() if k.lower() not in _HOP}
        name, value = self.key_header
        out[name] = value
        out["accept-encoding"] = "identity"  # passed through byte for byte: no decoding here
        out["content-length"] = str(length)
        return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    forwarder: Forwarder

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A bug in a handler: named by type and place in the run log, never printed.

        socketserver's own handle_error prints the traceback to stderr (the daemon's journal),
        and an exception's message can quote what it failed on: a header holding the key."""
        exc = sys.exc_info()[1]
        reason = unexpected(exc) if exc is not None else "unknown"
        self.forwarder.note(f"forwarder: a request failed: {reason}")
        log.warning("claude forwarder: a request failed: %s", reason)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base class's name
        pass  # the run log has what matters; a request line holds no secret but is noise

    def do_GET(self) -> None:
        self._error(404, "not_found_error", "caldera forwarder: only POST /v1/messages is forwarded")

    do_HEAD = do_GET
    do_PUT = do_GET
    do_DELETE = do_GET

    def do_POST(self) -> None:
        fwd = self.server.forwarder
        if not fwd.authorised(self.headers):
            return self._error(401, "authentication_error", "caldera forwarder: not this run's token")
        path = urllib.parse.urlsplit(self.path).path
        if not self.path.startswith("/") or path not in PATHS:  # origin-form only: never another host
            return self._error(404, "not_found_error", "caldera forwarder: only POST /v1/messages is forwarded")
        if self.headers.get("transfer-encoding"):
            return self._error(411, "invalid_request_error", "caldera forwarder: a Content-Length is required")
        try:
            length = int(self.headers.get("content-length") or "0")
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            return self._error(413, "request_too_large", f"caldera forwarder: a request is at most {MAX_BODY} bytes")
        if not fwd.slots.acquire(blocking=False):
            return self._error(503, "overloaded_error", "caldera forwarder: too many requests at once")
        try:
            self._forward(fwd, _Body(self.rfile, length), length)
        finally:
            fwd.slots.release()

    def _forward(self, fwd: Forwarder, body: _Body, length: int) -> None:
        """The request upstream, its body streamed through in CHUNK reads (a long
        conversation's request is never held whole), and the answer relayed."""
        fwd.requests += 1
        try:
            conn = fwd.connect()
        except OSError as exc:
            self.close_connection = True  # the body was not read
            return self._error(502, "api_error", f"caldera forwarder: {exc}")
        try:
            try:
                conn.request("POST", fwd.base_path + self.path, body, fwd.upstream_headers(self.headers, length))
                answer = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                reason = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)[:200]
                via = f" through the proxy {fwd.proxy.shown}" if fwd.proxy is not None else ""
                fwd.note(f"forwarder: the provider cannot be reached{via}: {reason}")
                self.close_connection = True  # the body may be half read
                return self._error(502, "api_error",
                                   f"caldera forwarder: the provider cannot be reached{via} ({reason})")
            self._relay(answer)
        finally:
            fwd.release(conn)

    def _relay(self, answer: http.client.HTTPResponse) -> None:
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            low = name.lower()
            if low in _HOP:
                continue
            if low in ("retry-after", "retry-after-ms"):
                value = _capped(value, RETRY_AFTER_CAP * (1000 if low.endswith("-ms") else 1))
            self.send_header(name, value)
        chunked = answer.length is None
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(answer.length))
        self.end_headers()
        try:
            while True:
                data = answer.read1(CHUNK)
                if not data:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                self.wfile.flush()
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException):
            # The provider cut the answer (or the run ended): the CLI sees the stream cut short.
            self.close_connection = True

    def _error(self, status: int, kind: str, message: str) -> None:
        body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Body:
    """The CLI's request body as a stream of exactly `length` bytes for http.client (which
    reads it in `blocksize` pieces); a body cut short is an error, never a short request."""

    def __init__(self, stream: Any, length: int):
        self.stream, self.left = stream, length

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = self.stream.read(self.left if size < 0 else min(size, self.left))
        if not data:
            raise OSError("the CLI's request body ended early")
        self.left -= len(data)
        return data


def _capped(value: str, cap: int) -> str:
    try:
        return str(min(int(float(value)), cap))
    except ValueError:
        return str(cap)  # an HTTP date: at most the cap all the same
