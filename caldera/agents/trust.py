"""The trust boundary (SPEC section 11; docs/trust-boundary.md): what a config
revision or a blueprint update may change, checked against the manifest an
operator installed on the host with `caldera init`.

The control plane may change what an agent is **told**, never what the host
**runs**. The rule is a whitelist: a proposed manifest may differ from the
installed one only in

* `version`, `description`;
* `settings`: the same keys or fewer, the same type and step, bounds that only
  narrow the installed ones (a larger min, a smaller max, on the installed
  grid), enum options a subset, a smaller `max_length`; labels and defaults;
* `controls`: a subset of the installed ones;
* timeouts: `runtime.timeout_seconds`, `runtime.stop_timeout_seconds`,
  `health.timeout_seconds`, `health.interval_seconds`;
* `mcp` entries that are `{url}` (added, changed or removed); an entry with a
  `command` must stay exactly as installed.

Any other difference (`runtime.type`, `runtime.command`, `runtime.workdir`,
`health.command`, `account`, `secrets`, `bindings`, `env`, the paths of
`status`/`logs`/`state`/`instructions`, a key this list does not know) is
refused, naming the key, and nothing of the revision is applied.

`check_update(installed, proposed) -> list[str]` is the one function other code
calls (blueprint updates, config revisions, process mode's `instructions` and
`mcp`); an empty list means "allowed". Plain Python, no imports beyond stdlib.
"""
from __future__ import annotations

import math

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeGuard

# Keys whose value may change freely (within the manifest's own checks).
FREE = {("version",), ("description",), ("runtime", "timeout_seconds"), ("runtime", "stop_timeout_seconds"),
        ("health", "timeout_seconds"), ("health", "interval_seconds")}
# Keys with their own narrowing rule below.
RULED = ("settings", "controls", "mcp")
CONTROLS_ALL = ("pause", "resume", "run_now")


def check_update(installed: Any, proposed: Any) -> list[str]:
    """Why `proposed` may not replace `installed` (one sentence per key), or [] when it may."""
    if not isinstance(installed, dict) or not isinstance(proposed, dict):
        return ["the manifest must be a mapping"]
    problems: list[str] = []
    for key in sorted(set(installed) | set(proposed)):
        if key in RULED:
            problems.extend(_RULES[key](installed.get(key), proposed.get(key)))
        elif key in ("runtime", "health"):
            problems.extend(_nested(key, installed.get(key), proposed.get(key)))
        elif (key,) not in FREE and installed.get(key, _ABSENT) != proposed.get(key, _ABSENT):
            problems.append(_changed(key))
    return problems


def overlay(installed: dict[str, Any], proposed: dict[str, Any]) -> dict[str, Any]:
    """The effective manifest: `installed`, with what `proposed` may change taken from it.

    Called only after check_update found nothing; copying the untouchable keys
    from `installed` anyway means a stored update can never carry one in."""
    result = _clone(installed)
    for key in ("version", "description", "settings", "controls", "mcp"):
        if key in proposed:
            result[key] = _clone(proposed[key])
        else:
            result.pop(key, None)
    for section, key in (k for k in FREE if len(k) == 2):
        if section in ("runtime", "health") and isinstance(result.get(section), dict):
            new = proposed.get(section) or {}
            if key in new:
                result[section][key] = new[key]
            else:
                result[section].pop(key, None)
    return result


def _clone(value: Any) -> Any:
    """A deep copy of manifest data (dicts, lists, scalars), without importing `copy`: a local
    verb reaches this with a stored update (docs/performance.md, section 1)."""
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


class _Absent:
    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def _changed(key: str) -> str:
    return (f"{key}: changes what the host runs or reads, which only an operator's `caldera init` "
            f"on the host may change")


def _nested(section: str, old: Any, new: Any) -> list[str]:
    """runtime and health: every key but the FREE timeouts must stay as installed."""
    old = old if old is not None else {}
    new = new if new is not None else {}
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [] if old == new else [_changed(section)]
    return [_changed(f"{section}.{key}") for key in sorted(set(old) | set(new), key=str)
            if (section, key) not in FREE and old.get(key, _ABSENT) != new.get(key, _ABSENT)]


def _controls(old: Any, new: Any) -> list[str]:
    allowed = set(CONTROLS_ALL if old is None else old)
    if new is None:
        return [] if old is None else ["controls: removing the list offers every control, more than installed"]
    if not isinstance(new, list):
        return ["controls: must be a list"]
    extra = [c for c in new if c not in allowed]
    return [f"controls: {', '.join(map(str, extra))} not among the installed controls "
            f"({', '.join(sorted(allowed)) or 'none'}); an update may only offer fewer"] if extra else []


