"""The loopback forwarder: the one holder of a provider's credential while a code agent runs.

A code agent's CLI hands its environment to the agent's commands, so a key in it is a key
they can print. The CLI is pointed instead at `http://127.0.0.1:<port>` and given stand-ins
(a run token, placeholders); this forwarder, a thread of the runtime bound to loopback, takes
each request, asks its `Route` what to do with it (check the stand-in, pick the provider, put
the real credential in), sends it upstream (TLS verified, through the HTTPS_PROXY tunnel
`host/proxies.py` chooses) and streams the answer back as it comes. Nothing is buffered whole
either way: a long conversation's request reaches tens of MB.

What differs between backends is their `Route` (a function `Incoming -> Outgoing`, raising
`Refusal`): Claude Code's is `TokenRoute` (its run token in `x-api-key` or `Authorization:
Bearer`, only `POST /v1/messages`, the key header put in its place), started for a run;
OpenCode's is `opencode/route.ProviderRoutes` (a route token in the path per provider,
placeholders replaced in the headers and the query), started for its server's life. The
error bodies the forwarder makes (`anthropic_error`, `openai_error`) and a cap on the
provider's Retry-After are parameters. An upstream URL's user info goes as Basic auth when
the route sends no Authorization. Each provider socket is tracked under the request's tag
from its TCP connection on, so that `cut(tag)` ends a request wherever its provider fell
silent: in a proxy's CONNECT, the TLS handshake, or the answer.

Hardened against whoever else reaches the loopback (docs/backends.md, "The loopback
forwarder"): at most `Limits.connections` client connections (a new one over it is closed at
once), of which at most `Limits.unauthenticated` not yet past the route (the oldest of those is
dropped for a new one); a request head must arrive whole within `head_seconds` and be at most
`head_bytes` in `head_lines` lines, its target visible ASCII; a body may fall silent `body_idle`
seconds at most; the provider must be reached within `connect_seconds`; `close()` shuts every
accepted and every provider socket and waits a bounded time for the threads.

Threads: `<name>` (the accept loop) and `<name>-conn` (one per client connection), daemon
threads, ended by `close()`.
"""
from __future__ import annotations

import base64
import collections
import functools
import hmac
import http.client
import json
import logging
import re
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from caldera.backends.failures import BACKEND_FAILED, SECRET_UNAVAILABLE, BackendFailure
from caldera.config import header_safe
from caldera.errors import unexpected
from caldera.host.proxies import Proxy, chosen_proxy, parse_proxy

log = logging.getLogger("caldera.backends")

CHUNK = 64 * 1024
SMALL_BODY = 1024 * 1024  # a chunked request body up to this is sent with a Content-Length
ERROR_BODY_CAP = 16 * 1024  # what is kept of a failed answer's body (Failure.message)
FAILURES_KEPT = 256
CLOSE_WAIT = 2.0  # close(): how long the threads are waited for, in all
ACCEPT_POLL = 1.0  # the accept loop's wake-up if a shut listener did not wake it (never on Linux)
# Request headers never passed on: hop-by-hop ones, and those the forwarder sets itself.
HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                 "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length", "expect",
                 "accept-encoding"})
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TARGET = re.compile(r"^[!-~]+$")  # visible ASCII: http.client's refusal of another would quote the URL


@functools.cache
def process_secret() -> str:
    """A random prefix, one per process, of every token a backend makes for one run or one
    server (a run's token in the CLI's key variable, OpenCode's server password, route tokens
    and placeholders): the Redactor masks it once as a prefix (`add(prefix=True)`), and with
    it every one of them whole (it and the token characters after it). Adding each value
    instead would add values to the daemon's one Redactor at every run, for ever: every log
    line and event slower the longer the daemon ran, and its memory growing (Claude Code's
    run token did: 11 MiB RSS per 100 turns, docs/performance.md section 10)."""
    return secrets.token_hex(16)


def run_token() -> str:
    """A run's token for the forwarder's route: the CLI gets it in its key's place. Masked by
    `process_secret()`, its prefix: whoever makes one adds that prefix to the Redactor."""
    return "caldera-run-" + process_secret() + secrets.token_urlsafe(24)


