"""HTTP/1.1 for the control-plane client, on the standard library (`http.client`, `ssl`).

Not `requests`: it and what it imports (urllib3, charset_normalizer, idna, certifi,
http.cookiejar) were 7 MiB of every daemon's 21 (docs/performance.md, section 10).
What the `Transport` needs of it, and no more:

- keep-alive connections pooled per route (scheme, host, port, proxy), each used by one
  thread at a time (the daemon's loops share one pool); a connection goes back to the
  pool only when its answer was read to its end and the server keeps it open;
- a pooled connection the server closed while idle is found before it is used (its
  socket reads as ready: the server's FIN) and dropped unused; see `exchange` for the
  one resend after a connection breaks;
- proxies from the environment (`host/proxies.py`): an http:// URL is sent to the proxy
  in absolute form, an https:// one through a CONNECT tunnel; `Proxy-Authorization` from
  the proxy URL's credentials, never logged;
- TLS always verified (`tls_context`); every socket handed to `on_socket` (the request's
  deadline watch, `deadline.py`) the moment it exists;
- an answer shorter than its Content-Length, a chunked answer cut off, a connection
  closed or reset mid-answer: `NoAnswer`, never a short body taken as whole.
"""
from __future__ import annotations

import http.client
import os
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from caldera.host.proxies import Proxy, parse_proxy, proxy_for

OnSocket = Callable[[socket.socket | None], None]
Body = bytes | Iterable[bytes] | None
IDLE_MAX = 50.0  # seconds a pooled connection may idle (many servers close at 60 s; nginx at 75)
IDLE_PER_ROUTE = 4  # idle connections kept per route; the daemon's loops rarely overlap more
CHUNK = 64 * 1024


class NoAnswer(Exception):
    """No complete answer: no connection, a broken or reset one, a timeout, an answer cut
    short. `timeout` is "connect" or "read" when a socket timeout ended it."""

    def __init__(self, message: str, timeout: str | None = None):
        super().__init__(message)
        self.timeout = timeout


class Timeouts(NamedTuple):
    connect: float  # TCP connect, a proxy's CONNECT and the TLS handshake, each operation
    read: float  # each send and read after that


class Route(NamedTuple):
    """Where a request's connection goes: the origin, through `proxy` when there is one."""
    scheme: str
    host: str
    port: int
    proxy: Proxy | None = None

    @property
    def absolute_form(self) -> bool:
        """Plain HTTP through a proxy: the request line carries the whole URL."""
        return self.proxy is not None and self.scheme == "http"


