"""What one Claude Code run is given: the provider from the projection, the settings the
runtime enforces, the execution policy mapped onto the CLI's permission modes and its
sandbox, and the argv (docs/backends.md, "Claude Code").

Projection (`<secrets>/claude-code/` or `$CREDENTIALS_DIRECTORY/claude-code/`):
`env/ANTHROPIC_API_KEY` or `env/ANTHROPIC_AUTH_TOKEN` (the credential: it goes to the
run's loopback forwarder only, never into the CLI's environment, which the agent's Bash
commands inherit), `env/ANTHROPIC_BASE_URL` (the forwarder's upstream), model names
(`env/ANTHROPIC_MODEL`, …), and an optional `settings.json` of which only a few keys
are kept (the rest would widen the policy or run commands outside the sandbox).

Without a projection, ClawManager's AI gateway as its claude-code image configures the CLI
(clawmanager-notes.md section 10): Anthropic Messages at `<BASE>/v1/messages`, the instance
token as `ANTHROPIC_AUTH_TOKEN` (the bearer form; here the forwarder's, as any key), the model
by the gateway's rule in `ANTHROPIC_MODEL`, and `CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT`.
"""
from __future__ import annotations

import ipaddress
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from caldera.backends.base import Policy
from caldera.backends.failures import BACKEND_FAILED, SECRET_UNAVAILABLE, BackendFailure
from caldera.backends.forwarder import (
    Proxy,
    Upstream,
    gateway_base,
    gateway_key,
    header_safe,
    run_token,
    upstream_proxy,
)
from caldera.backends.projection import Projection
from caldera.backends.registry import gateway_settings
from caldera.config import Gateway, is_loopback
from caldera.host.jsonlimits import loads
from caldera.protocol.llm import EXTERNAL, GATEWAY, LLMConfig, gateway_config, same_endpoint

PROFILE = "claude-code"
LLM_SOURCE = f"backend {PROFILE}"
KEY_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")  # x-api-key, Authorization: Bearer
BASE_URL_VAR = "ANTHROPIC_BASE_URL"
DEFAULT_BASE_URL = "https://api.anthropic.com"
# Passed to the CLI as they are: names of models, no secret (SPEC section 10: model names may appear).
MODEL_VARS = ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
              "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
# On the gateway (as ClawManager's image sets it): a model name the CLI does not know gets no
# context window of Claude's imposed on it.
GATEWAY_WINDOW_VAR = "CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT"
# settings.json keys kept from the projection; `permissions` only as deny/ask rules (narrowing).
KEPT_SETTINGS = ("model", "effortLevel", "alwaysThinkingEnabled", "includeCoAuthoredBy", "permissions")
SHOWN_SETTINGS = ("model", "effortLevel")  # values that are names, not secrets
DEFAULT_MAX_RETRIES = 2
FORWARDED_PATHS = ("/v1/messages",)  # all the CLI asks of its provider (code-agents-notes.md)
# A provider's Retry-After over this is shortened to it by the forwarder: a failing provider
# must end the turn within a minute with its kind (the CLI honours the header as it is).
RETRY_AFTER_CAP = 5
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
    env: dict[str, str] = field(default_factory=dict)  # model names (on the gateway: GATEWAY_WINDOW_VAR too)
    settings: dict[str, Any] = field(default_factory=dict)  # the projection's kept settings
    dropped: list[str] = field(default_factory=list)  # settings keys not kept (names only)
    secret_values: list[str] = field(default_factory=list)
    proxy: Proxy | None = None  # the HTTPS_PROXY the forwarder tunnels through (upstream_proxy)
    source: str = "projection"  # or "gateway"
    run_token: str = field(default_factory=lambda: run_token())  # masked by its prefix: process_secret()


