"""What one Claude Code run is given: the provider from the projection, the settings the
runtime enforces, the execution policy mapped onto the CLI's permission modes and its
sandbox, and the argv (docs/backends.md, "Claude Code").

Projection (`<secrets>/claude-code/` or `$CREDENTIALS_DIRECTORY/claude-code/`):
`env/ANTHROPIC_API_KEY` or `env/ANTHROPIC_AUTH_TOKEN` (the credential: it goes to the
run's loopback forwarder only, never into the CLI's environment, which the agent's Bash
commands inherit), `env/ANTHROPIC_BASE_URL` (the forwarder's upstream), model names
(`env/ANTHROPIC_MODEL`, …), and an optional `settings.json` of which only a few keys
are kept (the rest would widen the policy or run commands outside the sandbox).
"""
from __future__ import annotations

import base64
import ipaddress
import secrets
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from caldera.backends.base import Policy
from caldera.backends.failures import BACKEND_FAILED, SECRET_UNAVAILABLE, BackendFailure
from caldera.backends.projection import Projection
from caldera.backends.registry import gateway_settings
from caldera.host.jsonlimits import loads

PROFILE = "claude-code"
KEY_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")  # x-api-key, Authorization: Bearer
BASE_URL_VAR = "ANTHROPIC_BASE_URL"
DEFAULT_BASE_URL = "https://api.anthropic.com"
# Passed to the CLI as they are: names of models, no secret (SPEC section 10: model names may appear).
MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
              "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
# settings.json keys kept from the projection; `permissions` only as deny/ask rules (narrowing).
KEPT_SETTINGS = ("model", "effortLevel", "alwaysThinkingEnabled", "includeCoAuthoredBy", "permissions")
SHOWN_SETTINGS = ("model", "effortLevel")  # values that are names, not secrets
DEFAULT_MAX_RETRIES = 2
# Tools offered to the model: the only ones a policy maps (anything else, subagents, cron,
# worktrees, skills, is not offered at all).
READ_TOOLS = ("Bash", "Read")
WRITE_TOOLS = ("Edit", "Write", "NotebookEdit")
NETWORK_TOOLS = ("WebFetch", "WebSearch")
SANDBOX_HELPERS = ("bwrap", "socat")


@dataclass
class ClaudePlan:
    """The provider of one run: the credential (forwarder only), its upstream, the model."""
    key_var: str
    key: str
    upstream: str
    model: str | None
    env: dict[str, str] = field(default_factory=dict)  # model names for the CLI's environment
    settings: dict[str, Any] = field(default_factory=dict)  # the projection's kept settings
    dropped: list[str] = field(default_factory=list)  # settings keys not kept (names only)
    secret_values: list[str] = field(default_factory=list)
    proxy: Proxy | None = None  # the HTTPS_PROXY the forwarder tunnels through (upstream_proxy)
    run_token: str = field(default_factory=lambda: "caldera-run-" + secrets.token_urlsafe(32))


def plan_provider(projection: Projection, environ: Mapping[str, str], model: str | None = None) -> ClaudePlan:
    """The run's provider from the projection; secret-unavailable before anything is spawned."""
    env = projection.env()
    raw_settings = projection.read("settings.json")
    secret_values = [v for n, v in env.items() if n not in MODEL_VARS and n != BASE_URL_VAR]
    unknown = sorted(set(env) - set(KEY_VARS) - set(MODEL_VARS) - {BASE_URL_VAR})
    if unknown:
        raise BackendFailure(BACKEND_FAILED, (
            f"{projection.label}/env/{unknown[0]}: not a variable caldera gives Claude Code (it would reach "
            f"the agent's commands); known: {', '.join(KEY_VARS + (BASE_URL_VAR,) + MODEL_VARS)}"))
    key_var = next((name for name in KEY_VARS if name in env), None)
    if key_var is None:
        gateway = " (ClawManager's AI gateway is OpenAI-compatible, which Claude Code does not speak)" \
            if gateway_settings(environ) is not None else ""
        raise BackendFailure(SECRET_UNAVAILABLE, (
            f"no Claude Code credential: {projection.label}/env/ANTHROPIC_API_KEY "
            f"(or env/ANTHROPIC_AUTH_TOKEN) is missing{gateway}"))
    if not env[key_var]:
        raise BackendFailure(SECRET_UNAVAILABLE, f"{projection.label}/env/{key_var} is empty")
    if not _header_safe(env[key_var]):
        # It becomes a header value: http.client would refuse it with an error quoting it whole.
        raise BackendFailure(SECRET_UNAVAILABLE, (
            f"{projection.label}/env/{key_var} is not one line of printable characters "
            "(a line break, a control character or non-ASCII text inside)"))
    upstream = check_base_url(env.get(BASE_URL_VAR) or DEFAULT_BASE_URL, f"{projection.label}/env/{BASE_URL_VAR}")
    settings, dropped, setting_secrets = _settings(raw_settings, projection.label)
    chosen = model or env.get("ANTHROPIC_MODEL") or (settings.get("model") if isinstance(settings.get("model"), str)
                                                     else None)
    proxy = upstream_proxy(upstream)
    secret_values += setting_secrets + list(proxy.secrets if proxy else ())
    return ClaudePlan(key_var=key_var, key=env[key_var], upstream=upstream, model=chosen,
                      env={n: v for n, v in env.items() if n in MODEL_VARS}, settings=settings,
                      dropped=dropped, secret_values=secret_values, proxy=proxy)


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable() and value == value.strip()


