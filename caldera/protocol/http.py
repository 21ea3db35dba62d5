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
  closed or reset mid-answer: `NoAnswer`, never a short body taken as whole; so is an
  interim answer (101-199) where the final one was due;
- a connection whose answer has no body by rule (1xx, 204, 304, a HEAD's) is closed, never
  pooled: bytes sent after it would be the next request's answer.
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

from caldera.host.proxies import Proxy, chosen_proxy, parse_proxy

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


class NotSendable(Exception):
    """The request cannot be sent as it is: a header value or a URL that HTTP does not allow
    (a line break, a control character). The sentence never quotes the value (a token)."""


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
    found = chosen_proxy(url)
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


CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")  # honoured as requests honoured them


def ca_file(configured: str | None) -> tuple[str | None, str]:
    """The CA file (or directory of hashed certificates) the plane's certificate is verified
    against, and the variable that named it: CALDERA_CA_BUNDLE, else REQUESTS_CA_BUNDLE, else
    CURL_CA_BUNDLE, else (None, "the system store"): OpenSSL's, so SSL_CERT_FILE and
    SSL_CERT_DIR count. docs/runtime.md, "TLS"."""
    if configured:
        return configured, "CALDERA_CA_BUNDLE"
    for name in CA_VARIABLES:
        if os.environ.get(name):
            return os.environ[name], name
    return None, "the system store"


def tls_context(cafile: str | None) -> ssl.SSLContext:
    """Certificate and host name always verified, TLS 1.2 at least."""
    if cafile and os.path.isdir(cafile):
        context = ssl.create_default_context(capath=cafile)
    else:
        context = ssl.create_default_context(cafile=cafile or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _stamp(path: str | None) -> tuple[int, int] | None:
    """(mtime in ns, size) of the CA bundle: what tells a rotated one; None: none, or not there."""
    if path is None:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


class Connection(http.client.HTTPConnection):
    """One connection of a route; TLS (over the proxy's tunnel or not) when `tls` is given.
    Every socket it makes goes to `on_socket` before it is used."""

    _tunnel_host: str | None  # http.client's, set by set_tunnel (not in the stubs)

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

    def _tunnel(self) -> None:
        """The proxy's CONNECT; an IPv6 host bracketed (`CONNECT [fd00::1]:8443`): Python before 3.11.9
        writes it as given, later ones bracket it themselves and leave a bracketed one."""
        host = self._tunnel_host
        if host and ":" in host and not host.startswith("["):
            self._tunnel_host = f"[{host}]"
        try:
            super()._tunnel()  # type: ignore[misc]  # private in the stubs, http.client's own hook
        finally:
            self._tunnel_host = host  # 3.11's Host header of the requests inside brackets it itself

    def _open(self, address: tuple[str, int], timeout: float, source: Any = None) -> socket.socket:
        """The TCP connection, each address of the name in turn (as socket.create_connection),
        every socket handed to `on_socket` BEFORE its connect: the watch's shutdown (a deadline,
        the daemon stopping) ends a connect that waits for an answer to its SYN at once. The
        name's resolution itself cannot be interrupted."""
        host, port = address
        # an ASCII name as bytes: getaddrinfo encodes a str with the "idna" codec, which would
        # import encodings.idna, stringprep and unicodedata into every daemon (0.2 MiB)
        name = host.encode("ascii") if host.isascii() else host
        error: OSError | None = None
        for family, kind, proto, _, peer in socket.getaddrinfo(name, port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            self.on_socket(sock)
            try:
                sock.settimeout(timeout)
                if source:
                    sock.bind(source)
                sock.connect(peer)
                return sock
            except OSError as exc:
                error = exc
                sock.close()
        raise error or OSError(f"no address for {host}")

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
        self._tls_for: tuple[str | None, tuple[int, int] | None] | None = None  # the bundle and stamp it holds
        self._idle: dict[Route, list[Connection]] = {}
        self._lock = threading.Lock()
        # a pool dropped without close() closes its sockets (no ResourceWarning, no fd kept)
        weakref.finalize(self, _close_idle, self._idle)

    def tls(self) -> ssl.SSLContext:
        """The TLS context of a new connection: rebuilt when the CA bundle's (mtime, size)
        changed since it was built (a private CA renewed on disk is trusted without a restart;
        one stat per new connection), or NoAnswer naming the variable and the path of a bundle
        that cannot be read (REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE are not checked at start)."""
        path, variable = ca_file(self.cafile)
        key = (path, _stamp(path))
        with self._lock:
            if self._tls is None or self._tls_for != key:
                try:
                    self._tls = tls_context(path)
                except OSError as exc:  # ssl.SSLError too: a file that holds no certificate
                    raise NoAnswer(f"the CA bundle {variable} names ({path}) cannot be used: "
                                   f"{_describe(exc)}") from None
                self._tls_for = key
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

    def __init__(self, resp: http.client.HTTPResponse, method: str):
        self._resp = resp
        self.status = resp.status
        # no body by rule (RFC 9110 6.4.1): http.client reads none, whatever bytes follow
        self.bodiless = 100 <= resp.status < 200 or resp.status in (204, 304) or method == "HEAD"

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
        """Read to its end, the server keeps the connection open, and the answer had a body.
        An answer without one by rule (a 204, a HEAD's) is read to its end at once, so bytes a
        server sends after it anyway (a handler that writes a body after its 204) would be read
        as the NEXT request's answer on that connection: such a connection is never reused."""
        return self._resp.isclosed() and not self._resp.will_close and not self._resp.length \
            and not self.bodiless


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
    try:
        conn.request(method, _target(conn.route, url), body=body, headers=_headers(conn.route, headers))
    except (BrokenPipeError, ConnectionResetError) as exc:
        return _early_answer(conn, exc)
    except (ValueError, http.client.InvalidURL):  # from building the head: nothing was sent
        raise NotSendable(_unsendable(headers)) from None
    return conn.getresponse()


def _unsendable(headers: dict[str, str]) -> str:
    """Why http.client refused to build the request, naming the header, never its value
    (http.client's own error quotes it whole: `Bearer <token>`)."""
    bad = [name for name, value in headers.items() if not (value.isprintable() and value.isascii())]
    if bad:
        return (f"the {bad[0]} header holds a character HTTP does not allow (a line break or control "
                "character); not sent")
    return ("the URL or a header holds a character HTTP does not allow (a space, line break or control "
            "character); not sent")


def _early_answer(conn: Connection, broken: OSError) -> http.client.HTTPResponse:
    """The answer a server sent before it read all of the body, then closed (a 413, a 401 for
    an expired session: Go's net/http does that for an unread body over 256 KiB): the send
    broke, but the plane's word is in our receive buffer. Read within the read timeout and
    the request's deadline; none there: the send's error, as it was."""
    try:
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException):
        raise broken from None
    resp.will_close = True  # the server hung up on its side: the connection is closed after it
    return resp


# A connection broken before any byte of the answer came: the error is one of these.
BROKEN = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.RemoteDisconnected)


@contextmanager
def exchange(pool: Pool, method: str, url: str, body: Body, headers: dict[str, str], timeouts: Timeouts,
             on_socket: OnSocket) -> Iterator[Answer]:
    """Send one request and yield its answer (headers read, body not); the connection goes
    back to the pool only when the caller read the answer to its end."""
    conn, resp = _request(pool, route_for(url), method, url, body, headers, timeouts, on_socket)
    if 100 < resp.status < 200:
        # http.client skips a 100 only: a 102 or 103 (Early Hints, from a CDN) would be taken
        # as the final answer (no body: a success), and the real one read by the next request
        conn.close()
        raise NoAnswer(f"an interim answer ({resp.status}) where the final one was due; not taken")
    answer = Answer(resp, method)
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