def plan_provider(projection: Projection, environ: Mapping[str, str], model: str | None = None,
                  with_proxy: bool = True) -> ClaudePlan:
    """The run's provider from the projection; secret-unavailable before anything is spawned.
    `with_proxy`: also the proxy the run's forwarder goes through (the process's HTTPS_PROXY);
    a description of the configuration (llm_config) does not depend on it."""
    env = projection.env()
    raw_settings = projection.read("settings.json")
    gateway = gateway_settings(environ)
    if not env and raw_settings is None and gateway is not None:
        return gateway_plan(gateway, model, with_proxy)
    secret_values = [v for n, v in env.items() if n not in MODEL_VARS and n != BASE_URL_VAR]
    unknown = sorted(set(env) - set(KEY_VARS) - set(MODEL_VARS) - {BASE_URL_VAR})
    if unknown:
        raise BackendFailure(BACKEND_FAILED, (
            f"{projection.label}/env/{unknown[0]}: not a variable caldera gives Claude Code (it would reach "
            f"the agent's commands); known: {', '.join(KEY_VARS + (BASE_URL_VAR,) + MODEL_VARS)}"))
    key_var = next((name for name in KEY_VARS if name in env), None)
    if key_var is None:
        raise BackendFailure(SECRET_UNAVAILABLE, (
            f"no Claude Code credential: {projection.label}/env/ANTHROPIC_API_KEY (or env/ANTHROPIC_AUTH_TOKEN) "
            "is missing" + ("" if env or raw_settings is not None else
                            " and no AI gateway (CLAWMANAGER_LLM_BASE_URL/CLAWMANAGER_LLM_API_KEY) is configured")))
    if not env[key_var]:
        raise BackendFailure(SECRET_UNAVAILABLE, f"{projection.label}/env/{key_var} is empty")
    if not header_safe(env[key_var]):
        # It becomes a header value: http.client would refuse it with an error quoting it whole.
        raise BackendFailure(SECRET_UNAVAILABLE, (
            f"{projection.label}/env/{key_var} is not one line of printable characters "
            "(a line break, a control character or non-ASCII text inside)"))
    upstream = check_base_url(env.get(BASE_URL_VAR) or DEFAULT_BASE_URL, f"{projection.label}/env/{BASE_URL_VAR}")
    settings, dropped, setting_secrets = _settings(raw_settings, projection.label)
    chosen = model or env.get("ANTHROPIC_MODEL") or (settings.get("model") if isinstance(settings.get("model"), str)
                                                     else None)
    proxy = upstream_proxy(upstream) if with_proxy else None
    secret_values += setting_secrets + list(proxy.secrets if proxy else ())
    return ClaudePlan(key_var=key_var, key=env[key_var], upstream=upstream, model=chosen,
                      env={n: v for n, v in env.items() if n in MODEL_VARS}, settings=settings,
                      dropped=dropped, secret_values=secret_values, proxy=proxy)


def gateway_plan(gateway: Gateway, model: str | None, with_proxy: bool = True) -> ClaudePlan:
    """Claude Code on the AI gateway: its Messages route is `<BASE>/v1/messages` (the CLI asks
    `/v1/messages` under ANTHROPIC_BASE_URL, here the forwarder's, whose upstream is BASE); the
    gateway's key as the bearer credential (ANTHROPIC_AUTH_TOKEN, as ClawManager's image gives
    it); the model by SPEC section 10's rule (errors.Refused for one the gateway does not offer).
    The upstream is the platform's URL as injected: plain http is the platform's choice there."""
    upstream = gateway_base(gateway.base_url or "")  # its /v1 is the CLI's: a base ending so is asked /v1/v1
    key = gateway_key(gateway.api_key or "")
    try:
        Upstream.parse(upstream)
    except ValueError as exc:
        raise BackendFailure(SECRET_UNAVAILABLE, f"CLAWMANAGER_LLM_BASE_URL: {exc}") from None
    chosen = gateway.model_for(model)
    env = {GATEWAY_WINDOW_VAR: "1"} | ({"ANTHROPIC_MODEL": chosen} if chosen else {})
    proxy = upstream_proxy(upstream) if with_proxy else None
    return ClaudePlan(key_var="ANTHROPIC_AUTH_TOKEN", key=key, upstream=upstream, model=chosen, env=env,
                      secret_values=[key, *(proxy.secrets if proxy else ())], proxy=proxy, source="gateway")


def llm_config(environ: Mapping[str, str], secrets_dir: str | None = None,
               credentials_dir: str | None = None) -> LLMConfig | None:
    """What a Claude Code run gets to reach a model (registry.LLM_SOURCES): the projection's
    provider, `external` (`gateway` when its base URL is the gateway's, as Codex's): its base
    URL (else Anthropic's), provider `anthropic`, the model of env/ANTHROPIC_MODEL (or
    settings.json); one the projection names but cannot be used is still a provider of its own
    (no URL). Without a projection, the AI gateway (`gateway`, its base URL, provider and the
    model a run gets); None with neither. Never a key: the projection's values are kept out of
    the URL."""
    projection = Projection.locate(secrets_dir, credentials_dir, backend=PROFILE)
    try:
        plan = plan_provider(projection, environ, with_proxy=False)
    except BackendFailure:
        return LLMConfig(LLM_SOURCE, EXTERNAL)  # the registry asks only when a projection is there
    gateway = gateway_settings(environ)
    if plan.source == "gateway" and gateway is not None:
        return gateway_config(gateway, LLM_SOURCE, plan.model)
    status = GATEWAY if gateway is not None and same_endpoint(plan.upstream, gateway.base_url) else EXTERNAL
    return LLMConfig(LLM_SOURCE, status, plan.upstream, "anthropic", plan.model, hide=[plan.key, *plan.secret_values])