def check_base_url(url: str, label: str) -> str:
    """The upstream URL, or backend-failed with a sentence: http(s) only, no credentials in
    it, and plain http only to a loopback address (the key must not cross a network in clear)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BackendFailure(BACKEND_FAILED, f"{label}: an http(s) URL is required")
    if parts.username is not None or parts.password is not None:
        raise BackendFailure(BACKEND_FAILED, f"{label}: credentials in the URL are not accepted; "
                                             "put the key in env/ANTHROPIC_API_KEY")
    if parts.query or parts.fragment:
        raise BackendFailure(BACKEND_FAILED, f"{label}: a query or fragment is not accepted")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise BackendFailure(BACKEND_FAILED, f"{label}: plain http is accepted only to a loopback address "
                                             "(the key would cross the network in clear)")
    return url.rstrip("/")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Proxy:
    """The HTTP proxy the forwarder tunnels the provider's requests through (CONNECT)."""
    host: str
    port: int
    authorization: str | None = None  # the Proxy-Authorization value from the URL's credentials
    secrets: tuple[str, ...] = ()  # the URL's password and the header: for the Redactor

    @property
    def shown(self) -> str:
        """host:port, never the credentials (for events)."""
        return f"{self.host}:{self.port}"


def upstream_proxy(upstream: str) -> Proxy | None:
    """The proxy `requests` would use for the upstream URL: HTTPS_PROXY (https_proxy first),
    ALL_PROXY, NO_PROXY, from the runtime's process environment, read by requests' own
    functions (SPEC section 3: proxies are honoured as everywhere). One exception: a
    loopback upstream (the only one plain http may use) is always reached directly, as
    Go's clients do: a proxy elsewhere cannot reach this host's loopback, and the key would
    cross the network in clear. Only an http:// proxy is supported (CONNECT over plain
    HTTP, like requests with urllib3 1.26); an https:// or socks one is refused with a
    sentence rather than bypassed."""
    parts = urllib.parse.urlsplit(upstream)
    if parts.scheme != "https" or not parts.hostname or is_loopback(parts.hostname):
        return None
    import requests.utils  # here: only a Claude Code run reads proxies this way

    found = requests.utils.select_proxy(upstream, requests.utils.get_environ_proxies(upstream))
    if not found:
        return None
    url = urllib.parse.urlsplit(requests.utils.prepend_scheme_if_needed(found, "http"))
    if url.scheme != "http" or not url.hostname:
        raise BackendFailure(BACKEND_FAILED, (
            f"the proxy for {parts.hostname} ({url.scheme or 'no scheme'}://{url.hostname or ''}) is not supported: "
            "the Claude Code forwarder reaches the provider through an http:// proxy (HTTPS_PROXY) only"))
    try:
        port = url.port or 80
    except ValueError:
        raise BackendFailure(BACKEND_FAILED, f"the proxy for {parts.hostname} has an invalid port") from None
    user, password = requests.utils.get_auth_from_url(found)
    if not user and not password:
        return Proxy(url.hostname, port)
    header = "Basic " + base64.b64encode(f"{user}:{password}".encode("latin-1", "replace")).decode()
    return Proxy(url.hostname, port, header, tuple(s for s in (password, header, header[6:]) if s))


