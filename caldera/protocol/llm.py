"""What caldera knows of the LLM configuration it hands out, for ClawManager's LLM governance.

Each consumer caldera gives a model provider to (a code-agent backend's runs, the process-mode
agent) is described by one `LLMConfig`: `gateway` when it gets the platform's AI gateway
(`CLAWMANAGER_LLM_*`), `external` when it gets a provider of its own (a backend's secret
projection, a provider key the manifest hands the agent). `report_fields` turns the list into
the state report's `runtime.llm_config_status`, `llm_provider_base_url` and
`llm_config_fingerprint` (ClawManager merges them into the stored `system_info` and classifies
the instance from them), plus caldera's `llm_configs`, one entry per consumer.

Nothing here ever holds a key: a base URL is kept without userinfo, query and fragment, and
the fingerprint is a digest of base URL, provider and model only. In protocol/ (what a state
report says), below the backends, process mode and the daemon, which all describe theirs with
it; the gateway's variables and its model rule are config.py's (`config.Gateway`).
"""
from __future__ import annotations

import hashlib
import json
import urllib.parse

from caldera import TYPE_CHECKING
from caldera.config import GATEWAY_BASE_URL

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from caldera.config import Gateway

GATEWAY, EXTERNAL = "gateway", "external"
STATUSES = (GATEWAY, EXTERNAL)
TEXT_CAP = 512  # a provider or model name longer than this is cut (the report is not the place for more)
MIN_HIDDEN = 4  # a secret shorter than this is no secret a URL could be searched for


def public_url(url: object, hide: Iterable[str] = ()) -> str | None:
    """`url` as `scheme://host[:port]/path`, lower-case scheme and host, no trailing slash, no
    userinfo, query or fragment (where a key or token could ride); None when it is no http(s) URL.
    A value of `hide` (the secrets the URL's owner holds) found in what is left cuts it to
    `scheme://host[:port]`, and to None if it is there too (a key in the path or the host)."""
    if not isinstance(url, str) or not url.strip():
        return None
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname or ""
    if parts.scheme.lower() not in ("http", "https") or not host:
        return None
    if ":" in host:  # IPv6: the brackets urlsplit took off
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    secrets = [h.lower() for h in hide if isinstance(h, str) and len(h) >= MIN_HIDDEN]
    for path in (parts.path.rstrip("/"), ""):
        public = urllib.parse.urlunsplit((parts.scheme.lower(), netloc, path, "", ""))[:TEXT_CAP]
        if not any(h in form for form in _forms(public) for h in secrets):
            return public
    return None


def _forms(url: str) -> set[str]:
    """`url` lower case as written, percent-decoded once and twice: a key may ride in a path
    encoded (`tenant%2Bq7Zx%2FKEY` for `tenant+q7Zx/KEY`), even encoded twice."""
    once = urllib.parse.unquote(url)
    return {url.lower(), once.lower(), urllib.parse.unquote(once).lower()}


def _text(value: object) -> str | None:
    return (value.strip()[:TEXT_CAP] or None) if isinstance(value, str) else None


def fingerprint(triples: Iterable[tuple[str | None, str | None, str | None]]) -> str:
    """`sha256:` + hex digest of the distinct (base URL, provider, model) triples, sorted: the same
    on every host and after every restart (no salt), different when any of them changes."""
    distinct = sorted({(b or "", p or "", m or "") for b, p, m in triples})
    data = json.dumps(distinct, separators=(",", ":"), ensure_ascii=True).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def same_endpoint(url: object, other: object) -> bool:
    """The two URLs name the same endpoint once credentials, query and fragment are set aside."""
    mine = public_url(url)
    return mine is not None and mine == public_url(other)


