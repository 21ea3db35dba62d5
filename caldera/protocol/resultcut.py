"""A finish result cut to what the plane takes (SPEC section 8), never replaced.

Whole up to RESULT_CAP bytes of JSON as the client sends it (compact, ASCII escapes). Past
that it is cut field by field:
  1. nesting deeper than MAX_DEPTH levels becomes a short note (the plane's decoder refuses
     bodies nested deeper than 64 levels; a result sits two levels down in the body);
  2. the longest strings first, all of them down to one common length (a "water level"), so
     several long fields share the room; strings of SHORT bytes or less are never cut. A log
     (a field named text, log, tail, output, stdout or stderr) keeps its end, starting at a
     line's beginning, so its last line arrives intact; every other string keeps its start.
     Strings are cut between characters (Python slices code points), never inside one;
  3. if that is not enough (many small items), the largest lists keep their first items;
  4. if even that is not enough (a huge object of short fields), the top-level fields of
     SHORT bytes or less are kept and the rest is named in `cut_fields`.
A cut result says `truncated: true`, `result_bytes` (its size before the cut) and
`cut_fields` (the paths that were cut, at most 50).
"""
from __future__ import annotations

import json
import math

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

RESULT_CAP = 1024 * 1024
SHORT = 1024  # bytes of JSON: a string or field this short is always kept whole
MAX_DEPTH = 32
ROOM = 4096  # kept free under the cap for truncated/result_bytes/cut_fields
TAIL_KEYS = frozenset(("text", "log", "tail", "output", "stdout", "stderr"))
PATHS_KEPT = 50


def size(value: Any) -> int:
    """Bytes of `value` as the client sends it (compact JSON, non-ASCII escaped)."""
    return len(json.dumps(value, separators=(",", ":")))


def bounded(value: Any, depth: int = 0, cut: list[str] | None = None, path: str = "") -> Any:
    """A copy of `value` as JSON can carry it: non-finite numbers as None, tuples as lists,
    keys as strings, containers deeper than MAX_DEPTH as a note (their paths into `cut`).
    The recursion never goes deeper than MAX_DEPTH, whatever `value` is."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (dict, list, tuple)):
        if depth >= MAX_DEPTH:
            if cut is not None:
                cut.append(path or "(top level)")
            return f"[cut: nested deeper than {MAX_DEPTH} levels]"
        if isinstance(value, dict):
            return {str(k): bounded(v, depth + 1, cut, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        return [bounded(v, depth + 1, cut, f"{path}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _walk(value: Any, path: str = "") -> Any:
    """(container, key, child, path) for every child, depth first (the depth is bounded)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        here = (f"{path}.{key}" if path else str(key)) if isinstance(value, dict) else f"{path}[{key}]"
        yield value, key, child, here
        yield from _walk(child, here)


def cut_string(text: str, budget: int, keep_end: bool) -> str:
    """The longest start (or end) of `text` whose JSON is at most `budget` bytes, on a
    character boundary; an end starts at a line's beginning when the kept part has one."""
    lo, hi = 0, len(text)
    while lo < hi:  # the most characters that fit
        mid = (lo + hi + 1) // 2
        part = text[len(text) - mid:] if keep_end else text[:mid]
        if size(part) <= budget:
            lo = mid
        else:
            hi = mid - 1
    if not keep_end:
        return text[:lo]
    part = text[len(text) - lo:] if lo else ""
    if lo < len(text) and text[len(text) - lo - 1] != "\n":
        newline = part.find("\n")
        if 0 <= newline < len(part) - 1:
            part = part[newline + 1:]  # the first, partial line goes: every kept line is whole
    return part


def _level(sizes: list[int], excess: int) -> int:
    """The common length L for which cutting every size above L down to L frees `excess`."""
    lo, hi = SHORT, max(sizes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(s - mid for s in sizes if s > mid) >= excess:
            lo = mid
        else:
            hi = mid - 1
    return lo


def cut_result(result: dict[str, Any], cap: int = RESULT_CAP) -> dict[str, Any]:
    """`result` whole when its JSON is at most `cap` bytes, else cut as the module says."""
    cut: list[str] = []
    result = bounded(result, 0, cut)
    original = size(result)
    if original <= cap and not cut:
        return result
    target = cap - ROOM
    over = size(result) - target
    if over > 0:
        strings = [(size(child), parent, key, path) for parent, key, child, path in _walk(result)
                   if isinstance(child, str) and size(child) > SHORT]
        if strings:
            level = _level([s for s, *_ in strings], over)
            for length, parent, key, path in strings:
                if length > level:
                    parent[key] = cut_string(parent[key], level, keep_end=str(key) in TAIL_KEYS)
                    cut.append(path)
    over = size(result) - target
    while over > 0:
        lists = sorted(((size(child), parent, key, path) for parent, key, child, path in _walk(result)
                        if isinstance(child, list) and child), key=lambda t: -t[0])
        if not lists:
            break
        length, parent, key, path = lists[0]
        items = parent[key]
        lo, hi = 0, len(items) - 1  # how many first items fit (at least one goes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if size(items[:mid]) <= length - over:
                lo = mid
            else:
                hi = mid - 1
        parent[key] = items[:lo]
        cut.append(f"{path}[{lo}:{len(items)}]")
        over = size(result) - target
    if over > 0:  # short fields only, and still too many of them: the short top-level ones stay
        kept: dict[str, Any] = {}
        room = target // 2
        for key, value in result.items():
            cost = size(key) + size(value) + 2
            if not isinstance(value, (dict, list)) and size(value) <= SHORT and cost <= room:
                kept[key], room = value, room - cost
            else:
                cut.append(key)
        result = kept
    result.update(truncated=True, result_bytes=original, cut_fields=cut[:PATHS_KEPT])
    return result
