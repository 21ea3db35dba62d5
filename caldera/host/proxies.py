"""Which proxy a URL is reached through, from the process environment (SPEC section 3).

The one implementation for the control-plane client (`protocol/http.py`) and the
backends' loopback forwarder. It reads the variables exactly as `requests` did for
caldera before (requests 2.34: `get_environ_proxies`, `select_proxy`, urllib's
`getproxies_environment` and `proxy_bypass_environment`), without importing
requests or urllib.request (docs/performance.md, section 10):

- `<scheme>_proxy` in either case, the lower-case name first (an empty lower-case
  variable hides the upper-case one); `ALL_PROXY` when the scheme has none;
- `NO_PROXY` (lower case first): `*`; a name, matched with its subdomains (a leading
  dot is ignored, `example.com` covers `api.example.com`, never `notexample.com`),
  with or without the URL's port (`host:8443`); for an IPv4 host an address or a
  CIDR network (`10.0.0.0/8`);
- a proxy URL without a scheme is `http://` (`proxy.corp:3128`); its credentials
  (`http://user:pass@proxy:3128`, percent-decoded) become the `Proxy-Authorization`
  value. `~/.netrc` is never read;
- one exception, for caldera's own clients (`chosen_proxy`): a loopback host is never
  proxied.
"""
from __future__ import annotations

import base64
import os
import socket
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from caldera.config import is_loopback


class Proxy(NamedTuple):
    """A proxy as a client reaches it (the control-plane client, the backends' forwarder);
    `authorization` is the `Proxy-Authorization` value, never shown (`shown` is host:port)."""
    host: str
    port: int
    authorization: str | None = None  # never in repr()
    secrets: tuple[str, ...] = ()  # the password and the header: for a Redactor; never in repr()
    scheme: str = "http"

    @property
    def shown(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"Proxy(host={self.host!r}, port={self.port!r}, scheme={self.scheme!r})"


def environ_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """scheme (`http`, `https`, `all`, `no`, ...) -> value, lower-case names winning."""
    found: dict[str, str] = {}
    for name, value in environ.items():
        if value and name.lower().endswith("_proxy"):
            found[name.lower()[:-6]] = value
    if "REQUEST_METHOD" in environ:  # CGI: HTTP_PROXY may come from a client's "Proxy:" header
        found.pop("http", None)
    for name, value in environ.items():
        if name.endswith("_proxy"):  # the lower-case spelling, second: it wins (or hides when empty)
            if value:
                found[name.lower()[:-6]] = value
            else:
                found.pop(name.lower()[:-6], None)
    return found


def _ipv4(text: str) -> bytes | None:
    try:
        return socket.inet_aton(text)
    except OSError:
        return None


def _in_network(address: bytes, network: str) -> bool:
    """Whether `address` is in `network` ("a.b.c.d/n", n 1..32); False for anything else."""
    base, _, bits = network.partition("/")
    net = _ipv4(base)
    if not bits.isdigit() or not 1 <= int(bits) <= 32 or net is None:
        return False
    mask = (0xFFFFFFFF << (32 - int(bits))) & 0xFFFFFFFF
    return int.from_bytes(address, "big") & mask == int.from_bytes(net, "big") & mask


def _name_matches(host: str, with_port: str, entry: str) -> bool:
    """A NO_PROXY name covers itself and its subdomains, with or without the port."""
    entry = entry.lstrip(".").lower()
    if not entry:
        return False
    return host == entry or with_port == entry or host.endswith("." + entry) or with_port.endswith("." + entry)


def bypassed(url: str, environ: Mapping[str, str]) -> bool:
    """Whether NO_PROXY (no_proxy first) sends `url` directly."""
    no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        return True
    if no_proxy.strip() == "*":
        return True
    entries = [e for e in no_proxy.replace(" ", "").split(",") if e]
    address = _ipv4(host)
    try:  # an address is matched without its port, as requests did
        with_port = f"{host}:{parts.port}" if parts.port and address is None else host
    except ValueError:
        with_port = host
    for entry in entries:
        if address is not None and "/" in entry:
            if _in_network(address, entry):
                return True
        elif _name_matches(host, with_port, entry):
            return True
    return False


def proxy_for(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The proxy URL (as written in the environment) for `url`, or None: reach it directly."""
    env = os.environ if environ is None else environ
    if bypassed(url, env):
        return None
    proxies = environ_proxies(env)
    return proxies.get(urlsplit(url).scheme) or proxies.get("all")


def chosen_proxy(url: str) -> str | None:
    """The proxy for `url` as caldera's clients use one (the control-plane client, the
    backends' forwarder): `proxy_for`, except that a loopback host is always reached
    directly, as Go's clients do (requests did not): a proxy elsewhere cannot reach this
    host's loopback, and the plain http that only loopback may use would carry the token
    or key to the proxy in clear."""
    host = urlsplit(url).hostname
    if host and is_loopback(host):
        return None
    return proxy_for(url)


def parse_proxy(value: str) -> Proxy:
    """A proxy URL as written (`host:port` is http://), or ValueError with a sentence that
    names scheme and host only (never its credentials)."""
    parts = urlsplit(value if "://" in value else "http://" + value)
    scheme = parts.scheme.lower()
    if not parts.hostname:
        raise ValueError(f"the proxy URL ({scheme}://...) names no host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"the proxy {parts.hostname} has an invalid port") from None
    if parts.username is None or parts.password is None:  # as requests: a user alone sends nothing
        return Proxy(parts.hostname, port, scheme=scheme)
    user, password = unquote(parts.username), unquote(parts.password)
    header = "Basic " + base64.b64encode(f"{user}:{password}".encode("latin-1", "replace")).decode()
    secrets = tuple(s for s in (password, parts.password, header, header[6:]) if s)
    return Proxy(parts.hostname, port, header, secrets, scheme)
