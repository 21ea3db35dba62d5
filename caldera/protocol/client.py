"""The control-plane HTTP client (protocol v1).

`Transport` sends every call over one pool of keep-alive connections
(`protocol/http.py`, the standard library's http.client; proxies from the environment,
TLS always verified): per-operation timeouts (connect 5 s, read 30 s) and a total
deadline per request (connect + send + the whole answer, `deadline.py`), bounded by
what the caller has left (`within()`); the `{success, message, data}` envelope (a
bare object is accepted); answers capped at 1 MiB (`commands/next`: 8 MiB); downloads streamed to disk; no redirect
followed for an API call (a download follows one only on the plane's own
origin); and errors typed so a caller knows whether to retry. A 429/503
`Retry-After` (at most 300 s) is kept as state: until it passes, calls fail fast
without touching the network. The transport is the one connectivity state of
the loops: the first answer after an outage calls `on_reconnect`.

`ControlPlaneClient` adds authentication: every call takes the session token
from its `Credentials` (`session.Auth`, which registers); a 401, or a 403 "agent id does not match session", renews
it once (single-flight) and retries (a mismatch on a session registered for that very
refusal is not renewed again: `Auth.renew_mismatched`). Any other 403 refuses that one call.
Every body (and upload form) that names an `agent_id` goes out with the session's: an
outbox item queued under an earlier id (0.1.0's `desktop-7-main`) is sent as the agent
that now holds the session, which is the only id the plane takes from it.
Every value placed in a URL path is checked against its pattern first.
"""
from __future__ import annotations

import email.utils
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NamedTuple, Protocol, TypeVar
from urllib.parse import urljoin, urlsplit

from caldera import __version__, errors
from caldera.host.jsonlimits import loads as bounded_loads
from caldera.protocol.deadline import Watch, Watches
from caldera.protocol.http import Answer, NoAnswer, NotSendable, Pool, Timeouts, exchange
from caldera.protocol.jsonhead import command_head

log = logging.getLogger("caldera.protocol.client")

API_PREFIX = "/api/v1/agent"
TIMEOUT = (5, 30)  # connect, each read
TOTAL = 30.0  # one API call, from connect to the last byte of the answer
DOWNLOAD_TOTAL = 900.0  # one download (the command's own deadline bounds it further)
BODY_CAP = 1024 * 1024
NEXT_CAP = 8 * 1024 * 1024  # commands/next: the largest command payload read whole
DOWNLOAD_CAP = 128 * 1024 * 1024
RETRY_AFTER_CAP = 300.0
MAX_REDIRECTS = 5
RECONNECT_GAP = 10.0  # on_reconnect at most this often
BOOTSTRAP_REJECTED = "invalid agent bootstrap token"
SESSION_MISMATCH = "agent id does not match session"  # ClawManager's 403 that a new register fixes
PathArg = str | os.PathLike[str]
T = TypeVar("T")