@dataclass(frozen=True)
class Limits:
    connections: int = 32  # client connections open at once, authenticated ones included
    unauthenticated: int = 8  # of which not past the route yet (the oldest is dropped for a newer one)
    requests: int = 8  # requests forwarded at once (more: 503)
    head_bytes: int = 64 * 1024  # a request line and its headers
    head_lines: int = 100
    head_seconds: float = 10.0  # a new connection's whole request head
    idle_seconds: float = 60.0  # a kept-alive connection's wait for its next request head
    body_idle: float = 30.0  # silence within a request body
    body_bytes: int = 64 * 1024 * 1024
    connect_seconds: float = 15.0  # reaching the provider: TCP, a proxy's CONNECT, the TLS handshake
    upstream_timeout: float = 300.0  # any silence of the provider's answer
    send_timeout: float = 300.0  # a client that does not read its answer


# ---------------------------------------------------------------- upstream and its proxy

@dataclass(frozen=True)
class Upstream:
    """A provider's base URL as the forwarder reaches it: its user info, if any, only as the
    `Authorization: Basic` value the forwarder adds to a request that has none (as `requests`
    and curl use a URL's credentials), never shown."""
    scheme: str
    host: str
    port: int
    base_path: str = ""
    proxy: Proxy | None = None
    authorization: str | None = field(default=None, repr=False)
    credentials: tuple[str, ...] = field(default=(), repr=False)  # the password and the header: for the Redactor

    @classmethod
    def parse(cls, url: str, proxy: Proxy | None = None) -> Upstream:
        """ValueError with a sentence for what no connection could be made to (no http(s)
        URL, no host, a port that is no number from 1 to 65535). The query is not kept."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("an http(s) URL with a host is required")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0 or parts.netloc.endswith(":"):
            raise ValueError(f"the port of {parts.hostname} is not a number from 1 to 65535")
        authorization: str | None = None
        credentials: tuple[str, ...] = ()
        if parts.username is not None:
            password = urllib.parse.unquote(parts.password or "")
            pair = f"{urllib.parse.unquote(parts.username)}:{password}"
            authorization = "Basic " + base64.b64encode(pair.encode()).decode()
            credentials = tuple(s for s in (password, parts.password, authorization, authorization[6:]) if s)
        return cls(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80),
                   parts.path.rstrip("/"), proxy, authorization, credentials)

    @property
    def shown(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def secrets(self) -> tuple[str, ...]:
        """What of it a Redactor must mask: the URL's password and Basic value, the proxy's."""
        return self.credentials + (self.proxy.secrets if self.proxy is not None else ())

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        """A connection (not yet opened; `timeout` bounds its opening): TLS verified for the
        provider's own name, through the proxy's CONNECT tunnel when there is one (the proxy
        sees host and port, never the key)."""
        if self.scheme == "https" and self.proxy is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.proxy.host, self.proxy.port, timeout=timeout, context=ssl.create_default_context(),
                blocksize=CHUNK)
            auth = self.proxy.authorization
            conn.set_tunnel(self.host, self.port, headers={"Proxy-Authorization": auth} if auth else None)
            return conn
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=ssl.create_default_context(), blocksize=CHUNK)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout, blocksize=CHUNK)


def upstream_proxy(upstream: str) -> Proxy | None:
    """The proxy for the upstream URL: HTTPS_PROXY (https_proxy first), ALL_PROXY, NO_PROXY,
    from the runtime's process environment, read as the control-plane client reads them
    (`host/proxies.py`, as `requests` did; SPEC section 3: proxies are honoured as
    everywhere). One exception: a loopback upstream (the only one plain http may use) is
    always reached directly, as Go's clients do: a proxy elsewhere cannot reach this host's
    loopback, and a key would cross the network in clear. Only an http:// proxy is
    supported (CONNECT over plain HTTP); an https:// or socks one is refused with a
    sentence (backend-failed) rather than bypassed."""
    parts = urllib.parse.urlsplit(upstream)
    if parts.scheme != "https" or not parts.hostname:
        return None
    found = chosen_proxy(upstream)  # never for a loopback upstream
    if not found:
        return None
    try:
        url = parse_proxy(found)
    except ValueError as exc:
        raise BackendFailure(BACKEND_FAILED, f"the proxy for {parts.hostname}: {exc}") from None
    if url.scheme != "http":
        raise BackendFailure(BACKEND_FAILED, (
            f"the proxy for {parts.hostname} ({url.scheme}://{url.host}) is not supported: "
            "the runtime's forwarder reaches the provider through an http:// proxy (HTTPS_PROXY) only"))
    return url  # the HTTP proxy the forwarder tunnels the provider's requests through (CONNECT)


def gateway_key(key: str) -> str:
    """The AI gateway's key, or secret-unavailable with the one sentence every backend says."""
    if not header_safe(key):
        raise BackendFailure(SECRET_UNAVAILABLE, "CLAWMANAGER_LLM_API_KEY is not one line of printable characters")
    return key