class LLMConfig:
    """The LLM configuration one consumer gets: `source` names the consumer ("backend codex",
    "process agent"), `status` is GATEWAY or EXTERNAL; base URL, provider and model as far as
    caldera knows them (None: not known). Read-only; never holds a key."""

    __slots__ = ("source", "status", "base_url", "provider", "model")
    source: str
    status: str
    base_url: str | None
    provider: str | None
    model: str | None

    def __init__(self, source: str, status: str, base_url: object = None, provider: object = None,
                 model: object = None, hide: Iterable[str] = ()) -> None:
        """`hide`: secrets the consumer holds (a projection's values): never part of base_url."""
        if status not in STATUSES:
            raise ValueError(f"status {status!r}: one of {', '.join(STATUSES)}")
        for key, value in (("source", source), ("status", status), ("base_url", public_url(base_url, hide)),
                           ("provider", _text(provider)), ("model", _text(model))):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("LLMConfig is read-only")

    def _key(self) -> tuple[str, str, str | None, str | None, str | None]:
        return self.source, self.status, self.base_url, self.provider, self.model

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LLMConfig) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "LLMConfig(" + ", ".join(f"{k}={v!r}" for k, v in zip(self.__slots__, self._key(), strict=True)) + ")"

    @property
    def fingerprint(self) -> str:
        return fingerprint([(self.base_url, self.provider, self.model)])

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "status": self.status, "base_url": self.base_url,
                "provider": self.provider, "model": self.model, "fingerprint": self.fingerprint}


def report_fields(configs: Iterable[LLMConfig]) -> dict[str, Any]:
    """The state report's `runtime` fields for what caldera hands out; {} when it hands out none.

    ClawManager reads one status per instance and counts `external` as non-compliant, so one
    external consumer decides (it is never hidden behind a gateway one): the status and base URL
    are the first external one's (by source), else the first gateway one's. The fingerprint
    covers every consumer's base URL, provider and model, so a change in any of them changes
    it. `llm_configs` (caldera's, which ClawManager ignores) lists each consumer."""
    ordered = sorted(set(configs), key=lambda c: (c.status != EXTERNAL, c.source, c._key()))
    if not ordered:
        return {}
    decisive = ordered[0]
    fields: dict[str, Any] = {"llm_config_status": decisive.status,
                              "llm_config_fingerprint": fingerprint((c.base_url, c.provider, c.model) for c in ordered)}
    if decisive.base_url:
        fields["llm_provider_base_url"] = decisive.base_url
    fields["llm_configs"] = [c.as_dict() for c in ordered]
    return fields


def gateway_config(gateway: Gateway, source: str, model: str | None = None) -> LLMConfig:
    """What a consumer given ClawManager's AI gateway gets: its base URL (without the gateway's
    key, should the URL carry it in its path: a new key must not change the fingerprint) and
    provider, and `model` (a run's), else the gateway's default by its rule (Gateway.model_for).
    `gateway` only as far as the consumer knows: `confirmed` decides whether it is the platform's."""
    return LLMConfig(source, GATEWAY, gateway.base_url, gateway.provider, model or gateway.model_for(),
                     hide=[gateway.api_key or ""])


def platform_gateways(injected: Mapping[str, str], hide: Iterable[str] = ()) -> set[str]:
    """The AI gateway's base URLs (public forms, as they are and without the `hide` values, the
    gateway's keys) that are the platform's: injected by it (`injected`: config.Settings.injected,
    values of the process environment no env file replaced) and the platform's gateway by
    ClawManager's own rule (`gateway/llm` or `clawmanager` in the URL, as its governance view
    classifies a URL) or on the host of the control plane the platform injected."""
    plane = urllib.parse.urlsplit(injected.get("CLAWMANAGER_AGENT_BASE_URL") or "").hostname
    out: set[str] = set()
    for name in GATEWAY_BASE_URL:
        url = public_url(injected.get(name))
        if url is None:
            continue
        host = urllib.parse.urlsplit(url).hostname
        if "gateway/llm" in url.lower() or "clawmanager" in url.lower() or (plane and host == plane.lower()):
            out |= {url, public_url(injected[name], hide) or url}
    return out


def confirmed(configs: Iterable[LLMConfig], platform: set[str]) -> list[LLMConfig]:
    """Each consumer as the report may say it: `gateway` only where its base URL is one of
    `platform` (platform_gateways), `external` otherwise. A consumer's description says `gateway`
    for whatever gateway the merged settings name, and agent.env can name any URL under the
    gateway's variable names (OPENAI_BASE_URL=https://api.openai.com/v1 with the operator's own
    key): ClawManager trusts the status sent, so a provider that is not the platform's gateway is
    reported `external` rather than left for ClawManager to guess from its URL (a corporate URL
    would be `unknown` there, and `unknown` is not counted non-compliant)."""
    return [c if c.status != GATEWAY or (c.base_url is not None and c.base_url in platform)
            else LLMConfig(c.source, EXTERNAL, c.base_url, c.provider, c.model) for c in configs]
