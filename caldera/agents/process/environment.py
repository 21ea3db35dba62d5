"""The agent's environment in process mode (SPEC section 7b), built from nothing.

Exactly: the adapter's base (PATH, HOME, LANG, TZ if set, CALDERA_AGENT), then
CALDERA_AGENT_STATE_DIR, CALDERA_SETTINGS_FILE, CALDERA_INSTRUCTIONS_FILE and
CALDERA_MCP_CONFIG (where the manifest declares them), the manifest's `env`
(plain values), the `secrets` it names (from secrets.env, else a file under
secrets/), and the `bindings` (llm_gateway: ClawManager's AI Gateway as the platform
injects it). Nothing else of the runtime's environment, agent.env or
secrets.env reaches the agent; the bootstrap and session tokens never do, even
when named (the manifest check refuses those names, and this refuses them again).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.agents.adapter.invoke import adapter_env
from caldera.config import GATEWAY_API_KEY, GATEWAY_BASE_URL, Gateway, gateway_from_env
from caldera.protocol.llm import EXTERNAL, LLMConfig, gateway_config, same_endpoint

if TYPE_CHECKING:
    from collections.abc import Mapping

    from caldera.agents.process.spec import ProcessSpec

# llm_gateway: the base URL and the key under every name the platform gives them (whichever it
# set); the rest only as injected: CLAWMANAGER_LLM_MODEL is the catalogue (a JSON list), never
# a model, and OPENAI_MODEL the default model (SPEC section 10).
GATEWAY_AS_INJECTED = ("CLAWMANAGER_LLM_MODEL", "OPENAI_MODEL", "CLAWMANAGER_LLM_PROVIDER",
                       "CLAWMANAGER_LLM_REASONING", "CLAWMANAGER_LLM_REASONING_CONTROL")
# A provider key a manifest may hand the agent as a secret, by name: the provider, where its base
# URL would be set (the manifest's env), the vendor's own URL otherwise, and its model variable.
# Any other `<P>_API_KEY` or `<P>_AUTH_TOKEN` counts beside a `<P>_BASE_URL` or `<P>_API_BASE` in
# the manifest's env (provider_of): docs/container.md says what is and is not seen.
PROVIDER_SECRETS = {
    "OPENAI_API_KEY": ("openai", ("OPENAI_BASE_URL", "OPENAI_API_BASE"), "https://api.openai.com/v1", "OPENAI_MODEL"),
    "ANTHROPIC_API_KEY": ("anthropic", ("ANTHROPIC_BASE_URL",), "https://api.anthropic.com", "ANTHROPIC_MODEL"),
    "ANTHROPIC_AUTH_TOKEN": ("anthropic", ("ANTHROPIC_BASE_URL",), "https://api.anthropic.com", "ANTHROPIC_MODEL"),
    "DEEPSEEK_API_KEY": ("deepseek", ("DEEPSEEK_BASE_URL", "DEEPSEEK_API_BASE"), "https://api.deepseek.com",
                         "DEEPSEEK_MODEL"),
    "OPENROUTER_API_KEY": ("openrouter", ("OPENROUTER_BASE_URL", "OPENROUTER_API_BASE"), "https://openrouter.ai/api/v1",
                           "OPENROUTER_MODEL"),
    "GEMINI_API_KEY": ("gemini", ("GEMINI_BASE_URL",), "https://generativelanguage.googleapis.com", "GEMINI_MODEL"),
    "MISTRAL_API_KEY": ("mistral", ("MISTRAL_BASE_URL",), "https://api.mistral.ai/v1", "MISTRAL_MODEL"),
    "GROQ_API_KEY": ("groq", ("GROQ_BASE_URL",), "https://api.groq.com/openai/v1", "GROQ_MODEL"),
    "XAI_API_KEY": ("xai", ("XAI_BASE_URL",), "https://api.x.ai/v1", "XAI_MODEL"),
    "DASHSCOPE_API_KEY": ("dashscope", ("DASHSCOPE_BASE_URL",), "https://dashscope.aliyuncs.com/compatible-mode/v1",
                          "DASHSCOPE_MODEL"),
    "MOONSHOT_API_KEY": ("moonshot", ("MOONSHOT_BASE_URL",), "https://api.moonshot.cn/v1", "MOONSHOT_MODEL"),
}
KEY_SUFFIXES = ("_API_KEY", "_AUTH_TOKEN")  # a secret named so, beside a base URL, is a provider's key
URL_SUFFIXES = ("_BASE_URL", "_API_BASE")
LLM_SOURCE = "process agent"
NEVER_PASSED = ("CALDERA_TOKEN", "CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN", "CLAWMANAGER_INSTANCE_TOKEN")
SECRET_FILE_MAX = 64 * 1024


@dataclass
class AgentEnv:
    """The agent's environment as build_env made it."""

    env: dict[str, str] = field(default_factory=dict)  # the whole environment
    secret_values: list[str] = field(default_factory=list)  # what the Redactor must learn
    problems: list[str] = field(default_factory=list)  # sentences