def check_base_url(url: str, label: str) -> str:
    """The upstream URL, or secret-unavailable with a sentence (a projected value the run
    cannot use, like a key that is not one line): http(s) with a host and a port from 1 to
    65535, no credentials, query or fragment in it, and plain http only to a loopback address
    (the key must not cross a network in clear). Never quotes the URL."""
    parts = urllib.parse.urlsplit(url)
    try:
        Upstream.parse(url)
    except ValueError as exc:
        raise BackendFailure(SECRET_UNAVAILABLE, f"{label}: {str(exc).replace(parts.hostname or '', 'the host')}") \
            from None
    if parts.username is not None or parts.password is not None:
        raise BackendFailure(SECRET_UNAVAILABLE, f"{label}: credentials in the URL are not accepted; "
                                                 "put the key in env/ANTHROPIC_API_KEY")
    if parts.query or parts.fragment:
        raise BackendFailure(SECRET_UNAVAILABLE, f"{label}: a query or fragment is not accepted")
    if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
        raise BackendFailure(SECRET_UNAVAILABLE, f"{label}: plain http is accepted only to a loopback address "
                                                 "(the key would cross the network in clear)")
    return url.rstrip("/")


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

# `network: true` is the internet, not this host or the networks around it. Claude Code's
# sandbox matches a name's resolved addresses against ranges (and refuses loopback, link-local
# and cloud metadata addresses of a name on its own), but an IP literal only against the
# literals listed (measured, 2.1.332): hence both kinds here, and this host's own addresses.
DENIED_RANGES = ("127.0.0.0/8", "0.0.0.0/8", "169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                 "100.64.0.0/10", "::1", "::", "fe80::/10", "fc00::/7")
DENIED_HOSTS = ("localhost", "*.localhost", "127.0.0.1", "0.0.0.0", "169.254.169.254", "100.100.100.200",
                "168.63.129.16", "192.0.0.192", "fd00:ec2::254")


@dataclass(frozen=True)
class Confinement:
    """What the agent's commands (the sandbox) and file tools (the permission rules) may not
    read, and what they may read all the same."""
    hidden: tuple[str, ...]  # sandbox denyRead: a file reads as denied, a directory as empty
    allowed: tuple[str, ...] = ()  # sandbox allowRead: the workspace and the run's private dir, within those
    rules: tuple[str, ...] = ()  # what the Read/Edit deny rules name (each, and what is below it)
    network_denied: tuple[str, ...] = ()  # sandbox deniedDomains (with the network on)


def confine(hidden: Sequence[str], allowed: Sequence[str], local_addresses: Sequence[str] = ()) -> Confinement:
    """The Confinement of a run. A permission rule cannot make an exception (measured: a
    "!" rule does not re-allow below a denied directory), so a hidden directory holding an
    allowed path is denied in the rules entry by entry around it, as it is at the run's start
    (the sandbox, which can make the exception, covers what comes later)."""
    rules: list[str] = []
    for path in hidden:
        inside = [a for a in allowed if _below(a, path)]
        if path in allowed:
            continue  # the workspace is the root itself: what is hidden inside it has a rule of its own
        rules += _around(path, inside) if inside else [path]
    denied = tuple(dict.fromkeys([*DENIED_HOSTS, *DENIED_RANGES, *local_addresses]))
    return Confinement(tuple(hidden), tuple(allowed), tuple(dict.fromkeys(rules)), denied)


def _below(path: str, parent: str) -> bool:
    return path.startswith(parent.rstrip("/") + "/")


def _around(hidden: str, inside: Sequence[str]) -> list[str]:
    """Every entry of `hidden`, and of each directory below it on the way to a path of
    `inside`, that is not on that way."""
    ways: dict[str, set[str]] = {}
    for path in inside:
        parts = path[len(hidden.rstrip("/")) + 1:].split("/")
        current = hidden
        for part in parts:
            ways.setdefault(current, set()).add(part)
            current = f"{current.rstrip('/')}/{part}"
    out = []
    for directory, keep in sorted(ways.items()):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue  # unreadable here: the sandbox's denyRead still covers it
        out += [f"{directory.rstrip('/')}/{name}" for name in names if name not in keep]
    return out


def policy_settings(policy: Policy, workspace: str, confinement: Confinement,
                    projected: dict[str, Any]) -> dict[str, Any]:
    """The settings.json of the run (the CLI's user settings, in its private HOME).

    The sandbox (bubblewrap) carries what permission rules cannot: the agent's Bash
    commands write only in the workspace (read-only: nowhere), reach no network unless the
    policy says so (and then not this host nor private ranges), and never read the runtime's
    config, state and secrets, other runs' private dirs or other agents' (`confinement`). The
    sandbox must start or the CLI refuses to (failIfUnavailable), and a command may not leave
    it (allowUnsandboxedCommands: false). Hooks are off: they run outside the sandbox."""
    filesystem: dict[str, Any] = {"denyRead": ["/" + path for path in confinement.hidden],
                                  "allowRead": ["/" + path for path in confinement.allowed]}
    if policy.sandbox == "read-only":
        filesystem["denyWrite"] = ["/" + workspace]
    # "//" starts an absolute path in a rule; a directory's rule covers what is below it.
    deny = [f"{tool}(/{path}{below})" for path in confinement.rules for below in ("", "/**")
            for tool in ("Read", "Edit")]
    deny += list((projected.get("permissions") or {}).get("deny") or [])
    network: dict[str, Any] = {"allowedDomains": ["*"], "deniedDomains": list(confinement.network_denied)} \
        if policy.network else {"allowedDomains": []}
    settings = {k: v for k, v in projected.items() if k != "permissions"}
    settings.update({
        "permissions": {"deny": deny, "ask": list((projected.get("permissions") or {}).get("ask") or []),
                        "allow": [], "disableBypassPermissionsMode": "disable"},
        "sandbox": {"enabled": True, "failIfUnavailable": True, "autoAllowBashIfSandboxed": True,
                    "allowUnsandboxedCommands": False, "excludedCommands": [],
                    "network": network, "filesystem": filesystem},
        "disableAllHooks": True,
        "enableAllProjectMcpServers": False,
        "cleanupPeriodDays": 1,
    })
    if policy.external:
        # The container is the sandbox (CALDERA_RUN_SANDBOX=external): the CLI's own is off and
        # Bash runs without asking (which the sandbox's autoAllowBashIfSandboxed did); the file
        # tools keep their deny rules, the commands see what the container's user sees.
        settings["sandbox"] = {"enabled": False}
        settings["permissions"]["allow"] = ["Bash"]
    return settings


def local_addresses(proc_net: str = "/proc/net") -> list[str]:
    """This host's own addresses (its interfaces'), from procfs: an IP literal of one of them
    would reach the host's services as the loopback would."""
    found: list[str] = []
    try:
        with open(f"{proc_net}/fib_trie", encoding="ascii", errors="replace") as fh:
            last = None
            for line in fh:
                words = line.split()
                if len(words) >= 2 and words[0] == "|--":
                    last = words[1]
                elif last and words[:3] == ["/32", "host", "LOCAL"]:
                    found.append(last)
    except OSError:
        pass  # no IPv4 here
    try:
        with open(f"{proc_net}/if_inet6", encoding="ascii", errors="replace") as fh:
            for line in fh:
                raw = line.split()[0] if line.split() else ""
                if len(raw) == 32:
                    found.append(str(ipaddress.ip_address(bytes.fromhex(raw))))
    except (OSError, ValueError):
        pass  # no IPv6 here
    return list(dict.fromkeys(found))


def tools_for(policy: Policy) -> list[str]:
    tools = list(READ_TOOLS)
    if policy.sandbox == "workspace-write":
        tools += WRITE_TOOLS
    if policy.network:
        tools += NETWORK_TOOLS  # they run in the CLI's own process: offered only with the network on
    return tools


def prompt_text(prompt: str) -> str:
    """The prompt as the CLI is sent it: one starting with "/" is taken by the CLI for one of
    its own commands even with --disable-slash-commands (which only makes the built-in ones
    answer "isn't available"; measured, 2.1.332), and never reaches the model. A space in
    front makes it text (a path, most likely, or a question about a command)."""
    return " " + prompt if prompt.startswith("/") else prompt


def argv(binary: str, policy: Policy, settings_path: str, model: str | None) -> list[str]:
    """The CLI's argv: stream-json both ways, only the run's own settings (none of the
    workspace's .claude/ or .mcp.json), no session kept on disk, no slash command (a prompt
    starting with "/" is text: `/config …` would change the CLI's settings), the policy's
    tools and mode.

    workspace-write: acceptEdits (edits inside the workspace go through, edits elsewhere would
    ask); read-only: dontAsk (whatever is not pre-approved is denied). approval never: nothing
    may ask (`--permission-prompts none` denies it); on-request: the CLI asks the runtime on
    stdio, which declines (there is no approver in an unattended run)."""
    mode = "acceptEdits" if policy.sandbox == "workspace-write" else "dontAsk"
    out = [binary, "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
           "--settings", settings_path, "--setting-sources", "user", "--strict-mcp-config",
           "--no-session-persistence", "--disable-slash-commands", "--permission-mode", mode,
           "--tools", ",".join(tools_for(policy))]
    if policy.approval == "on-request":
        out += ["--permission-prompt-tool", "stdio"]
    else:
        out += ["--permission-prompts", "none"]
    if model:
        out += ["--model", model]
    return out