def gateway_base(base_url: str) -> str:
    """The AI gateway's `<BASE>` with no trailing "/" nor "/v1" (OPENAI_BASE_URL, a fallback of
    CLAWMANAGER_LLM_BASE_URL, ends in "/v1" by convention; each backend appends the "/v1" of its
    route), or secret-unavailable for a query or fragment in it (no route below it would be
    asked as the platform meant, and it may carry a credential: never quoted)."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.query or parts.fragment or base_url.rstrip().endswith(("?", "#")):
        raise BackendFailure(SECRET_UNAVAILABLE, "CLAWMANAGER_LLM_BASE_URL: a query or fragment is not accepted")
    path = parts.path.rstrip("/")
    path = path[:-len("/v1")] if path.endswith("/v1") else path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


# ---------------------------------------------------------------- what a Route sees and says

@dataclass(frozen=True)
class Incoming:
    """A client's request as the route sees it: hop-by-hop headers already gone."""
    method: str
    target: str  # origin-form, as sent: path and query
    headers: tuple[tuple[str, str], ...]  # names as sent, in order

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)


@dataclass(frozen=True)
class Outgoing:
    """Where a request goes: the upstream, the target there, the headers sent as they are
    (Host, Content-Length or Transfer-Encoding and `Accept-Encoding: identity` are the
    forwarder's), and a tag grouping its provider socket (`cut`) and failure (`last_failure`)."""
    upstream: Upstream
    target: str
    headers: Mapping[str, str]
    tag: str = ""