def route_for(url: str) -> Route:
    """The route of `url` with the environment's proxy, or NoAnswer with a sentence (an
    unsupported proxy: the operator's setting, named without its credentials)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NoAnswer(f"not an http(s) URL with a host: {parts.scheme}://{parts.hostname or ''}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise NoAnswer(f"the port of {parts.hostname} is not a number from 1 to 65535") from None
    found = proxy_for(url)
    if found is None:
        return Route(parts.scheme, parts.hostname.lower(), port)
    try:
        proxy = parse_proxy(found)
    except ValueError as exc:
        raise NoAnswer(f"the proxy for {parts.hostname}: {exc}") from None
    if proxy.scheme != "http":
        raise NoAnswer(f"the proxy for {parts.hostname} ({proxy.scheme}://{proxy.shown}) is not supported: "
                       "caldera reaches the control plane through an http:// proxy only")
    return Route(parts.scheme, parts.hostname.lower(), port, proxy)


def ca_file(configured: str | None) -> str | None:
    """The CA file (or directory) the plane's certificate is verified against:
    CALDERA_CA_BUNDLE, else REQUESTS_CA_BUNDLE, else CURL_CA_BUNDLE (which requests
    honoured), else None: the system store (OpenSSL's, so SSL_CERT_FILE and SSL_CERT_DIR
    count). docs/runtime.md, "TLS"."""
    return configured or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None


def tls_context(cafile: str | None) -> ssl.SSLContext:
    """Certificate and host name always verified, TLS 1.2 at least."""
    if cafile and os.path.isdir(cafile):
        context = ssl.create_default_context(capath=cafile)
    else:
        context = ssl.create_default_context(cafile=cafile or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class Connection(http.client.HTTPConnection):
    """One connection of a route; TLS (over the proxy's tunnel or not) when `tls` is given.
    Every socket it makes goes to `on_socket` before it is used."""

    def __init__(self, route: Route, tls: ssl.SSLContext | None, timeout: float):
        peer = route.proxy or route
        super().__init__(peer.host, peer.port, timeout=timeout, blocksize=CHUNK)
        self.route, self.tls = route, tls
        # the Host header leaves out the scheme's own port (https://plane/ is "plane", not "plane:443")
        self.default_port = 443 if route.scheme == "https" else 80
        self.on_socket: OnSocket = lambda sock: None
        self.idle_since = 0.0
        # http.client opens its socket through this attribute: hooked so that the deadline
        # watch holds the socket while the TCP connect and a proxy's CONNECT run
        self._create_connection = self._open
        if route.proxy is not None and route.scheme == "https":
            auth = route.proxy.authorization
            self.set_tunnel(route.host, route.port, headers={"Proxy-Authorization": auth} if auth else None)

    def _open(self, address: tuple[str, int], timeout: float, source: Any = None) -> socket.socket:
        host, port = address
        # an ASCII name as bytes: getaddrinfo encodes a str with the "idna" codec, which would
        # import encodings.idna, stringprep and unicodedata into every daemon (0.2 MiB)
        peer = (host.encode("ascii") if host.isascii() else host, port)
        sock = socket.create_connection(peer, timeout, source)  # type: ignore[arg-type]  # bytes: getaddrinfo's
        self.on_socket(sock)
        return sock

    def connect(self) -> None:
        try:
            super().connect()  # TCP, and the proxy's CONNECT for a tunnel
        except (OSError, http.client.HTTPException) as exc:
            if self.route.proxy is None:
                raise
            # named as requests named it: an operator's grep for a proxy failure still finds it
            raise NoAnswer(f"ProxyError: through the proxy {self.route.proxy.shown}: {_describe(exc)}",
                           "connect" if isinstance(exc, TimeoutError) else None) from None
        if self.tls is None:
            return
        # wrapped without the handshake, so that the watch holds the TLS socket (the plain one
        # is detached by the wrap) before the handshake can block
        assert self.sock is not None
        sock = self.tls.wrap_socket(self.sock, server_hostname=self.route.host, do_handshake_on_connect=False)
        self.sock = sock
        self.on_socket(sock)
        sock.do_handshake()


def _dropped(sock: socket.socket | None) -> bool:
    """Whether an idle connection is unusable: closed by us, or readable (the server's FIN,
    or bytes nobody asked for)."""
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class Pool:
    """Idle keep-alive connections per route. A connection is out of the pool while a
    thread uses it, so no two requests ever share one."""

    def __init__(self, cafile: str | None = None):
        self.cafile = cafile
        self._tls: ssl.SSLContext | None = None  # built on the first https request (the CA store is not small)
        self._idle: dict[Route, list[Connection]] = {}
        self._lock = threading.Lock()
        # a pool dropped without close() closes its sockets (no ResourceWarning, no fd kept)
        weakref.finalize(self, _close_idle, self._idle)

    def tls(self) -> ssl.SSLContext:
        with self._lock:
            if self._tls is None:
                self._tls = tls_context(ca_file(self.cafile))
            return self._tls

    def take(self, route: Route) -> Connection | None:
        """An idle connection of `route` still usable, or None; dropped ones are closed."""
        now = time.monotonic()
        while True:
            with self._lock:
                idle = self._idle.get(route)
                if not idle:
                    return None
                conn = idle.pop()
            if now - conn.idle_since < IDLE_MAX and not _dropped(conn.sock):
                return conn
            conn.close()

    def new(self, route: Route, timeout: float) -> Connection:
        return Connection(route, self.tls() if route.scheme == "https" else None, timeout)

    def give_back(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        conn.on_socket = lambda sock: None  # the finished request's watch lets go of it
        with self._lock:
            idle = self._idle.setdefault(conn.route, [])
            extra = idle.pop(0) if len(idle) >= IDLE_PER_ROUTE else None
            idle.append(conn)
        if extra is not None:
            extra.close()

    def close(self) -> None:
        with self._lock:
            idle = dict(self._idle)
            self._idle.clear()
        _close_idle(idle)


def _close_idle(idle: dict[Route, list[Connection]]) -> None:
    for conns in list(idle.values()):
        for conn in conns:
            conn.close()


class Answer:
    """A response being read; `chunks` raises NoAnswer when the body ends early."""

    def __init__(self, resp: http.client.HTTPResponse):
        self._resp = resp
        self.status = resp.status

    def header(self, name: str) -> str | None:
        return self._resp.getheader(name)

    def chunks(self, size: int = CHUNK) -> Iterator[bytes]:
        while True:
            try:
                chunk = self._resp.read(size)
            except (OSError, http.client.HTTPException) as exc:  # IncompleteRead: a chunked body cut off
                raise NoAnswer(_describe(exc), "read" if isinstance(exc, TimeoutError) else None) from None
            if not chunk:
                break
            yield chunk
        short = self._resp.length  # what the Content-Length still promised when the bytes stopped
        if short:
            raise NoAnswer(f"the answer ended {short} bytes short of its Content-Length")

    @property
    def reusable(self) -> bool:
        """Read to its end, and the server keeps the connection open."""
        return self._resp.isclosed() and not self._resp.will_close and not self._resp.length


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _headers(route: Route, headers: dict[str, str]) -> dict[str, str]:
    if route.absolute_form and route.proxy is not None and route.proxy.authorization:
        return {**headers, "Proxy-Authorization": route.proxy.authorization}
    return headers


def _target(route: Route, url: str) -> str:
    """What the request line names: the whole URL for a proxy, else path and query."""
    if route.absolute_form:
        return url.split("#", 1)[0]
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _send(conn: Connection, method: str, url: str, body: Body, headers: dict[str, str],
          timeouts: Timeouts, on_socket: OnSocket) -> http.client.HTTPResponse:
    conn.on_socket = on_socket
    if conn.sock is None:
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as exc:  # named with where it went: the log says which plane
            raise NoAnswer(f"{_describe(exc)} ({conn.route.host}:{conn.route.port})",
                           "connect" if isinstance(exc, TimeoutError) else None) from None
    else:
        on_socket(conn.sock)  # a reused connection: this request's watch holds it now
    assert conn.sock is not None
    conn.sock.settimeout(timeouts.read)
    conn.request(method, _target(conn.route, url), body=body, headers=_headers(conn.route, headers))
    return conn.getresponse()


# A connection broken before any byte of the answer came: the error is one of these.
BROKEN = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.RemoteDisconnected)


@contextmanager
def exchange(pool: Pool, method: str, url: str, body: Body, headers: dict[str, str], timeouts: Timeouts,
             on_socket: OnSocket) -> Iterator[Answer]:
    """Send one request and yield its answer (headers read, body not); the connection goes
    back to the pool only when the caller read the answer to its end."""
    conn, resp = _request(pool, route_for(url), method, url, body, headers, timeouts, on_socket)
    answer = Answer(resp)
    try:
        yield answer
    except BaseException:
        conn.close()
        raise
    if answer.reusable:
        on_socket(None)  # first: the request's deadline may not shut a socket another request took
        pool.give_back(conn)
    else:
        conn.close()


def _request(pool: Pool, route: Route, method: str, url: str, body: Body, headers: dict[str, str],
             timeouts: Timeouts, on_socket: OnSocket) -> tuple[Connection, http.client.HTTPResponse]:
    """The connection and its answer's head.

    A reused connection that breaks before any byte of the answer came (the server closed
    it in the moment between `Pool.take`'s check and our request) is resent once on a new
    connection for a GET only. A GET here carries no body and changes nothing the plane
    keeps but `commands/next`, whose command (if the plane handed one out before the
    connection broke) is lost with or without a second request. A POST is never resent:
    its bytes may have reached the plane and been acted on (a finish recorded, a register
    that issued a session); its caller's own retry decides, as for any network error.
    """
    conn = pool.take(route)
    resend = conn is not None and method == "GET"
    while True:
        conn = conn or pool.new(route, timeouts.connect)
        try:
            return conn, _send(conn, method, url, body, headers, timeouts, on_socket)
        except BROKEN as exc:
            conn.close()
            if not resend:
                raise NoAnswer(_describe(exc)) from None
            conn, resend = None, False
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise NoAnswer(_describe(exc), "read" if isinstance(exc, TimeoutError) else None) from None
        except BaseException:
            conn.close()
            raise
