"""Settings: the manifest's schema, narrowed by the adapter's own bounds, and the checks.

Bounds only narrow (seed 000, "Grenzen verengen nur"): the offered min is the
larger of the manifest's and the adapter's, the offered max the smaller. A set
is checked against the manifest first (no adapter call), then against the
narrowed schema, and only then handed to the adapter, which has the last word.
The step grid is anchored at the manifest's `min` (`min + n × step`): narrowing
moves only the bounds, never the grid, so an adapter narrowing `min 0.1` to
`0.12` with `step 0.05` still accepts `0.2`. The 8 KiB cap counts the UTF-8
bytes of the argument exactly as it is passed (`argument()`): `"€"` is three
bytes, not a six-character `\u20ac` escape. Text that is not valid Unicode (a
lone surrogate from a `\\ud800` JSON escape, or undecodable bytes on a command line)
is refused where it names something (a key) and passed JSON-escaped where it
is data (a string value).
Plain Python only: the local `caldera settings` verb imports this.
"""
from __future__ import annotations

import json
import math

from caldera import TYPE_CHECKING
from caldera.agents.contract import ContractError
from caldera.host.jsonlimits import dumps_compact, escape_surrogates, text_problem

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    Item = dict[str, Any]  # one declared setting: {key, type, min, max, step, options, …}

SET_ARG_MAX_BYTES = 8 * 1024
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(value: Any) -> str:
    return json.dumps(value)


def value_problem(item: Item, value: Any, anchor: float | None = None) -> str | None:
    """Why `value` is not allowed for the setting `item`, or None. null (unset) is allowed.

    anchor: where the step grid starts (the manifest's own `min`, when `item` is narrowed)."""
    if value is None:
        return None
    kind = item["type"]
    if kind == "boolean":
        return None if isinstance(value, bool) else f"{_fmt(value)} is not true or false"
    if kind == "string":
        if not isinstance(value, str):
            return f"{_fmt(value)} is not a string"
        limit = item.get("max_length")
        if limit is not None and len(value) > limit:
            return f"{len(value)} characters is over the maximum length {limit}"
        return None
    if kind == "enum":
        options = item.get("options") or []
        return None if value in options else f"{_fmt(value)} is not one of {', '.join(options)}"
    if kind == "integer" and not (isinstance(value, int) and not isinstance(value, bool)):
        return f"{_fmt(value)} is not a whole number"
    if not _is_num(value):
        return f"{_fmt(value)} is not a number"
    if kind == "percent" and not 0 <= value <= 1:
        return f"{_fmt(value)} is not a fraction from 0 to 1 (0.95 is 95 %)"
    return _range_problem(item, value, item.get("min") if anchor is None else anchor)


def _range_problem(item: Item, value: float, anchor: float | None) -> str | None:
    low, high = item.get("min"), item.get("max")
    if low is not None and high is not None and low > high:
        return f"no value is allowed: the minimum {_fmt(low)} is above the maximum {_fmt(high)}"
    if low is not None and value < low:
        return f"{_fmt(value)} is below the minimum {_fmt(low)}"
    if high is not None and value > high:
        return f"{_fmt(value)} is above the maximum {_fmt(high)}"
    step = item.get("step")
    if step:
        steps = (value - (anchor or 0)) / step
        if abs(steps - round(steps)) > 1e-9 * max(1.0, abs(steps)):
            return f"{_fmt(value)} is not a multiple of the step {_fmt(step)}"
    return None


def argument(values: dict[str, Any]) -> str:
    """The one `settings set` argument, exactly as passed: compact JSON, UTF-8 text, lone
    surrogates JSON-escaped (so it always encodes, and the adapter decodes the same value)."""
    return dumps_compact(values)


def check_values(values: Any, schema: Sequence[Item], grid: Sequence[Item] | None = None) -> str | None:
    """The first problem of a set request against `schema` (items), or None.

    grid: the manifest's own items, whose `min` anchors the step grid when `schema`
    is the narrowed one (None: `schema` is the manifest's)."""
    if not isinstance(values, dict) or not values:
        return "give at least one setting (KEY=VALUE or a JSON object)"
    by_key = {item["key"]: item for item in schema}
    anchors = {item["key"]: item.get("min") for item in (grid if grid is not None else schema)}
    for key, value in values.items():
        problem = key_problem(key)
        if problem:
            return problem
        item = by_key.get(key)
        if item is None:
            known = ", ".join(by_key) or "none"
            return f"{key}: not a setting of this agent (settings: {known})"
        problem = value_problem(item, value, anchors.get(key))
        if problem:
            return f"{key}: {problem}"
    size = len(argument(values).encode("utf-8"))
    if size > SET_ARG_MAX_BYTES:
        return f"the values are {size} bytes, over the {SET_ARG_MAX_BYTES}-byte limit"
    return None