class Refusal(Exception):
    """The route's answer to a request it will not forward (sent as an error body)."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


Route = Callable[[Incoming], Outgoing]
ErrorBody = Callable[[str, str], bytes]  # (kind, message) -> a JSON body


def anthropic_error(kind: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def openai_error(kind: str, message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


class TokenRoute:
    """One provider behind one run token (Claude Code): the token in `x-api-key` or
    `Authorization: Bearer` (compared in constant time), only `methods` on `paths` (origin
    form: never another host), both credential headers dropped and `key_header` added."""

    def __init__(self, upstream: Upstream, token: str, key_header: tuple[str, str], paths: Iterable[str],
                 methods: Iterable[str] = ("POST",)):
        self.upstream, self.token = upstream, token.encode()
        self.key_header = key_header
        self.paths, self.methods = frozenset(paths), frozenset(methods)
        self.what = f"only {'/'.join(sorted(self.methods))} {', '.join(sorted(self.paths))} is forwarded"

    def __call__(self, req: Incoming) -> Outgoing:
        offered = req.header("x-api-key") or ""
        bearer = req.header("authorization") or ""
        if not offered and bearer[:7].lower() == "bearer ":
            offered = bearer[7:]
        if not hmac.compare_digest(offered.strip().encode("latin-1", "replace"), self.token):
            raise Refusal(401, "authentication_error", "caldera forwarder: not this run's token")
        if req.method not in self.methods or not req.target.startswith("/") or req.path not in self.paths:
            raise Refusal(404, "not_found_error", f"caldera forwarder: {self.what}")
        headers = {k: v for k, v in req.headers if k.lower() not in ("x-api-key", "authorization")}
        headers[self.key_header[0]] = self.key_header[1]
        return Outgoing(self.upstream, self.upstream.base_path + req.target, headers)


@dataclass(frozen=True)
class Failure:
    """A provider answer that failed, as the forwarder saw it."""
    status: int | None  # None: no answer (connection refused, timeout, TLS, cut short)
    message: str


# ---------------------------------------------------------------- the forwarder

@dataclass
class _Client:
    sock: socket.socket
    thread: threading.Thread | None = None
    authenticated: bool = False
    dropped: bool = False  # shut for the cap of unauthenticated connections (its thread ends soon)
    since: float = field(default_factory=time.monotonic)


class Forwarder:
    """start() -> url; cut(tag) ends a tag's provider requests; close() ends everything."""

    def __init__(self, route: Route, *, name: str = "forwarder", note: Callable[[str], None] | None = None,
                 error_body: ErrorBody = anthropic_error, limits: Limits | None = None,
                 retry_after_cap: int | None = None, body_filter: Callable[[bytes], bytes] | None = None):
        self.route, self.name = route, name
        self.body_filter = body_filter  # a request body's rewrite before it goes upstream (read whole)
        self.note = note or (lambda text: None)
        self.error_body = error_body
        self.limits = limits or Limits()
        self.retry_after_cap = retry_after_cap
        self.requests = 0  # requests sent upstream
        self.dropped = 0  # connections closed for the caps
        self.abandoned = 0  # threads still running when close() stopped waiting
        self.slots = threading.BoundedSemaphore(self.limits.requests)
        self._lock = threading.Lock()
        self._clients: dict[socket.socket, _Client] = {}
        self._upstreams: dict[socket.socket, str] = {}  # provider socket -> tag
        self._cut: set[socket.socket] = set()  # provider sockets cut() shut
        self._failures: collections.OrderedDict[str, Failure] = collections.OrderedDict()
        self._streaks: collections.OrderedDict[str, int] = collections.OrderedDict()  # tag -> failures in a row
        self._waiting: set[_Watch] = set()  # requests sent whose answer is still coming
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._listener.settimeout(ACCEPT_POLL)
        self._thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        self._thread.start()
        return self.url

    # ------------------------------------------------------------ connections

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was shut: close()
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        evict = None
        with self._lock:
            pending = [c for c in self._clients.values() if not c.authenticated and not c.dropped]
            if self._closed or len(self._clients) >= self.limits.connections:
                self.dropped += 1
                _shut(sock, close=True)
                return
            if len(pending) >= self.limits.unauthenticated:
                oldest = min(pending, key=lambda c: c.since)
                oldest.dropped, evict = True, oldest.sock
                self.dropped += 1
            client = _Client(sock)
            self._clients[sock] = client
            client.thread = threading.Thread(target=self._serve, args=(client,), name=f"{self.name}-conn", daemon=True)
            client.thread.start()
        if evict is not None:
            _shut(evict)

    def _serve(self, client: _Client) -> None:
        try:
            _Connection(self, client).serve()
        except Exception as exc:  # noqa: BLE001 -- a bug, or a value http.client refused: named, never printed
            reason = unexpected(exc)  # type and place only: a refused header value was the key
            self.note(f"forwarder: a request failed: {reason}")
            log.warning("%s: a request failed: %s", self.name, reason)
        finally:
            with self._lock:
                self._clients.pop(client.sock, None)
            _shut(client.sock, close=True)

    def authenticated(self, client: _Client) -> None:
        with self._lock:
            client.authenticated = True

    # ------------------------------------------------------------ provider sockets and failures

    def opened(self, sock: socket.socket, tag: str) -> bool:
        """Track a provider socket under its tag; False when the forwarder is closed."""
        with self._lock:
            if self._closed:
                return False
            self._upstreams[sock] = tag
            return True

    def released(self, sock: socket.socket) -> bool:
        """Stop tracking a provider socket; True when `cut` shut it (its answer was cut short
        even if it reads as a clean end)."""
        with self._lock:
            self._upstreams.pop(sock, None)
            was_cut = sock in self._cut
            self._cut.discard(sock)
            return was_cut

    def cut(self, tag: str | None = None) -> None:
        """Shut the provider sockets of `tag` (all when None): a request waiting on a silent
        provider ends now, not after the upstream timeout."""
        with self._lock:
            socks = [s for s, t in self._upstreams.items() if tag is None or t == tag]
            self._cut.update(socks)
        for sock in socks:
            _shut(sock)

    def record(self, tag: str, failure: Failure) -> None:
        with self._lock:
            self._failures[tag] = failure
            self._failures.move_to_end(tag)
            while len(self._failures) > FAILURES_KEPT:
                self._failures.popitem(last=False)

    def last_failure(self, tag: str = "") -> Failure | None:
        with self._lock:
            return self._failures.get(tag)

    def settle(self, tag: str, failed: bool) -> None:
        """One exchange with the provider is over: a failure (an answer >= 400, the provider
        unreachable, an answer cut short) adds to the tag's streak, a whole answer ends it."""
        with self._lock:
            self._streaks[tag] = self._streaks.get(tag, 0) + 1 if failed else 0
            self._streaks.move_to_end(tag)
            while len(self._streaks) > FAILURES_KEPT:
                self._streaks.popitem(last=False)

    def streak(self, tag: str = "") -> int:
        """The tag's provider exchanges that failed in a row, up to now."""
        with self._lock:
            return self._streaks.get(tag, 0)

    def silence(self, tag: str = "") -> float:
        """How long the provider has said nothing (not a byte since the request went out, or
        since its last one) in the tag's longest-silent answer still coming; 0 with none."""
        now = time.monotonic()
        with self._lock:
            return max((now - w.heard for w in self._waiting if w.tag == tag), default=0.0)

    def awaiting(self, watch: _Watch, waiting: bool) -> None:
        """A request's answer is awaited from now on (True), or no more (False): _Watch's."""
        with self._lock:
            if waiting:
                self._waiting.add(watch)
            else:
                self._waiting.discard(watch)

    def close(self) -> None:
        """Stop accepting, shut every client and provider socket, wait up to CLOSE_WAIT s in
        all for the threads (a thread still running after that is left: it holds only shut
        sockets, and is counted in `abandoned`)."""
        with self._lock:
            self._closed = True
            clients = list(self._clients.values())
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() at once (Linux)
        except OSError:
            pass  # never started, or already shut
        self._listener.close()
        self.cut()
        for client in clients:
            _shut(client.sock)
        deadline = time.monotonic() + CLOSE_WAIT
        threads = ([self._thread] if self._thread.ident is not None else []) + [
            c.thread for c in clients if c.thread is not None]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.abandoned = sum(1 for t in threads if t.is_alive())
        if self.abandoned:
            self.note(f"forwarder: {self.abandoned} thread(s) still running after close; left behind")


