"""The control-plane HTTP client (protocol v1).

`Transport` is the one requests.Session: default timeouts (connect 5 s, read
30 s), the `{success, message, data}` envelope (a bare object is accepted),
response bodies capped at 1 MiB, downloads streamed to disk, and errors typed
so a caller knows whether to retry. A 429/503 `Retry-After` is kept as state
(like sentry's transport): until it passes, calls fail fast without touching
the network, so no loop can hammer a server that asked for quiet.

`ControlPlaneClient` adds authentication: every call takes the session token
from `session.Auth`; a 401 renews it once (single-flight) and retries.
"""
from __future__ import annotations

import email.utils
import json
import logging
import os
import threading
import time
import uuid

import requests

from caldera import __version__, errors
from caldera.host.jsonlimits import loads as bounded_loads
log = logging.getLogger("caldera.protocol.client")

API_PREFIX = "/api/v1/agent"
TIMEOUT = (5, 30)  # connect, read
BODY_CAP = 1024 * 1024
DOWNLOAD_CAP = 128 * 1024 * 1024
BOOTSTRAP_REJECTED = "invalid agent bootstrap token"


class ApiError(errors.CalderaError):
    """A call did not succeed. `status` is the HTTP status, or None for no answer.

    Each subclass is also one kind of caldera's error taxonomy (`caldera.errors`):
    loops and the CLI act on the kind.
    """

    retryable = False

    def __init__(self, status: int | None, message: str, retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status, self.message, self.retry_after = status, message, retry_after


class Unauthorized(ApiError, errors.Retryable):
    """401: the session is bad or expired: register again (then the call is retried)."""


class Forbidden(ApiError, errors.Refused):
    """403, or 400 'invalid agent bootstrap token': a configuration problem, not a retry."""


class NotFound(ApiError, errors.Refused):
    """404: unknown command or resource."""


class Invalid(ApiError, errors.Refused):
    """Any other 4xx: the request is wrong and would stay wrong."""


class Retryable(ApiError, errors.Retryable):
    """429, 5xx, network error or timeout: try later (honour `retry_after`)."""

    retryable = True


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


def _error_message(body: bytes) -> str:
    try:
        doc = bounded_loads(body, max_bytes=BODY_CAP, what="the error body")
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip() or "(empty body)"
    if isinstance(doc, dict):
        return str(doc.get("error") or doc.get("message") or "(no message)")[:500]
    return "(unexpected error body)"


def classify(status: int, body: bytes, retry_after: float | None) -> ApiError:
    message = _error_message(body)
    if status == 401:
        return Unauthorized(status, message)
    if status == 403 or (status == 400 and BOOTSTRAP_REJECTED in message.lower()):
        return Forbidden(status, message)
    if status == 404:
        return NotFound(status, message)
    if status == 429 or status >= 500:
        return Retryable(status, message, retry_after)
    return Invalid(status, message)


def unwrap(body: bytes):
    """The `data` of ClawManager's envelope, or the bare object."""
    if not body.strip():
        return None
    try:
        doc = bounded_loads(body, max_bytes=BODY_CAP, what="the response")
    except ValueError as exc:  # incl. jsonlimits.JSONLimitError: too deep or too large, one failed call
        raise Invalid(200, f"response is not usable JSON: {exc}") from None
    if isinstance(doc, dict) and "success" in doc:
        if doc.get("success") is False:
            raise Invalid(200, str(doc.get("error") or "the server said success: false"))
        return doc.get("data")
    return doc


class Transport:
    def __init__(self, base_url: str, *, ca_bundle: str | None = None, session=None):
        self.base_url = base_url.rstrip("/")
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = f"caldera/{__version__}"
        if ca_bundle:
            self.session.verify = ca_bundle  # TLS verification is never turned off
        self._quiet_until = 0.0  # monotonic; from Retry-After
        self._lock = threading.Lock()

    def quiet_for(self) -> float:
        return max(0.0, self._quiet_until - time.monotonic())

    def _note_retry_after(self, seconds: float | None) -> None:
        if seconds:
            with self._lock:
                self._quiet_until = max(self._quiet_until, time.monotonic() + min(seconds, 3600))

    def request(self, method: str, path: str, token: str | None, *, body=None, data=None,
                headers=None, stream_to=None, cap: int = BODY_CAP, raw: bool = False):
        """Send one request: the unwrapped data; the body's bytes with raw=True;
        the number of bytes written with stream_to (a path)."""
        wait = self.quiet_for()
        if wait > 0:
            raise Retryable(None, f"server asked to wait (Retry-After): {wait:.0f} s left", wait)
        hdrs = dict(headers or {})
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        if body is not None:
            hdrs["Content-Type"] = "application/json"
            data = json.dumps(body, separators=(",", ":")).encode()
        try:
            resp = self.session.request(method, self.base_url + API_PREFIX + path, data=data,
                                        headers=hdrs, timeout=TIMEOUT, stream=True)
        except requests.RequestException as exc:
            raise Retryable(None, f"{type(exc).__name__}: {_short(exc)}") from None
        with resp:
            if resp.status_code >= 400:
                content = self._read_capped(resp, BODY_CAP)
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                if resp.status_code in (429, 503):
                    self._note_retry_after(retry_after)
                raise classify(resp.status_code, content, retry_after)
            if stream_to is not None:
                return self._stream(resp, stream_to, cap)
            content = self._read_capped(resp, cap)
            return content if raw else unwrap(content)

    @staticmethod
    def _read_capped(resp, cap: int) -> bytes:
        chunks, size = [], 0
        try:
            for chunk in resp.iter_content(65536):
                size += len(chunk)
                if size > cap:
                    raise Invalid(resp.status_code, f"response body over {cap} bytes")
                chunks.append(chunk)
        except requests.RequestException as exc:
            raise Retryable(None, f"reading the response: {_short(exc)}") from None
        return b"".join(chunks)

    @staticmethod
    def _stream(resp, dest, cap: int) -> int:
        size = 0
        try:
            with open(dest, "wb") as fh:
                for chunk in resp.iter_content(1024 * 1024):
                    size += len(chunk)
                    if size > cap:
                        raise Invalid(resp.status_code, f"download over {cap} bytes")
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        except requests.RequestException as exc:
            raise Retryable(None, f"download cut: {_short(exc)}") from None
        return size


def _short(exc: Exception) -> str:
    # requests' messages repeat the URL and pool; keep the first line.
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


class MultipartFile:
    """A multipart/form-data body streamed from a file, with a known length.

    requests builds `files=` bodies in memory; a skill archive can be large, so
    the body is the form fields, the file read in chunks, and the trailer.
    """

    def __init__(self, fields: dict, field_name: str, path, filename: str):
        self.boundary = uuid.uuid4().hex
        head = b"".join(self._part(k, str(v)) for k, v in fields.items() if v is not None)
        head += (f"--{self.boundary}\r\nContent-Disposition: form-data; name=\"{field_name}\"; "
                 f"filename=\"{filename}\"\r\nContent-Type: application/zip\r\n\r\n").encode()
        self._head, self._tail = head, f"\r\n--{self.boundary}--\r\n".encode()
        self._path = path
        self.length = len(head) + os.path.getsize(path) + len(self._tail)

    def _part(self, name: str, value: str) -> bytes:
        return (f"--{self.boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
                f"{value}\r\n").encode()

    def __len__(self) -> int:
        # requests takes Content-Length from len() and streams the iterable as it is
        # (with no length it would add Transfer-Encoding: chunked).
        return self.length

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __iter__(self):
        yield self._head
        with open(self._path, "rb") as fh:
            while chunk := fh.read(256 * 1024):
                yield chunk
        yield self._tail


class ControlPlaneClient:
    """Protocol v1 calls, authenticated through `auth` (a `session.Auth`)."""

    def __init__(self, transport: Transport, auth):
        self.transport, self.auth = transport, auth

    def _call(self, method, path, body=None, **kw):
        token = self.auth.token()
        try:
            return self.transport.request(method, path, token, body=body, **kw)
        except Unauthorized:
            token = self.auth.renew(token)
            return self.transport.request(method, path, token, body=body, **kw)
        except Forbidden as exc:
            self.auth.forbidden(exc)
            raise

    def register(self, body: dict) -> dict:
        return self.transport.request("POST", "/register", self.auth.bootstrap_token, body=body)

    def heartbeat(self, body: dict) -> dict:
        return self._call("POST", "/heartbeat", body) or {}

    def state_report(self, body: dict):
        return self._call("POST", "/state/report", body)

    def next_command(self) -> dict | None:
        data = self._call("GET", "/commands/next")
        if isinstance(data, dict) and "command" in data:
            return data["command"]
        return data or None  # a bare command object, or nothing

    def start_command(self, command_id, body: dict):
        return self._call("POST", f"/commands/{command_id}/start", body)

    def finish_command(self, command_id, body: dict):
        return self._call("POST", f"/commands/{command_id}/finish", body)

    def skills_inventory(self, body: dict):
        return self._call("POST", "/skills/inventory", body)

    def upload_skill(self, fields: dict, path, filename: str | None = None):
        filename = filename or os.path.basename(str(path))
        if not filename.endswith(".zip"):
            raise ValueError("an uploaded skill's filename must end in .zip")

        def send(token):
            form = MultipartFile(fields, "file", path, filename)
            return self.transport.request("POST", "/skills/upload", token, data=form,
                                          headers={"Content-Type": form.content_type})

        token = self.auth.token()
        try:
            return send(token)
        except Unauthorized:
            return send(self.auth.renew(token))

    def download_skill(self, skill_version: str, dest, cap: int = DOWNLOAD_CAP) -> int:
        return self._call("GET", f"/skills/versions/{skill_version}/download", stream_to=dest, cap=cap)

    def config_revision_raw(self, revision_id) -> bytes:
        """The raw response body: the checksum is over `content`'s bytes exactly as sent."""
        return self._call("GET", f"/config/revisions/{int(revision_id)}", raw=True)

    def post_run_events(self, run_id: str, body: dict):
        return self._call("POST", f"/runs/{run_id}/events", body)