def _mcp(old: Any, new: Any) -> list[str]:
    old, new = old or {}, new or {}
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [] if old == new else [_changed("mcp")]
    problems = []
    for name in sorted(set(old) | set(new), key=str):
        before, after = old.get(name), new.get(name)
        runs = [e for e in (before, after) if isinstance(e, dict) and set(e) - {"url"}]
        if (runs or not all(isinstance(e, dict) or e is None for e in (before, after))) and before != after:
            problems.append(f"mcp.{name}.command: an MCP server the host starts; only its url entries "
                            "may change")
    return problems


def _settings(old: Any, new: Any) -> list[str]:
    old_items = _items(old)
    new_items = _items(new)
    if old_items is None or new_items is None:
        return [] if old == new else [_changed("settings")]
    by_key = {i.get("key"): i for i in old_items}
    problems = []
    for item in new_items:
        key = item.get("key")
        base = by_key.get(key)
        where = f"settings.schema.{key}"
        if base is None:
            problems.append(f"{where}: not a setting of the installed blueprint; an update may not add one")
            continue
        problems.extend(_narrows(base, item, where))
    return problems


def _items(settings: Any) -> list[dict[str, Any]] | None:
    if settings is None:
        return []
    if not isinstance(settings, dict) or not isinstance(settings.get("schema", []), list):
        return None
    items = settings.get("schema", [])
    return items if all(isinstance(i, dict) for i in items) else None


def _num(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _narrows(base: dict[str, Any], item: dict[str, Any], where: str) -> list[str]:
    """Problems of one setting: same type and step; bounds, options and length only narrow."""
    if item.get("type") != base.get("type"):
        return [f"{where}.type: {base.get('type')} in the installed blueprint; an update may not change it"]
    if item.get("step") != base.get("step"):
        return [f"{where}.step: {base.get('step')} in the installed blueprint; an update may move only the bounds"]
    problems = []
    low, high = base.get("min"), base.get("max")
    new_low, new_high = item.get("min"), item.get("max")
    if low is not None and not (_num(new_low) and new_low >= low):
        problems.append(f"{where}.min: {new_low} would widen the installed minimum {low}")
    if high is not None and not (_num(new_high) and new_high <= high):
        problems.append(f"{where}.max: {new_high} would widen the installed maximum {high}")
    step = base.get("step")
    for side, value in (("min", new_low), ("max", new_high)):
        if step and _num(value) and value != base.get(side) and not _on_grid(value, low or 0, step):
            problems.append(f"{where}.{side}: {value} is off the installed grid ({low or 0} + n × {step})")
    if "options" in base or "options" in item:
        extra = [o for o in item.get("options") or [] if o not in (base.get("options") or [])]
        if extra:
            problems.append(f"{where}.options: {', '.join(map(str, extra))} not offered by the installed blueprint")
    if base.get("max_length") is not None:
        length = item.get("max_length")
        if not (isinstance(length, int) and length <= base["max_length"]):
            problems.append(f"{where}.max_length: {length} would widen the installed {base['max_length']}")
    return problems


def _on_grid(value: float, anchor: float, step: float) -> bool:
    steps = (value - anchor) / step
    return abs(steps - round(steps)) <= 1e-9 * max(1.0, abs(steps))


_RULES: dict[str, Callable[[Any, Any], list[str]]] = {"settings": _settings, "controls": _controls, "mcp": _mcp}


RUN_KEYS = ("runtime", "health", "account", "secrets", "bindings", "env", "status", "logs", "state")


def check_content(content: dict[str, Any]) -> list[str]:
    """A config revision's own top-level keys (besides `manifest`, `settings` and ClawManager's
    bootstrap manifest): a key that names what the host runs is refused there too."""
    problems = [_changed(key) for key in RUN_KEYS if key in content]
    if "mcp" in content:
        problems.extend(_mcp({}, content["mcp"]))
    return problems


# A revision's told keys where no agent reads the runtime's files (adapter mode, or no manifest):
# reported as not applied, with the reason, rather than refused.
NOT_TOLD = {"instructions": "adapter mode passes no instructions file", "mcp": "adapter mode passes no MCP config"}


def not_told(content: dict[str, Any]) -> dict[str, Any]:
    """The finish result's part for a revision's `instructions`/`mcp` that reach no agent."""
    return {key: {"applied": False, "reason": reason} for key, reason in NOT_TOLD.items() if key in content}