class _Head:
    """A parsed request head."""

    def __init__(self, method: str, target: str, version: str, headers: list[tuple[str, str]]):
        self.method, self.target, self.version, self.headers = method, target, version, headers

    def get(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name]
        return ", ".join(values) if values else None


class _ClientGone(Exception):
    """The client's request body broke off (its end, or its silence): not an OSError, so that
    it is never taken for the provider's failure while http.client sends the body."""


class _BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class _Connection:
    """One client connection: request heads read under a deadline, bodies under an idle
    timeout, each request routed, forwarded and answered; kept alive while both sides allow."""

    def __init__(self, fwd: Forwarder, client: _Client):
        self.fwd, self.client, self.sock = fwd, client, client.sock
        self.limits = fwd.limits
        self.buffer = bytearray()
        self.keep = True

    # ------------------------------------------------------------ reading

    def _fill(self, timeout: float) -> bool:
        if timeout <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(timeout)
        data = self.sock.recv(CHUNK)
        if not data:
            return False
        self.buffer += data
        return True

    def _head(self, seconds: float) -> _Head | None:
        """The next request head within `seconds`, None at a clean end of the connection."""
        deadline = time.monotonic() + seconds
        while True:
            found = _HEAD_END.search(self.buffer)
            if found is not None:
                raw = bytes(self.buffer[:found.start()])
                del self.buffer[:found.end()]
                return self._parse(raw)
            if len(self.buffer) > self.limits.head_bytes:
                raise _BadRequest(431, "the request head is too large")
            if not self._fill(deadline - time.monotonic()):
                if self.buffer.strip():
                    raise _BadRequest(400, "the request head ended early")
                return None

    def _parse(self, raw: bytes) -> _Head:
        if len(raw) > self.limits.head_bytes:
            raise _BadRequest(431, "the request head is too large")
        lines = raw.decode("latin-1").lstrip("\r\n").split("\n")
        if len(lines) > self.limits.head_lines + 1:
            raise _BadRequest(431, "the request has too many header lines")
        parts = lines[0].rstrip("\r").split(" ")
        if len(parts) != 3 or not _TOKEN.match(parts[0]) or not _TARGET.match(parts[1]):
            raise _BadRequest(400, "not an HTTP request line")
        if parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
            raise _BadRequest(505, "only HTTP/1.1 and HTTP/1.0 are spoken here")
        headers = []
        for line in lines[1:]:
            line = line.rstrip("\r")
            name, sep, value = line.partition(":")
            if not sep or not _TOKEN.match(name):
                raise _BadRequest(400, "a header line is malformed")
            headers.append((name, value.strip(" \t")))
        return _Head(parts[0], parts[1], parts[2], headers)

    def read(self, size: int) -> bytes:
        """Up to `size` bytes of the body stream; b"" at the client's end."""
        if not self.buffer and not self._fill(self.limits.body_idle):
            return b""
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def readline(self, cap: int) -> bytes:
        while b"\n" not in self.buffer:
            if len(self.buffer) > cap:
                raise _BadRequest(400, "a chunk line is too long")
            if not self._fill(self.limits.body_idle):
                raise OSError("the request body ended early")
        cut = self.buffer.index(b"\n") + 1
        line = bytes(self.buffer[:cut])
        del self.buffer[:cut]
        return line

    # ------------------------------------------------------------ serving

    def serve(self) -> None:
        first = True
        while self.keep:
            try:
                head = self._head(self.limits.head_seconds if first else self.limits.idle_seconds)
            except _BadRequest as exc:
                self.keep = False
                return self._error(exc.status, "invalid_request_error", f"caldera forwarder: {exc.message}")
            except OSError:
                return  # silent too long (socket.timeout), or gone: dropped
            if head is None:
                return
            first = False
            self._one(head)

    def _one(self, head: _Head) -> None:
        connection = (head.get("connection") or "").lower()
        self.keep = head.version == "HTTP/1.1" and "close" not in connection
        hop = HOP | {t.strip() for t in connection.split(",") if t.strip()}
        try:
            body = self._body(head)
        except _BadRequest as exc:
            self.keep = False
            return self._error(exc.status, "invalid_request_error", f"caldera forwarder: {exc.message}")
        incoming = Incoming(head.method, head.target, tuple((k, v) for k, v in head.headers if k.lower() not in hop))
        try:
            out = self.fwd.route(incoming)
        except Refusal as refusal:
            self.keep = False  # its body was not read
            return self._error(refusal.status, refusal.kind, refusal.message)
        self.fwd.authenticated(self.client)
        if (head.get("expect") or "").lower() == "100-continue":
            self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self.fwd.slots.acquire(blocking=False):
            self.keep = False
            return self._error(503, "overloaded_error", "caldera forwarder: too many requests at once")
        try:
            self._forward(head, out, body)
        finally:
            self.fwd.slots.release()

    def _body(self, head: _Head) -> _Body:
        coding = (head.get("transfer-encoding") or "").strip().lower()
        length = head.get("content-length")
        if coding and length is not None:
            self.keep = False  # RFC 9112: the coding wins; the connection cannot be trusted after it
        if coding:
            if coding != "chunked":
                raise _BadRequest(501, f"transfer coding {coding[:40]!r} is not supported")
            return _Body(self, None, self.limits.body_bytes)
        try:
            size = int(length or "0")
        except ValueError:
            raise _BadRequest(400, "the Content-Length is not a number") from None
        if not 0 <= size <= self.limits.body_bytes:
            raise _BadRequest(413, f"a request is at most {self.limits.body_bytes} bytes")
        return _Body(self, size, self.limits.body_bytes)

    def _forward(self, head: _Head, out: Outgoing, body: _Body) -> None:
        fwd = self.fwd
        try:
            payload, size = body.upstream()  # a small chunked body is read whole first
            if fwd.body_filter is not None:
                payload = fwd.body_filter(_whole(payload))
                size = len(payload)
        except _ClientGone:
            self.keep = False
            return
        fwd.requests += 1
        conn = out.upstream.connection(fwd.limits.connect_seconds)
        watch = _Watch(fwd, out.tag)
        conn._create_connection = watch.connect  # type: ignore[attr-defined]  # http.client's own hook
        via = f" through the proxy {out.upstream.proxy.shown}" if out.upstream.proxy is not None else ""
        try:
            try:
                conn.connect()
                if conn.sock is None:
                    raise OSError("no connection")
                conn.sock.settimeout(fwd.limits.upstream_timeout)
                conn.request(head.method, out.target, payload, _upstream_headers(out, size),
                             encode_chunked=size is None)
                watch.wait()
                answer = conn.getresponse()
                watch.heard = time.monotonic()
            except _ClientGone:
                self.keep = False  # the client's body broke off: nothing to answer
                return
            except (OSError, http.client.HTTPException) as exc:
                reason = "cut by the runtime" if watch.release() else _reason(exc)
                fwd.note(f"forwarder: the provider cannot be reached{via}: {reason}")
                fwd.record(out.tag, Failure(None, f"cannot reach the provider at {out.upstream.shown}{via}: {reason}"))
                fwd.settle(out.tag, failed=True)
                self.keep = False  # the body may be half read
                return self._error(502, "api_error", f"caldera forwarder: the provider cannot be reached{via} "
                                                     f"({reason})")
            self._relay(head, out, answer, watch)
        finally:
            watch.release()
            conn.close()

    def _relay(self, head: _Head, out: Outgoing, answer: http.client.HTTPResponse, watch: _Watch) -> None:
        chunked = self._relay_head(head, answer)
        failed = answer.status >= 400
        if failed:  # recorded, and counted, before the client has it all (it may ask at once)
            self.fwd.record(out.tag, Failure(answer.status, ""))
            self.fwd.settle(out.tag, failed=True)
        try:
            self._relay_body(out, answer, watch, chunked, failed)
        except _ClientGone:
            self.keep = False  # the client went (OpenCode's abort): no word on the provider
        except (OSError, http.client.HTTPException) as exc:
            # The provider cut its answer (or the runtime did: the read may end in a reset as
            # well as in an end): the client sees it cut short.
            self.keep = False
            reason = "cut by the runtime" if watch.release() else _reason(exc)
            self.fwd.record(out.tag, Failure(None, f"the provider's answer broke off: {reason}"))
            if not failed:
                self.fwd.settle(out.tag, failed=True)

    def _relay_head(self, head: _Head, answer: http.client.HTTPResponse) -> bool:
        """The answer's status line and headers to the client; True when its body goes chunked."""
        lines = [f"HTTP/1.1 {answer.status} {answer.reason or 'Unknown'}"]
        cap = self.fwd.retry_after_cap
        for name, value in answer.getheaders():
            low = name.lower()
            if low in HOP:
                continue
            if cap is not None and low in ("retry-after", "retry-after-ms"):
                value = _capped(value, cap * (1000 if low.endswith("-ms") else 1))
            lines.append(f"{name}: {value}")
        chunked = answer.length is None and head.version == "HTTP/1.1"
        if answer.length is not None:
            lines.append(f"Content-Length: {answer.length}")
        elif chunked:
            lines.append("Transfer-Encoding: chunked")
        else:
            self.keep = False  # an HTTP/1.0 client: the body ends with the connection
        if not self.keep:
            lines.append("Connection: close")
        self._send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace"))
        return chunked

    def _relay_body(self, out: Outgoing, answer: http.client.HTTPResponse, watch: _Watch, chunked: bool,
                    failed: bool) -> None:
        """The answer's body as it comes (a failed one's start kept for `last_failure`); a whole
        answer ends the tag's streak of failures, before the client has its end."""
        kept = bytearray()
        settled = failed
        while data := answer.read1(CHUNK):
            watch.heard = time.monotonic()
            if failed and len(kept) < ERROR_BODY_CAP:
                kept += data[:ERROR_BODY_CAP - len(kept)]
                self.fwd.record(out.tag, Failure(answer.status, kept.decode("utf-8", "replace")))
            if answer.length == 0 and not settled:  # its last byte of a Content-Length
                settled = True
                self.fwd.settle(out.tag, failed=False)
            self._pass(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        if watch.release():  # cut(): an end of the body that is no end
            raise OSError("cut by the runtime")
        if answer.length:  # read1 ends quietly short of a Content-Length: relayed as whole, the
            # client waited for the rest on a kept connection (measured: 60 s, then a reset)
            raise http.client.IncompleteRead(b"", answer.length)
        if not settled:
            self.fwd.settle(out.tag, failed=False)
        if chunked:
            self._pass(b"0\r\n\r\n")

    def _error(self, status: int, kind: str, message: str) -> None:
        body = self.fwd.error_body(kind, message)
        reason = http.client.responses.get(status, "Error")
        tail = "" if self.keep else "Connection: close\r\n"
        try:
            self._send((f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n{tail}\r\n").encode() + body)
        except OSError:
            self.keep = False  # the client is gone

    def _send(self, data: bytes) -> None:
        self.sock.settimeout(self.limits.send_timeout)
        self.sock.sendall(data)

    def _pass(self, data: bytes) -> None:
        """A piece of the provider's answer to the client: its failure is the client's, never
        taken for the provider's."""
        try:
            self._send(data)
        except OSError:
            raise _ClientGone() from None


def _whole(payload: _Body | bytes | Iterator[bytes]) -> bytes:
    """A request body read to its end (its size is bounded by Limits.body_bytes)."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, _Body):
        parts = []
        while data := payload.read(CHUNK):
            parts.append(data)
        return b"".join(parts)
    return b"".join(payload)


def _upstream_headers(out: Outgoing, size: int | None) -> dict[str, str]:
    """The route's headers, with what the forwarder sets: `Accept-Encoding: identity` (the
    answer is passed through byte for byte), the body's length, and the upstream URL's
    credentials as Basic auth unless the route sent an Authorization of its own."""
    headers = dict(out.headers)
    headers["Accept-Encoding"] = "identity"
    if size is not None:
        headers["Content-Length"] = str(size)
    if out.upstream.authorization and not any(k.lower() == "authorization" for k in headers):
        headers["Authorization"] = out.upstream.authorization
    return headers


class _Watch:
    """A provider connection's socket, tracked under its request's tag from the moment its
    TCP connection stands (a proxy's CONNECT and the TLS handshake come after, and a silent
    provider can hold them up too) until the answer is relayed: as a duplicate descriptor,
    which `cut` shuts whatever http.client has made of the socket since (wrapped it in TLS,
    or let go of it once an answer says close). `connect` is http.client's
    `_create_connection` hook. From the request's last byte until the answer's, `heard` is
    when the provider last sent something (`Forwarder.silence`: a provider that stalls)."""

    def __init__(self, fwd: Forwarder, tag: str):
        self.fwd, self.tag = fwd, tag
        self.sock: socket.socket | None = None
        self.heard = time.monotonic()

    def wait(self) -> None:
        """The request is out: its answer is awaited from now on."""
        self.heard = time.monotonic()
        self.fwd.awaiting(self, True)

    def connect(self, address: tuple[str, int], timeout: float | None = None,
                source: tuple[str, int] | None = None) -> socket.socket:
        sock = socket.create_connection(address, timeout, source)
        self.sock = sock.dup()
        if not self.fwd.opened(self.sock, self.tag):
            sock.close()
            raise OSError("the run is over")
        return sock

    def release(self) -> bool:
        """Stop tracking it; True when `cut` shut it (once: later calls say False)."""
        self.fwd.awaiting(self, False)
        sock, self.sock = self.sock, None
        if sock is None:
            return False
        try:
            return self.fwd.released(sock)
        finally:
            sock.close()


class _Body:
    """A request body for http.client: a Content-Length one as a stream of exactly `size`
    bytes (read in pieces), a chunked one decoded, and sent with a Content-Length when it
    ends within SMALL_BODY, else chunked as it comes. A body cut short is an error, never a
    short request."""

    def __init__(self, conn: _Connection, size: int | None, cap: int):
        self.conn, self.left, self.cap = conn, size, cap
        self.total = 0
        self.done = False

    def upstream(self) -> tuple[_Body | bytes | Iterator[bytes], int | None]:
        """(what http.client sends, its Content-Length or None for chunked)."""
        if self.left is not None:
            return (self if self.left else b""), self.left
        first = bytearray()
        while len(first) <= SMALL_BODY and not self.done:
            first += self._chunk()
        if self.done:
            return bytes(first), len(first)
        return self._rest(bytes(first)), None

    def read(self, size: int = -1) -> bytes:
        if self.left is None or self.left <= 0:
            return b""
        try:
            data = self.conn.read(self.left if size < 0 else min(size, self.left))
        except OSError:
            raise _ClientGone() from None
        if not data:
            raise _ClientGone()
        self.left -= len(data)
        return data

    def _rest(self, first: bytes) -> Iterator[bytes]:
        yield first
        while not self.done:
            data = self._chunk()
            if data:
                yield data

    def _chunk(self) -> bytes:
        """The next chunk's data (b"" and `done` at the last one)."""
        try:
            return self._read_chunk()
        except (OSError, _BadRequest):
            raise _ClientGone() from None

    def _read_chunk(self) -> bytes:
        line = self.conn.readline(1024).split(b";", 1)[0].strip()
        try:
            size = int(line, 16)
        except ValueError:
            raise OSError("a chunk size is not a hex number") from None
        if size == 0:
            self._trailers()
            self.done = True
            return b""
        self.total += size
        if self.total > self.cap:
            raise OSError(f"the request body is over {self.cap} bytes")
        data = bytearray()
        while len(data) < size:
            piece = self.conn.read(size - len(data))
            if not piece:
                raise OSError("the request body ended early")
            data += piece
        self.conn.readline(8)  # the CRLF after the chunk
        return bytes(data)

    def _trailers(self) -> None:
        for _ in range(64):
            if not self.conn.readline(8192).strip():
                return
        raise OSError("too many trailer lines")


def _shut(sock: socket.socket, close: bool = False) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or already shut
    if close:
        sock.close()


def _reason(exc: BaseException) -> str:
    """What failed, short (OSError's own words; an http.client error's, which name no header)."""
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, http.client.InvalidURL):
        return "the request's target is not a valid URL"  # its message quotes the URL: the base path may hold a key
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)[:200]


def _capped(value: str, cap: int) -> str:
    try:
        return str(min(int(float(value)), cap))
    except ValueError:
        return str(cap)  # an HTTP date: at most the cap all the same
