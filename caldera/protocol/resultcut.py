"""A finish result cut to what the plane takes (SPEC section 8), never replaced.

Whole up to RESULT_CAP bytes of JSON as the client sends it (compact, ASCII escapes). Past
that it is cut field by field, each step one pass over the result (about linear time):
  1. nesting deeper than MAX_DEPTH levels becomes a short note (the plane's decoder refuses
     bodies nested deeper than 64 levels; a result sits two levels down in the body), and a
     key longer than SHORT bytes of JSON drops its field (such a key alone could pass the cap);
  2. the longest strings first, all of them down to one common length (a "water level"), so
     several long fields share the room; strings of SHORT bytes or less are never cut. A log
     (a field named text, log, tail, output, stdout or stderr) keeps its end, starting at a
     line's beginning, so its last line arrives intact; every other string keeps its start.
     Strings are cut between characters (Python slices code points), never inside one;
  3. if that is not enough (many small items), lists and objects keep their first items, all
     of them down to one common count (a water level over item counts). The top-level fields
     SPEC section 8 names (status, run_id, failure_kind, log_path, ...) come first, then the
     other short top-level fields, so they are the last to go.
A cut result says `truncated: true`, `result_bytes` (its size before the cut) and
`cut_fields`: the paths that were cut (`items[K:N]`: a list kept its first K of N items;
`m{K:N}`: an object kept its first K of N keys), each path at most PATH_CHARS characters
(cut in the middle), the list at most ROOM/2 bytes; `cut_fields_left_out` counts the paths
that did not fit. The whole is always at most the cap.
"""
from __future__ import annotations

import json
import math
from json.encoder import encode_basestring_ascii as _encode

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

RESULT_CAP = 1024 * 1024
SHORT = 1024  # bytes of JSON: a string or field this short is always kept whole
MAX_DEPTH = 32
ROOM = 4096  # kept free under the cap for truncated/result_bytes/cut_fields
TAIL_KEYS = frozenset(("text", "log", "tail", "output", "stdout", "stderr"))
PATH_CHARS = 200
NAMED_FIRST = ("status", "run_id", "failure_kind", "log_path", "error", "exit_code", "command_id",
               "name", "revision_id", "state")
CHAR_BYTES = 12  # the most JSON bytes one code point can take (a surrogate pair, \uXXXX\uXXXX)


def size(value: Any) -> int:
    """Bytes of `value` as the client sends it (compact JSON, non-ASCII escaped)."""
    return len(json.dumps(value, separators=(",", ":")))


def _path(chain: Any) -> str:
    """The text of a path kept as nested (parent, key, is_dict) tuples, at most PATH_CHARS."""
    keys: list[tuple[Any, bool]] = []
    while chain is not None:
        chain, key, in_dict = chain
        keys.append((key, in_dict))
    text = ""
    for key, in_dict in reversed(keys):
        text = (f"{text}.{key}" if text else str(key)) if in_dict else f"{text}[{key}]"
        if len(text) > 4 * PATH_CHARS:
            break
    return _short_path(text or "(top level)")


def _short_path(text: str) -> str:
    if len(text) <= PATH_CHARS:
        return text
    half = (PATH_CHARS - 3) // 2
    return f"{text[:half]}...{text[len(text) - half:]}"


def bounded(value: Any, depth: int = 0, cut: list[str] | None = None, chain: Any = None) -> Any:
    """A copy of `value` as JSON can carry it: non-finite numbers as None, tuples as lists,
    keys as strings, containers deeper than MAX_DEPTH as a note (their paths into `cut`).
    The recursion never goes deeper than MAX_DEPTH, whatever `value` is."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (dict, list, tuple)):
        if depth >= MAX_DEPTH:
            if cut is not None:
                cut.append(_path(chain))
            return f"[cut: nested deeper than {MAX_DEPTH} levels]"
        if isinstance(value, dict):
            return {str(k): bounded(v, depth + 1, cut, (chain, k, True)) for k, v in value.items()}
        if all(type(v) is str for v in value):  # a list of strings (log lines, names): copied at once
            return list(value)
        return [bounded(v, depth + 1, cut, (chain, i, False)) for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _scalar_size(value: Any) -> int:
    """size() of a number, bool or None without a json.dumps call (as json writes them)."""
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, int):
        return len(int.__repr__(value))
    if isinstance(value, float):
        return len(float.__repr__(value))
    return size(value)


class _Survey:
    """One pass over a result: its size, its long strings, its containers' item sizes."""

    def __init__(self, result: dict[str, Any], cut: list[str], drop_keys: bool) -> None:
        self.strings: list[tuple[int, Any, Any, Any]] = []  # (size, parent, key, chain)
        self.containers: list[tuple[Any, Any, list[int]]] = []  # (container, chain, item sizes)
        self.cut, self.drop_keys = cut, drop_keys
        self.total = self.measure(result, None)

    def measure(self, value: Any, chain: Any) -> int:
        if isinstance(value, str):
            return len(_encode(value))
        if isinstance(value, list):
            if not value:
                return 2
            if all(type(item) is str for item in value):
                sizes = list(map(len, map(_encode, value)))
                for index, length in enumerate(sizes):
                    if length > SHORT:
                        self.strings.append((length, value, index, (chain, index, False)))
            else:
                sizes = [self.child(value, index, item, chain, False) for index, item in enumerate(value)]
            self.containers.append((value, chain, sizes))
            return sum(sizes) + len(sizes) + 1
        if isinstance(value, dict):
            if not value:
                return 2
            if self.drop_keys:
                for key in [k for k in value if len(k) * CHAR_BYTES + 2 > SHORT and len(_encode(k)) > SHORT]:
                    del value[key]
                    self.cut.append(_path((chain, f"{key[:40]}...(a key of {len(key)} characters)", True)))
            sizes = [len(_encode(key)) + 1 + self.child(value, key, item, chain, True) for key, item in value.items()]
            self.containers.append((value, chain, sizes))
            return sum(sizes) + len(sizes) + 1 if sizes else 2
        return _scalar_size(value)

    def child(self, parent: Any, key: Any, item: Any, chain: Any, in_dict: bool) -> int:
        here = (chain, key, in_dict)
        if isinstance(item, str):
            if len(item) * CHAR_BYTES + 2 <= SHORT:
                return len(_encode(item))
            length = len(_encode(item))
            if length > SHORT:
                self.strings.append((length, parent, key, here))
            return length
        return self.measure(item, here)