def _settings(raw: bytes | None, label: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """(kept settings, dropped key names, secret values) of the projection's settings.json."""
    if raw is None:
        return {}, [], []
    try:
        doc = loads(raw, max_bytes=len(raw) + 1)
    except ValueError:
        raise BackendFailure(BACKEND_FAILED, f"{label}/settings.json is not valid JSON") from None
    if not isinstance(doc, dict):
        raise BackendFailure(BACKEND_FAILED, f"{label}/settings.json is not a JSON object")
    kept = {k: v for k, v in doc.items() if k in KEPT_SETTINGS}
    dropped = sorted(k for k in doc if k not in KEPT_SETTINGS)
    permissions = kept.get("permissions")
    if permissions is not None:
        rules = permissions if isinstance(permissions, dict) else {}
        kept["permissions"] = {k: [r for r in rules.get(k) or [] if isinstance(r, str)]
                               for k in ("deny", "ask") if isinstance(rules.get(k), list)}
        dropped += sorted(f"permissions.{k}" for k in rules if k not in ("deny", "ask"))
    # settings.json is sensitive as a whole (seed 003): every string in it is masked but names.
    secret_values = [s for k, v in doc.items() if k not in SHOWN_SETTINGS for s in _strings(v)]
    return kept, dropped, secret_values


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


# ---------------------------------------------------------------- policy

def policy_settings(policy: Policy, workspace: str, hidden: list[str], projected: dict[str, Any]) -> dict[str, Any]:
    """The settings.json of the run (the CLI's user settings, in its private HOME).

    The sandbox (bubblewrap) carries what permission rules cannot: the agent's Bash
    commands write only in the workspace (read-only: nowhere), reach no network unless the
    policy says so, and never read the runtime's secrets and logs (`hidden`). The sandbox
    must start or the CLI refuses to (failIfUnavailable), and a command may not leave it
    (allowUnsandboxedCommands: false). Hooks are off: they run outside the sandbox."""
    filesystem: dict[str, Any] = {"denyRead": ["/" + path for path in hidden]}
    if policy.sandbox == "read-only":
        filesystem["denyWrite"] = ["/" + workspace]
    # "//" starts an absolute path in a rule; a directory's rule covers what is below it.
    deny = [f"{tool}(/{path}{below})" for path in hidden for below in ("", "/**") for tool in ("Read", "Edit")]
    deny += list((projected.get("permissions") or {}).get("deny") or [])
    settings = {k: v for k, v in projected.items() if k != "permissions"}
    settings.update({
        "permissions": {"deny": deny, "ask": list((projected.get("permissions") or {}).get("ask") or []),
                        "allow": [], "disableBypassPermissionsMode": "disable"},
        "sandbox": {"enabled": True, "failIfUnavailable": True, "autoAllowBashIfSandboxed": True,
                    "allowUnsandboxedCommands": False, "excludedCommands": [],
                    "network": {"allowedDomains": ["*"] if policy.network else []},
                    "filesystem": filesystem},
        "disableAllHooks": True,
        "enableAllProjectMcpServers": False,
        "cleanupPeriodDays": 1,
    })
    return settings


def tools_for(policy: Policy) -> list[str]:
    tools = list(READ_TOOLS)
    if policy.sandbox == "workspace-write":
        tools += WRITE_TOOLS
    if policy.network:
        tools += NETWORK_TOOLS  # they run in the CLI's own process: offered only with the network on
    return tools


def argv(binary: str, policy: Policy, settings_path: str, model: str | None) -> list[str]:
    """The CLI's argv: stream-json both ways, only the run's own settings (none of the
    workspace's .claude/ or .mcp.json), no session kept on disk, the policy's tools and mode.

    workspace-write: acceptEdits (edits inside the workspace go through, edits elsewhere would
    ask); read-only: dontAsk (whatever is not pre-approved is denied). approval never: nothing
    may ask (`--permission-prompts none` denies it); on-request: the CLI asks the runtime on
    stdio, which declines (there is no approver in an unattended run)."""
    mode = "acceptEdits" if policy.sandbox == "workspace-write" else "dontAsk"
    out = [binary, "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
           "--settings", settings_path, "--setting-sources", "user", "--strict-mcp-config",
           "--no-session-persistence", "--permission-mode", mode, "--tools", ",".join(tools_for(policy))]
    if policy.approval == "on-request":
        out += ["--permission-prompt-tool", "stdio"]
    else:
        out += ["--permission-prompts", "none"]
    if model:
        out += ["--model", model]
    return out