def gateway_values(runtime_env: Mapping[str, str]) -> dict[str, str]:
    """ClawManager's AI Gateway as the agent gets it: the base URL (CLAWMANAGER_LLM_BASE_URL, else
    OPENAI_BASE_URL, else OPENAI_API_BASE) under all three names, the key under both of its
    (CLAWMANAGER_LLM_API_KEY, OPENAI_API_KEY), and GATEWAY_AS_INJECTED as the platform set them."""
    gateway = Gateway(runtime_env)
    out: dict[str, str] = {}
    for value, names in ((gateway.base_url, GATEWAY_BASE_URL), (gateway.api_key, GATEWAY_API_KEY)):
        if value:
            out.update(dict.fromkeys(names, value))
    out.update({name: runtime_env[name] for name in GATEWAY_AS_INJECTED if runtime_env.get(name)})
    return out


def llm_configs(spec: ProcessSpec, runtime_env: Mapping[str, str]) -> list[LLMConfig]:
    """What the agent gets to reach a model, for the state report (protocol/llm): the AI gateway
    with `bindings: [llm_gateway]`, and a provider of its own for each provider key the manifest
    names in `secrets` (provider_of; one the binding overwrites does not count), `gateway` only
    when its base URL is the gateway's (and then only if that is the platform's: llm.confirmed)."""
    gateway = gateway_from_env(runtime_env)
    bound = gateway is not None and "llm_gateway" in spec.bindings
    out = [gateway_config(gateway, LLM_SOURCE)] if gateway is not None and bound else []
    for name in spec.secrets:
        found = None if bound and name in GATEWAY_API_KEY else provider_of(name, spec.env)
        if found is None:
            continue
        provider, url, model = found
        if gateway is not None and same_endpoint(url, gateway.base_url):
            out.append(gateway_config(gateway, LLM_SOURCE, model))
        else:
            out.append(LLMConfig(f"{LLM_SOURCE} ({name})", EXTERNAL, url, provider, model))
    return out


def provider_of(name: str, env: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    """(provider, base URL, model) when the secret `name` handed to the agent is a model
    provider's key: one PROVIDER_SECRETS names (its base URL from the manifest's `env`, else the
    vendor's), or any `<P>_API_KEY`/`<P>_AUTH_TOKEN` beside a `<P>_BASE_URL`/`<P>_API_BASE` in
    `env` (the provider `p`, its model `<P>_MODEL`); None otherwise."""
    if name in PROVIDER_SECRETS:
        provider, url_names, vendor_url, model_name = PROVIDER_SECRETS[name]
        return provider, next((env[n] for n in url_names if env.get(n)), vendor_url), env.get(model_name) or None
    prefix = next((name[:-len(s)] for s in KEY_SUFFIXES if name.endswith(s) and len(name) > len(s)), None)
    url = next((env[prefix + s] for s in URL_SUFFIXES if env.get(prefix + s)), None) if prefix else None
    if prefix is None or url is None:
        return None
    return prefix.lower(), url, env.get(f"{prefix}_MODEL") or None


def build_env(spec: ProcessSpec, *, agent_name: str, files: Mapping[str, Path | None],
              runtime_env: Mapping[str, str], secrets_env: Mapping[str, str], secrets_dir: Path,
              environ: Mapping[str, str] = os.environ) -> AgentEnv:
    """files: CALDERA_* file variables -> paths (state dir, settings, instructions, mcp)."""
    out = AgentEnv()
    env = adapter_env(agent_name, "process", environ)
    env.pop("CALDERA_VERB", None)  # no verb: the agent itself runs
    env.update({name: str(path) for name, path in files.items() if path is not None})
    env.update(spec.env)
    for name in spec.secrets:
        if name in NEVER_PASSED:
            out.problems.append(f"secret {name}: the runtime's own token never reaches the agent")
            continue
        value = secrets_env.get(name)
        if value is None:
            value = _secret_file(Path(secrets_dir) / name, out.problems, name)
        if value is None:
            out.problems.append(f"secret {name}: not in secrets.env nor under secrets/; the agent runs without it")
            continue
        env[name] = value
        out.secret_values.append(value)
    if "llm_gateway" in spec.bindings:
        gateway = gateway_values(runtime_env)
        if not gateway:
            out.problems.append("binding llm_gateway: no CLAWMANAGER_LLM_* (or OPENAI_*) in the runtime's environment")
        env.update(gateway)
        out.secret_values.extend(gateway[name] for name in GATEWAY_API_KEY if name in gateway)
    out.env = env
    return out


def _secret_file(path: Path, problems: list[str], name: str) -> str | None:
    """A secret from secrets/NAME: a regular file, no symlink, at most 64 KiB; trailing newline cut."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.append(f"secret {name}: secrets/{name} can't be opened ({exc.strerror})")
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > SECRET_FILE_MAX:
            problems.append(f"secret {name}: secrets/{name} is not a regular file of at most 64 KiB")
            return None
        data = os.read(fd, SECRET_FILE_MAX)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").rstrip("\n")
