"""The status body: only the forwarded keys, cut to the protocol's limits (SPEC section 7). One
filter for both modes: adapter `status` answers and process mode's status file (section 7b).

Unknown keys (top level and inside items) are dropped; strings are cut to
1,000 characters and lists to 50 items, never rejected; a lone surrogate in a
string (a "\\ud800" JSON escape) becomes U+FFFD. A forwarded key of the
wrong type breaks the contract (ContractError): that status call counts as
failed, the same verdict as adapter-status.schema.json, except that a null
forwarded key counts as absent and items past the 50th are never read
(tests/agents/test_agents_status.py holds the two together on a corpus).
"""
from __future__ import annotations

import math

from caldera import TYPE_CHECKING
from caldera.agents.contract import ContractError
from caldera.host.jsonlimits import scrub

if TYPE_CHECKING:
    from typing import Any

STRING_MAX = 1000
LIST_MAX = 50
LEVELS = ("ok", "warn", "bad", "off")
NOT_ANSWERING = "Adapter not answering"

# key -> (kind, fields): kind "object" (one mapping), "list" (of mappings), "str", "strings"
FIELDS: dict[str, tuple[str, dict[str, str]]] = {
    "state": ("object", {"level": "level", "label": "str", "since": "str"}),
    "detail": ("str", {}),
    "gauges": ("list", {"name": "str", "used": "fraction", "label": "str", "resets_at": "str"}),
    "active": ("list", {"id": "id", "title": "str", "started_at": "str", "log": "str"}),
    "runs": ("list", {"id": "id", "title": "str", "started_at": "str", "finished_at": "str",
                      "outcome": "str", "log": "str"}),
    "health": ("list", {"name": "str", "level": "level", "reason": "str"}),
    "agent": ("object", {"version": "str", "commit": "str"}),
    "next_run": ("object", {"at": "str", "reason": "str"}),
    "held": ("strings", {}),
}
# What each level means in v1's openclaw_status slot and in health.agent.
OPENCLAW_STATUS = {"ok": "running", "warn": "running", "bad": "error", "off": "stopped"}
HEALTH_WORD = {"ok": "ok", "warn": "degraded", "bad": "error", "off": "stopped"}


def filter_status(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ContractError("status: the answer must be a JSON object")
    body: dict[str, Any] = {}
    for key, (kind, fields) in FIELDS.items():
        if key not in raw or raw[key] is None:
            continue
        value = raw[key]
        if kind == "str":
            body[key] = _scalar(value, "str", key)
        elif kind == "strings":
            if not isinstance(value, list):
                raise ContractError(f"status: {key}: must be a list of strings")
            body[key] = [_scalar(v, "str", f"{key}[{i}]") for i, v in enumerate(value[:LIST_MAX])]
        elif kind == "object":
            body[key] = _mapping(value, fields, key)
        else:
            if not isinstance(value, list):
                raise ContractError(f"status: {key}: must be a list of objects")
            body[key] = [_mapping(v, fields, f"{key}[{i}]") for i, v in enumerate(value[:LIST_MAX])]
    return body


def _mapping(value: Any, fields: dict[str, str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContractError(f"status: {where}: must be an object")
    return {name: _scalar(value[name], kind, f"{where}.{name}")
            for name, kind in fields.items() if value.get(name) is not None}


def _scalar(value: Any, kind: str, where: str) -> Any:
    if kind == "level":
        if value not in LEVELS:
            raise ContractError(f"status: {where}: must be one of {', '.join(LEVELS)}")
        return value
    if kind == "fraction":
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or not 0 <= value <= 1):
            raise ContractError(f"status: {where}: must be a number from 0 to 1")
        return value
    if kind == "id" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise ContractError(f"status: {where}: must be a string")
    return scrub(value[:STRING_MAX])  # text shown to people: a lone surrogate becomes U+FFFD


def not_answering(reason: str) -> dict[str, Any]:
    """The body of a report whose status call failed."""
    reason = reason[:STRING_MAX]
    return {"state": {"level": "bad", "label": NOT_ANSWERING},
            "detail": reason,
            "health": [{"name": "Adapter", "level": "bad", "reason": reason}]}


def level_of(body: dict[str, Any]) -> str | None:
    state = body.get("state")
    return state.get("level") if isinstance(state, dict) else None


def openclaw_status(body: dict[str, Any]) -> str:
    return OPENCLAW_STATUS.get(level_of(body) or "", "unknown")


def health_word(body: dict[str, Any]) -> str:
    return HEALTH_WORD.get(level_of(body) or "", "unknown")
