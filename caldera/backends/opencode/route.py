"""OpenCode's route through the runtime's loopback forwarder (backends/forwarder.py): the
provider's secrets never enter OpenCode's process, so its tools (Bash) and the agent's
commands cannot read them.

OpenCode's config points each provider at `<forwarder>/r/<route token>` and carries
placeholders where the secrets were (`apiKey`, header values). `ProviderRoutes` is the
forwarder's `Route`: a request under a route's path goes to that provider's real base URL
(the rest of its path appended, the query kept), every placeholder in its header values
replaced by the secret and in its query by the secret percent-encoded (as OpenCode would
have sent it), tagged by OpenCode's session (`x-session-id`) for the forwarder's per-tag
failures and cuts. A base URL's user info goes as Basic auth, and its proxy is the one
`requests` would choose (both the shared forwarder's). Anything else is refused 404: the
forwarder is no open relay.
"""
from __future__ import annotations

import functools
import hmac
import re
import secrets
import urllib.parse
from collections.abc import Iterable, Mapping

from caldera.backends import failures as fk
from caldera.backends.forwarder import (
    Forwarder,
    Incoming,
    Outgoing,
    Refusal,
    Upstream,
    openai_error,
    process_secret,
    upstream_proxy,
)
from caldera.redact import PREFIX_TAIL

PREFIX = "/r/"
METHODS = frozenset({"GET", "POST"})


class ProviderRoutes:
    """One route per distinct provider base URL, and the secrets their placeholders stand for."""

    def __init__(self, base_urls: Mapping[str, str], secret_values: Iterable[str]):
        self._upstreams: dict[str, Upstream] = {}  # route token -> the provider's upstream
        token_of_url: dict[str, str] = {}
        for pid, url in sorted(base_urls.items()):
            if url not in token_of_url:
                token_of_url[url] = process_secret() + secrets.token_hex(8)
                self._upstreams[token_of_url[url]] = _upstream(pid, url)
        self._token_of = {pid: token_of_url[url] for pid, url in base_urls.items()}
        self.placeholders = {f"caldera-secret-{process_secret()}{secrets.token_hex(8)}": value
                             for value in sorted(set(secret_values)) if value}

    def path_for(self, provider: str) -> str:
        """The path OpenCode's base URL for `provider` has on the forwarder."""
        return PREFIX + self._token_of[provider]

    def proxy_for(self, provider: str) -> str | None:
        """The proxy `provider` is reached through, as host:port (None: directly)."""
        proxy = self._upstreams[self._token_of[provider]].proxy
        return proxy.shown if proxy is not None else None

    @property
    def secrets(self) -> tuple[str, ...]:
        """What the upstreams hold that a Redactor must mask (URL and proxy credentials)."""
        return tuple(s for upstream in self._upstreams.values() for s in upstream.secrets)

    def __call__(self, req: Incoming) -> Outgoing:
        token, rest = _split(req.target)
        upstream = self._match(token)
        if upstream is None or req.method not in METHODS:
            raise Refusal(404, "not_found_error", "caldera forwarder: no such route")
        path, sep, query = rest.partition("?")
        if sep:
            query = self._fill(query, quoted=True)
        headers = {name: self._fill(value) for name, value in req.headers}
        return Outgoing(upstream, upstream.base_path + path + sep + query, headers,
                        tag=req.header("x-session-id") or "")

    def _match(self, token: str) -> Upstream | None:
        """The upstream of `token`, compared in constant time with every route's."""
        offered = token.encode("latin-1", "replace")
        found = None
        for known, upstream in self._upstreams.items():
            if hmac.compare_digest(offered, known.encode()):
                found = upstream
        return found

    def _fill(self, text: str, quoted: bool = False) -> str:
        for placeholder, value in self.placeholders.items():
            if placeholder in text:
                text = text.replace(placeholder, urllib.parse.quote(value, safe="") if quoted else value)
        return text


def forwarder(routes: ProviderRoutes) -> Forwarder:
    """The shared forwarder on OpenCode's routes (not started): OpenAI-shaped error bodies,
    the provider's Retry-After as it is (OpenCode's retries are counted by the driver), and
    every request body masked (`masked`) before it leaves."""
    return Forwarder(routes, name="opencode-forwarder", error_body=openai_error, body_filter=masked)


def masked(body: bytes) -> bytes:
    """`body` with every value made from `process_secret()` (the server's password, a route
    token, a placeholder) replaced by [REDACTED]: the server's own file tools follow a symlink to
    `/proc/self/environ` or to its config, and what they read goes to the model in a request."""
    return _masks(process_secret()).sub(b"[REDACTED]", body)


@functools.cache
def _masks(prefix: str) -> re.Pattern[bytes]:
    return re.compile(re.escape(prefix.encode()) + PREFIX_TAIL.encode())  # as the Redactor masks it


def _split(target: str) -> tuple[str, str]:
    """(route token, the rest of the target from its "/") of `/r/<token>/…`; ("", "") else."""
    if not target.startswith(PREFIX):
        return "", ""
    token, slash, rest = target[len(PREFIX):].partition("/")
    return token, slash + rest or "/"


def _upstream(provider: str, url: str) -> Upstream:
    try:
        return Upstream.parse(url, upstream_proxy(url))
    except ValueError as exc:
        raise fk.BackendFailure(fk.BACKEND_FAILED, f"provider {provider}'s options.baseURL: {exc}") from None