# What may be placed in a URL path (SPEC section 5): anything else is refused with a sentence.
PATH_PATTERNS = {
    "command id": (re.compile(r"[0-9]{1,19}"), "digits"),
    "skill version": (re.compile(r"(ver_)?[0-9]{1,19}"), "ver_<n> or digits"),
    "config revision id": (re.compile(r"[0-9]{1,19}"), "digits"),
    "run id": (re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"), "letters, digits, '.', '_' or '-'"),
}


class ApiError(errors.CalderaError):
    """A call did not succeed. `status` is the HTTP status, or None for no answer.

    Each subclass is also one kind of caldera's error taxonomy (`caldera.errors`):
    loops and the CLI act on the kind. `from_server` says the error body was the
    plane's own JSON (a proxy's HTML page is not the plane speaking).
    """

    retryable = False

    def __init__(self, status: int | None, message: str, retry_after: float | None = None,
                 from_server: bool = False):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.from_server = from_server


class Unauthorized(ApiError, errors.Retryable):
    """401: the session is bad or expired: register again (then the call is retried)."""


class SessionMismatch(ApiError, errors.Retryable):
    """403 "agent id does not match session": the session was issued to another agent_id;
    a new register fixes it (then the call is retried)."""


class Forbidden(ApiError, errors.Refused):
    """403 on one resource (e.g. "Access denied" on a config revision), or 400 'invalid agent
    bootstrap token' on register: that one call is refused; only register's blocks the session."""


class NotFound(ApiError, errors.Refused):
    """404: unknown command or resource."""


class Invalid(ApiError, errors.Refused):
    """Any other 4xx: the request is wrong and would stay wrong."""


class Unsendable(Invalid):
    """Refused before sending: a value that may not go into a URL path, a non-finite number."""


class TooLarge(Invalid):
    """The answer is over its cap; `head` holds its first `cap` bytes."""

    def __init__(self, status: int, message: str, head: bytes = b""):
        super().__init__(status, message)
        self.head = head


class Retryable(ApiError, errors.Retryable):
    """429, 5xx, network error, timeout or a passed deadline: try later (honour `retry_after`)."""

    retryable = True


class CutShort(Retryable):
    """The request went out and its answer did not come whole (its deadline, a stop): what
    the plane did with it is not known (a `commands/next` may have handed out a command
    that no one will ever see: ClawManager gives a command out once)."""


class Unaccepted(Retryable):
    """2xx whose body is not JSON, or says `success: false`: not taken, so not done."""


class Redirected(Retryable):
    """A 3xx: never followed for an API call (the session token would go where it points)."""


def transient(exc: BaseException) -> bool:
    """Worth retrying inside a one-shot command: no answer, a passed deadline, 429 or 5xx."""
    return isinstance(exc, Retryable) and not isinstance(exc, (Unaccepted, Redirected)) \
        and (exc.status is None or exc.status == 429 or exc.status >= 500)


def path_value(value: Any, what: str) -> str:
    """`value` as it may go into a URL path, or Unsendable with a sentence naming it."""
    pattern, shape = PATH_PATTERNS[what]
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not pattern.fullmatch(text):
        shown = repr(value)[:80]
        raise Unsendable(None, f"refused to put {shown} in a URL: a {what} must be {shape}")
    return text


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def decode_json(body: bytes) -> Any:
    """The one place an answer's body is decoded: the bounded parser (depth 64, no NaN; the
    read already capped the size). ValueError when it is not usable JSON."""
    try:
        return bounded_loads(body, max_bytes=NEXT_CAP, what="the answer")
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _error_message(body: bytes) -> tuple[str, bool]:
    """(the message, whether the body was the plane's JSON)."""
    try:
        doc = decode_json(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip() or "(empty body)", False
    if isinstance(doc, dict):
        return str(doc.get("error") or doc.get("message") or "(no message)")[:500], True
    return "(unexpected error body)", False


def classify(status: int, body: bytes, retry_after: float | None) -> ApiError:
    message, from_server = _error_message(body)
    if status == 401:
        return Unauthorized(status, message, from_server=from_server)
    if status == 403 and SESSION_MISMATCH in message.lower():
        return SessionMismatch(status, message, from_server=from_server)
    if status == 403 or (status == 400 and BOOTSTRAP_REJECTED in message.lower()):
        return Forbidden(status, message, from_server=from_server)
    if status == 404:
        return NotFound(status, message, from_server=from_server)
    if status == 429 or status >= 500:
        return Retryable(status, message, retry_after, from_server=from_server)
    return Invalid(status, message, from_server=from_server)


def unwrap(body: bytes, status: int = 200) -> Any:
    """The `data` of ClawManager's envelope, or the bare object."""
    if not body.strip():
        return None
    try:
        doc = decode_json(body)
    except ValueError as exc:  # incl. jsonlimits.JSONLimitError: too deep or too large
        raise Unaccepted(status, f"the answer is not usable JSON ({exc}); not taken") from None
    if isinstance(doc, dict) and "success" in doc:
        if doc.get("success") is False:
            raise Unaccepted(status, str(doc.get("error") or doc.get("message") or "the server said success: false"))
        return doc.get("data")
    return doc


def encode_body(body: Any) -> bytes:
    """The one place a JSON body is encoded: no NaN or infinity ever leaves (Go's decoder
    answers 400 to them)."""
    try:
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as exc:
        raise Unsendable(None, f"the body holds a non-finite number ({exc}); not sent") from None


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


class Download(NamedTuple):
    size: int
    url: str  # where the bytes came from (the plane's own origin: nothing else is followed)
    same_origin: bool


class Transport:
    def __init__(self, base_url: str, *, ca_bundle: str | None = None,
                 on_reconnect: Callable[[], None] | None = None):
        self.base_url = base_url.rstrip("/")
        self.pool = Pool(ca_bundle)  # TLS verification is never turned off
        self.headers = {"User-Agent": f"caldera/{__version__}", "Accept": "*/*"}
        self.watches = Watches()
        self.on_reconnect: list[Callable[[], None]] = [on_reconnect] if on_reconnect else []
        self._quiet_until = 0.0  # monotonic; from Retry-After
        self._reachable: bool | None = None  # None until the first call
        self._last_reconnect = -RECONNECT_GAP
        self._lock = threading.Lock()
        self._budget = threading.local()  # per thread: the caller's own deadline (monotonic)

    # ------------------------------------------------------------ shared state

    def quiet_for(self) -> float:
        return max(0.0, self._quiet_until - time.monotonic())

    def _note_retry_after(self, seconds: float | None) -> None:
        if seconds:
            with self._lock:
                self._quiet_until = max(self._quiet_until, time.monotonic() + min(seconds, RETRY_AFTER_CAP))

    def _note_reachable(self, reachable: bool | None) -> None:
        """True: the plane answered; False: it did not (no answer, 502, 504); None: it answered
        with an error of its own (other 4xx/5xx): the connectivity state stays as it is.
        The first answer after an outage calls `on_reconnect`, at most once per RECONNECT_GAP
        (a plane failing only some calls must not wake the loops at every poll)."""
        if reachable is None:
            return
        now = time.monotonic()
        with self._lock:
            recovered = reachable and self._reachable is False and now - self._last_reconnect >= RECONNECT_GAP
            if recovered:
                self._last_reconnect = now
            self._reachable = reachable
        if recovered:
            log.info("control plane answering again")
            for callback in list(self.on_reconnect):
                callback()  # every loop tries again now, not after its own backoff

    @contextmanager
    def within(self, deadline: float | None) -> Iterator[None]:
        """Bound every request of this thread by `deadline` (time.monotonic()) while inside."""
        outer = getattr(self._budget, "deadline", None)
        if deadline is not None and outer is not None:
            deadline = min(deadline, outer)
        self._budget.deadline = deadline if deadline is not None else outer
        try:
            yield
        finally:
            self._budget.deadline = outer

    def abort(self, reason: str = "stopping") -> int:
        """Interrupt the requests in flight (the daemon is stopping); how many there were."""
        return self.watches.abort(reason)

    def close(self) -> None:
        """Close the idle pooled connections (a request in flight keeps its own)."""
        self.pool.close()

    def _time_left(self, total: float) -> float:
        budget = getattr(self._budget, "deadline", None)
        left = total if budget is None else min(total, budget - time.monotonic())
        if left <= 0:
            raise Retryable(None, "no time left for this call (the caller's deadline passed)")
        return left

    # ------------------------------------------------------------ one request

    def request(self, method: str, path: str, token: str | None, *, body: Any = None,
                data: bytes | MultipartFile | None = None, headers: dict[str, str] | None = None,
                stream_to: PathArg | None = None, cap: int = BODY_CAP, raw: bool = False,
                total: float = TOTAL, same_origin_redirects: bool = False) -> Any:
        """Send one request: the unwrapped data (JSON of the plane's shape); the body's bytes
        with raw=True; a `Download` with stream_to (a path)."""
        wait = self.quiet_for()
        if wait > 0:
            raise Retryable(None, f"server asked to wait (Retry-After): {wait:.0f} s left", wait)
        hdrs = dict(headers or {})
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        if body is not None:
            hdrs["Content-Type"] = "application/json"
            data = encode_body(body)
        url = self.base_url + API_PREFIX + path
        for _ in range(MAX_REDIRECTS + 1):
            left = self._time_left(total)
            with self.watches.watch(left) as watch:
                try:
                    with self._send(method, url, data, hdrs, left, watch) as resp:
                        target = self._redirect_target(resp, url, same_origin_redirects)
                        if target is None:
                            answer = self._answer(resp, url, stream_to, cap, raw)
                except NotSendable as exc:
                    raise Unsendable(None, str(exc)) from None
                except NoAnswer as exc:
                    # a timeout cut to the time left is the deadline too, whichever of it and the
                    # watch fired first
                    at_deadline = ((exc.timeout == "connect" and left < TIMEOUT[0])
                                   or (exc.timeout == "read" and left < TIMEOUT[1]))
                    raise self._cut_short(watch, left, str(exc), at_deadline) from None
                except ApiError:
                    if watch.fired:  # what was read is whatever arrived before the socket was shut
                        raise self._cut_short(watch, left, "answer cut short") from None
                    raise
                if watch.fired and (raw or stream_to is not None):
                    # bytes as they came may have ended early at the shut socket without an error:
                    # not trusted. A JSON answer that parsed is whole (a cut envelope does not
                    # parse), and dropping it would lose what it carried: a command handed out
                    # once (issue 41: the watch firing just after the read)
                    raise self._cut_short(watch, left, "answer cut short")
            if target is None:
                return answer
            url = target
        raise Redirected(None, f"more than {MAX_REDIRECTS} redirects; last Location: {_shown(url)}")

    def _send(self, method: str, url: str, data: bytes | MultipartFile | None, headers: dict[str, str],
              left: float, watch: Watch) -> AbstractContextManager[Answer]:
        """The exchange (`protocol/http.py`); only the headers given here go out (no netrc,
        no cookies), and a streamed form with its length (never chunked: Go's plane reads it)."""
        headers = {**self.headers, **headers}
        if isinstance(data, MultipartFile):
            headers["Content-Length"] = str(len(data))
        timeouts = Timeouts(min(TIMEOUT[0], left), min(TIMEOUT[1], left))
        return exchange(self.pool, method, url, data, headers, timeouts, watch.attach)

    def _cut_short(self, watch: Watch, left: float, what: str, at_deadline: bool = False) -> Retryable:
        self._note_reachable(False)
        if watch.fired == "deadline" or (at_deadline and not watch.fired):
            return CutShort(None, f"no complete answer within {left:.0f} s ({what})")
        if watch.fired:
            return CutShort(None, f"interrupted: {watch.fired}")
        return Retryable(None, what)

    def _redirect_target(self, resp: Answer, url: str, allowed: bool) -> str | None:
        """None for a final answer; the next URL for a redirect this request may follow."""
        if not 300 <= resp.status < 400:
            return None
        self._note_reachable(True)
        location = resp.header("Location") or ""
        target = urljoin(url, location)
        if allowed and origin(target) == origin(self.base_url):
            return target
        why = "another origin" if allowed else "an API call follows no redirect"
        raise Redirected(resp.status, f"redirect not followed ({why}); Location: {_shown(location) or '(none)'}")

    def _answer(self, resp: Answer, url: str, stream_to: PathArg | None, cap: int, raw: bool) -> Any:
        status = resp.status
        if status >= 400:
            content = _read_capped(resp, BODY_CAP, truncate=True)
            retry_after = parse_retry_after(resp.header("Retry-After"))
            if retry_after is not None:
                retry_after = min(retry_after, RETRY_AFTER_CAP)
            self._note_reachable(False if status in (502, 504) else None)
            if status in (429, 503):
                self._note_retry_after(retry_after)
            raise classify(status, content, retry_after)
        encoding = (resp.header("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":  # http.client asks for identity: bytes we cannot take as sent
            raise Unaccepted(status, f"the answer is {encoding[:40]}-encoded, which was not asked for; not taken")
        if stream_to is not None:
            size = _stream(resp, stream_to, cap)
            self._note_reachable(True)
            return Download(size, url, origin(url) == origin(self.base_url))
        content = _read_capped(resp, cap)
        self._note_reachable(True)
        return content if raw else unwrap(content, status)


def _shown(location: str, limit: int = 200) -> str:
    """A Location as a message may show it: the plane's (or a proxy's) untrusted text, cut
    to `limit` characters, anything not printable (a terminal's escape) as "?"."""
    cut = "".join(c if c.isprintable() else "?" for c in location[:limit])
    return cut + "..." if len(location) > limit else cut


def _read_capped(resp: Answer, cap: int, truncate: bool = False) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in resp.chunks(65536):
        size += len(chunk)
        if size > cap:
            chunks.append(chunk[: len(chunk) - (size - cap)])
            if truncate:
                break
            raise TooLarge(resp.status, f"response body over {cap} bytes", b"".join(chunks))
        chunks.append(chunk)
    return b"".join(chunks)


def _stream(resp: Answer, dest: PathArg, cap: int) -> int:
    size = 0
    with open(dest, "wb") as fh:
        for chunk in resp.chunks(1024 * 1024):
            size += len(chunk)
            if size > cap:
                raise Invalid(resp.status, f"download over {cap} bytes")
            fh.write(chunk)
        fh.flush()
        os.fsync(fh.fileno())
    return size


def _quote_name(value: str) -> str:
    """A multipart name or filename as browsers send it (WHATWG): `"`, CR and LF percent-escaped,
    so a name holding a quote cannot end the header value early."""
    return value.replace("\r", "%0D").replace("\n", "%0A").replace('"', "%22")


class MultipartFile:
    """A multipart/form-data body streamed from a file, with a known length.

    A skill archive can be large, so the body is the form fields, the file read in chunks, and the trailer.
    """

    def __init__(self, fields: dict[str, Any], field_name: str, path: PathArg, filename: str):
        self.boundary = os.urandom(16).hex()  # not uuid: it imports platform (0.24 MiB a daemon)
        head = b"".join(self._part(k, str(v)) for k, v in fields.items() if v is not None)
        head += (f"--{self.boundary}\r\nContent-Disposition: form-data; name=\"{_quote_name(field_name)}\"; "
                 f"filename=\"{_quote_name(filename)}\"\r\nContent-Type: application/zip\r\n\r\n").encode()
        self._head, self._tail = head, f"\r\n--{self.boundary}--\r\n".encode()
        self._path = path
        self.length = len(head) + os.path.getsize(path) + len(self._tail)

    def _part(self, name: str, value: str) -> bytes:
        return (f"--{self.boundary}\r\nContent-Disposition: form-data; name=\"{_quote_name(name)}\"\r\n\r\n"
                f"{value}\r\n").encode()

    def __len__(self) -> int:
        # the Content-Length the transport sends; the iterable is streamed as it is
        return self.length

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __iter__(self) -> Iterator[bytes]:
        yield self._head
        with open(self._path, "rb") as fh:
            while chunk := fh.read(256 * 1024):
                yield chunk
        yield self._tail


class Credentials(Protocol):
    """What the client asks of the session (`session.Auth`): the token to send, a new one
    when the plane refused it (one register for all loops), the bootstrap token that
    `register` itself is sent with, and the agent id the session is (or will be) issued to."""

    bootstrap_token: str

    @property
    def agent_id(self) -> str | None: ...

    def token(self) -> str: ...

    def renew(self, old_token: str | None) -> str: ...

    def renew_mismatched(self, old_token: str | None, refusal: SessionMismatch) -> str: ...


RESTAMPED_NAMED = 16  # earlier agent ids named in the log (once each), at most


class ControlPlaneClient:
    """Protocol v1 calls, authenticated through `auth` (`session.Auth`)."""

    def __init__(self, transport: Transport, auth: Credentials):
        self.transport, self.auth = transport, auth
        self._restamped: set[str] = set()  # earlier agent ids already named in the log

    def within(self, deadline: float | None) -> AbstractContextManager[None]:
        """Bound this thread's calls by `deadline` (time.monotonic()): a command's own deadline."""
        return self.transport.within(deadline)

    def _authed(self, send: Callable[[str], T]) -> T:
        """`send(token)` with the session token; a 401 or a session/agent mismatch renews it
        once (single-flight) and sends again."""
        token = self.auth.token()
        try:
            return send(token)
        except Unauthorized as exc:
            log.info("session not accepted (%s); registering again", exc.message)
            return send(self.auth.renew(token))
        except SessionMismatch as exc:
            return send(self.auth.renew_mismatched(token, exc))  # Forbidden when a register cannot help

    def as_session(self, body: T) -> T:
        """`body` as it goes out under the session: an `agent_id` in it is the session's. A
        result queued in the outbox keeps the id it was made under; after the agent id
        changed (an upgrade, CLAWMANAGER_AGENT_ID) the plane answers every such item 403
        "agent id does not match session", for ever. The earlier id is named once."""
        agent_id = self.auth.agent_id
        if not agent_id or not isinstance(body, dict) or "agent_id" not in body or body["agent_id"] == agent_id:
            return body
        earlier = str(body["agent_id"])[:300]
        if earlier not in self._restamped and len(self._restamped) < RESTAMPED_NAMED:
            self._restamped.add(earlier)
            log.info("what was queued as agent %r goes out as %r, the agent id of this session", earlier, agent_id)
        return {**body, "agent_id": agent_id}  # type: ignore[return-value]  # the same dict type

    def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        body = self.as_session(body)
        return self._authed(lambda token: self.transport.request(method, path, token, body=body, **kw))

    def register(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.transport.request("POST", "/register", self.auth.bootstrap_token, body=body)

    def heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/heartbeat", body) or {}

    def state_report(self, body: dict[str, Any]) -> Any:
        return self._call("POST", "/state/report", body)

    def next_command(self) -> tuple[Any, str | None]:
        """The next command as the plane sent it (untrusted: `protocol.command.parse_command`
        reads it), or None; and, when the answer was over NEXT_CAP, why it was not read in
        full ("over N bytes"; None otherwise). Then the command is only its head (id, type),
        so that it is finished failed instead of lost (the server hands a command out once).
        The second value is this client's finding, never a field of the plane's object."""
        try:
            data = self._call("GET", "/commands/next", cap=NEXT_CAP)
        except TooLarge as exc:
            head = command_head(exc.head)
            if head.get("id") is None:
                raise Invalid(exc.status, f"commands/next answer over {NEXT_CAP} bytes, and no command id in "
                                          f"its first {len(exc.head)} bytes: the command cannot be named") from None
            return head, f"over {NEXT_CAP} bytes"
        if isinstance(data, dict) and "command" in data:
            return data["command"], None
        return data or None, None  # a bare command object, or nothing

    def start_command(self, command_id: Any, body: dict[str, Any]) -> Any:
        return self._call("POST", f"/commands/{path_value(command_id, 'command id')}/start", body)

    def finish_command(self, command_id: Any, body: dict[str, Any]) -> Any:
        return self._call("POST", f"/commands/{path_value(command_id, 'command id')}/finish", body)

    def skills_inventory(self, body: dict[str, Any]) -> Any:
        return self._call("POST", "/skills/inventory", body)

    def upload_skill(self, fields: dict[str, Any], path: PathArg, filename: str | None = None) -> Any:
        name = filename or os.path.basename(str(path))
        if not name.endswith(".zip"):
            raise ValueError("an uploaded skill's filename must end in .zip")
        fields = self.as_session(fields)

        def send(token: str) -> Any:
            form = MultipartFile(fields, "file", path, name)
            return self.transport.request("POST", "/skills/upload", token, data=form,
                                          headers={"Content-Type": form.content_type}, total=DOWNLOAD_TOTAL)

        return self._authed(send)

    def download_skill(self, skill_version: Any, dest: PathArg, cap: int = DOWNLOAD_CAP) -> Download:
        version = path_value(skill_version, "skill version")
        return self._call("GET", f"/skills/versions/{version}/download", stream_to=dest, cap=cap,
                          total=DOWNLOAD_TOTAL, same_origin_redirects=True)

    def config_revision_raw(self, revision_id: Any) -> bytes:
        """The raw response body: the checksum is over `content`'s bytes exactly as sent."""
        return self._call("GET", f"/config/revisions/{path_value(revision_id, 'config revision id')}", raw=True)

    def post_run_events(self, run_id: str, body: dict[str, Any]) -> Any:
        return self._call("POST", f"/runs/{path_value(run_id, 'run id')}/events", body)
