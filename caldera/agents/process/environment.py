"""The agent's environment in process mode (SPEC section 7b), built from nothing.

Exactly: the adapter's base (PATH, HOME, LANG, TZ if set, CALDERA_AGENT), then
CALDERA_AGENT_STATE_DIR, CALDERA_SETTINGS_FILE, CALDERA_INSTRUCTIONS_FILE and
CALDERA_MCP_CONFIG (where the manifest declares them), the manifest's `env`
(plain values), the `secrets` it names (from secrets.env, else a file under
secrets/), and the `bindings` (llm_gateway: ClawManager's AI Gateway and its
OPENAI_* aliases). Nothing else of the runtime's environment, agent.env or
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
from caldera.config import llm_gateway

if TYPE_CHECKING:
    from collections.abc import Mapping

    from caldera.agents.process.spec import ProcessSpec

OPENAI_ALIAS = {"CLAWMANAGER_LLM_BASE_URL": "OPENAI_BASE_URL", "CLAWMANAGER_LLM_API_KEY": "OPENAI_API_KEY",
                "CLAWMANAGER_LLM_MODEL": "OPENAI_MODEL"}
SECRET_BINDING_KEYS = ("CLAWMANAGER_LLM_API_KEY",)
NEVER_PASSED = ("CALDERA_TOKEN", "CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN", "CLAWMANAGER_INSTANCE_TOKEN")
SECRET_FILE_MAX = 64 * 1024


@dataclass
class AgentEnv:
    """The agent's environment as build_env made it."""

    env: dict[str, str] = field(default_factory=dict)  # the whole environment
    secret_values: list[str] = field(default_factory=list)  # what the Redactor must learn
    problems: list[str] = field(default_factory=list)  # sentences


def gateway_values(runtime_env: Mapping[str, str]) -> dict[str, str]:
    """ClawManager's AI Gateway as the runtime sees it (config.llm_gateway: CLAWMANAGER_LLM_*, else
    OPENAI_*), under the CLAWMANAGER_LLM_* names."""
    return {f"CLAWMANAGER_LLM_{key.upper()}": value for key, value in llm_gateway(runtime_env).items() if value}


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
        for name, value in gateway.items():
            env[name] = env[OPENAI_ALIAS[name]] = value
            if name in SECRET_BINDING_KEYS:
                out.secret_values.append(value)
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