def key_problem(key: Any) -> str | None:
    """A key names a setting: it must be text (refused with a sentence, never echoed broken)."""
    if not isinstance(key, str):
        return "a setting's key must be a string"
    problem = text_problem(key)
    return f"a setting's key must be valid text: {problem}" if problem else None


def narrow(schema: Sequence[Item], bounds: dict[str, Any] | None) -> tuple[Item, ...]:
    """The manifest schema with min/max narrowed by the adapter's bounds (never widened)."""
    bounds = bounds or {}
    narrowed = []
    for item in schema:
        item = dict(item)
        extra = bounds.get(item["key"]) or {}
        if item["type"] in ("percent", "number", "integer"):
            low, high = extra.get("min"), extra.get("max")
            if low is not None:
                item["min"] = low if item.get("min") is None else max(item["min"], low)
            if high is not None:
                item["max"] = high if item.get("max") is None else min(item["max"], high)
        narrowed.append(item)
    return tuple(narrowed)


def check_settings_get(data: Any, schema: Sequence[Item]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(values, bounds) from a `settings get` answer; ContractError when it breaks the contract.

    Keys the manifest does not declare are ignored (seed 000); a declared key
    the adapter leaves out is reported as null.
    """
    if not isinstance(data, dict):
        raise ContractError("settings get: the answer must be a JSON object")
    values, bounds = data.get("values"), data.get("bounds", {})
    if not isinstance(values, dict):
        raise ContractError("settings get: 'values' must be an object of key: value")
    if not isinstance(bounds, dict):
        raise ContractError("settings get: 'bounds' must be an object of key: {min, max}")
    declared = [item["key"] for item in schema]
    clean_bounds = {}
    for key, bound in bounds.items():
        if not isinstance(bound, dict) or set(bound) - {"min", "max"}:
            raise ContractError(f"settings get: bounds.{key}: must be an object with min and/or max")
        for side in ("min", "max"):
            if side in bound and not _is_num(bound[side]):
                raise ContractError(f"settings get: bounds.{key}.{side}: must be a number")
        if key in declared:
            clean_bounds[key] = dict(bound)
    return {key: values.get(key) for key in declared}, clean_bounds


def parse_pairs(pairs: Sequence[str], schema: Sequence[Item]) -> dict[str, Any]:
    """KEY=VALUE words (or one JSON object) into values typed by the manifest; ValueError naming the word."""
    if len(pairs) == 1 and pairs[0].lstrip().startswith("{"):
        try:
            given = json.loads(pairs[0])
        except ValueError as exc:
            raise ValueError(f"the JSON object is not valid JSON: {exc}") from None
        if not isinstance(given, dict):
            raise ValueError("the JSON values must be one object")
        return given
    by_key = {item["key"]: item for item in schema}
    values: dict[str, Any] = {}
    for word in pairs:
        key, sep, raw = word.partition("=")
        if not sep or not key:
            raise ValueError(f"{ascii(word)}: write KEY=VALUE (KEY= unsets it)")
        problem = key_problem(key)
        if problem:
            raise ValueError(problem)
        item = by_key.get(key)
        if item is None:
            raise ValueError(f"{key}: not a setting of this agent (settings: {', '.join(by_key) or 'none'})")
        values[key] = _typed(item, raw)
    return values


def _typed(item: Item, raw: str) -> str | bool | int | float | None:
    if raw == "":
        return None  # KEY= unsets (null); an empty string goes through --json
    kind, text = item["type"], raw.strip()
    if kind in ("string", "enum"):
        return raw
    if kind == "boolean":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{item['key']}={escape_surrogates(raw)}: use true or false")
    try:
        if kind == "integer":
            return int(text)
        if kind == "percent" and text.endswith("%"):
            return float(text[:-1]) / 100  # 95% means 0.95
        return float(text)
    except ValueError:
        whole = "whole " if kind == "integer" else ""
        raise ValueError(f"{item['key']}={escape_surrogates(raw)}: not a {whole}number") from None
