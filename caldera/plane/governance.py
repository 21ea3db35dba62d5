"""ClawManager's LLM governance, as its server does it (CM-aug): a state report's
`runtime.llm_config_fingerprint`, `llm_config_status` and `llm_provider_base_url` are merged
into the stored `system_info` (`mergeLLMConfigIntoSystemInfo`: non-blank strings, trimmed), and
the governance view classifies the instance from that `system_info`
(`classifyLLMConfigStatusFromSystemInfo`): the status as sent, else a base URL holding
`gateway/llm` or `clawmanager` is `gateway`, one holding `openai.com` or `anthropic.com`
`external`, anything else `unknown`; an `external` instance is not compliant.
"""
from __future__ import annotations

from typing import Any

LLM_FIELDS = ("llm_config_fingerprint", "llm_config_status", "llm_provider_base_url")


def merge_llm(system_info: Any, runtime: Any) -> Any:
    """The `system_info` stored for a report: the report's, with the runtime's LLM fields over it."""
    found = {key: runtime[key].strip() for key in LLM_FIELDS
             if isinstance(runtime, dict) and isinstance(runtime.get(key), str) and runtime[key].strip()}
    if not found:
        return system_info
    merged = dict(system_info) if isinstance(system_info, dict) else {}
    merged.update(found)
    return merged


def llm_config_status(system_info: Any) -> str:
    """gateway | external | unknown (or whatever status the agent sent), as ClawManager classifies."""
    if not isinstance(system_info, dict) or not system_info:
        return "unknown"
    status = system_info.get("llm_config_status")
    if isinstance(status, str) and status.strip():
        return status.strip()
    url = system_info.get("llm_provider_base_url")
    if isinstance(url, str):
        lower = url.strip().lower()
        if "gateway/llm" in lower or "clawmanager" in lower:
            return "gateway"
        if "openai.com" in lower or "anthropic.com" in lower:
            return "external"
    return "unknown"