def cut_string(text: str, budget: int, keep_end: bool) -> str:
    """The longest start (or end) of `text` whose JSON is at most `budget` bytes, on a
    character boundary; an end starts at a line's beginning when the kept part has one."""
    lo, hi = 0, min(len(text), max(budget - 2, 0))  # every character takes at least one byte
    while lo < hi:  # the most characters that fit
        mid = (lo + hi + 1) // 2
        part = text[len(text) - mid:] if keep_end else text[:mid]
        if len(_encode(part)) <= budget:
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


def _mark_gone(items: list[Any], gone: set[int]) -> None:
    """The ids of every container inside `items` (each node is visited once in all)."""
    stack = [item for item in items if isinstance(item, (dict, list))]
    while stack:
        node = stack.pop()
        gone.add(id(node))
        stack.extend(item for item in (node.values() if isinstance(node, dict) else node)
                     if isinstance(item, (dict, list)))


def _count_level(containers: list[tuple[Any, Any, list[int]]], excess: int) -> int:
    """The common item count K for which keeping the first K items of every container frees
    at least `excess` bytes (0 when nothing less does)."""
    suffixes: list[list[int]] = []
    for _, _, sizes in containers:
        tail, running = [0] * (len(sizes) + 1), 0
        for index in range(len(sizes) - 1, -1, -1):
            running += sizes[index] + 1  # the item and its comma
            tail[index] = running
        suffixes.append(tail)

    def freed(count: int) -> int:
        return sum(tail[count] - (1 if count == 0 else 0) for tail in suffixes if len(tail) - 1 > count)

    lo, hi = 0, max(len(sizes) for _, _, sizes in containers) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if freed(mid) >= excess:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _named_first(result: dict[str, Any]) -> dict[str, Any]:
    """The top level in the order it is kept: SPEC's named fields, other short scalars, the rest."""
    named = {key: result[key] for key in NAMED_FIRST if key in result}
    short = {key: value for key, value in result.items() if key not in named
             and not isinstance(value, (dict, list)) and len(_encode(key)) + size(value) <= SHORT}
    return {**named, **short, **{key: value for key, value in result.items() if key not in named and key not in short}}


def _markers(result: dict[str, Any], original: int, cut: list[str], cap: int) -> dict[str, Any]:
    """`result` with the markers added, the whole at most `cap` bytes."""
    paths, used = [], 0
    for path in cut:
        cost = len(_encode(path)) + 1
        if used + cost > ROOM // 2:
            break
        paths.append(path)
        used += cost
    result.update(truncated=True, result_bytes=original, cut_fields=paths)
    if len(paths) < len(cut):
        result["cut_fields_left_out"] = len(cut) - len(paths)
    while size(result) > cap and len(result) > 3:  # a safety net: the steps leave ROOM free
        victim = next(key for key in reversed(list(result)) if key not in (
            "truncated", "result_bytes", "cut_fields", "cut_fields_left_out"))
        del result[victim]
    return result


def cut_result(result: dict[str, Any], cap: int = RESULT_CAP) -> dict[str, Any]:
    """`result` whole when its JSON is at most `cap` bytes, else cut as the module says."""
    cut: list[str] = []
    result = bounded(result, 0, cut)
    original = size(result)
    if original <= cap and not cut:
        return result
    target = cap - ROOM
    result = _named_first(result)
    survey = _Survey(result, cut, drop_keys=True)
    over = survey.total - target
    if over > 0 and survey.strings:
        level = _level([s for s, *_ in survey.strings], over)
        for length, parent, key, chain in survey.strings:
            if length > level:
                parent[key] = cut_string(parent[key], level, keep_end=str(key) in TAIL_KEYS)
                cut.append(_path(chain))
        survey = _Survey(result, cut, drop_keys=False)
        over = survey.total - target
    while over > 0 and survey.containers:
        count = _count_level(survey.containers, over)
        gone: set[int] = set()  # containers inside items already cut away
        for container, chain, sizes in reversed(survey.containers):  # outer ones first
            if len(sizes) <= count or id(container) in gone:
                continue
            if isinstance(container, list):
                removed = container[count:]
                del container[count:]
                mark = f"[{count}:{len(sizes)}]"
            else:
                removed = [container.pop(key) for key in list(container)[count:]]
                mark = f"{{{count}:{len(sizes)}}}"
            _mark_gone(removed, gone)
            cut.append(_short_path(f"{_path(chain) if chain else ''}{mark}"))
        survey = _Survey(result, cut, drop_keys=False)
        over = survey.total - target
        if count == 0:
            break
    return _markers(result, original, cut, cap)
