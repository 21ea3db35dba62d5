"""Name a command from the first bytes of a `commands/next` answer too large to read.

The server hands a command out once: an answer over the cap must still say
which command it was, so that it is finished `failed` ("payload too large")
instead of lost. This scans the prefix token by token (no full parse, no
recursion) and keeps `id`, `command_type` and `timeout_seconds` found in the
command object: the root, `command`, `data` or `data.command` (ClawManager's
envelope). Values inside arrays or deeper objects (the payload) never count.
"""
from __future__ import annotations

import json
import re
from typing import Any

TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')
WANTED = ("id", "command_type", "timeout_seconds")
PLACES = (("data", "command"), ("command",), ("data",), ())  # most specific first

Path = tuple[str | None, ...]  # the keys from the root to an object; None: not a place a command may be


class _Frame:
    """One open object or array of the prefix."""

    __slots__ = ("is_obj", "path", "want_key", "key")

    is_obj: bool
    path: Path | None
    want_key: bool  # the next string is a key (in an object: after `{` or `,`)
    key: str | None  # the object's key whose value comes next

    def __init__(self, is_obj: bool, path: Path | None, want_key: bool, key: str | None = None) -> None:
        self.is_obj = is_obj
        self.path = path
        self.want_key = want_key
        self.key = key


def _child_path(parent: _Frame | None) -> Path | None:
    if parent is None:
        return ()
    if not parent.is_obj or parent.path is None or len(parent.path) >= 2:
        return None  # inside an array, or too deep to be the command
    return parent.path + (parent.key,)


def _scalar(token: bytes) -> Any:
    try:
        return json.loads(token)
    except ValueError:
        return None


def command_head(prefix: bytes) -> dict[str, Any]:
    """{"id", "command_type", "timeout_seconds"} as far as found; {} when nothing is."""
    found: dict[Path, dict[str, Any]] = {}
    stack: list[_Frame] = []
    for match in TOKEN.finditer(prefix):
        token = match.group()
        top = stack[-1] if stack else None
        if token in (b"{", b"["):
            is_obj = token == b"{"
            stack.append(_Frame(is_obj, _child_path(top), want_key=is_obj))
            continue
        if token in (b"}", b"]"):
            if stack:
                stack.pop()
            continue
        if token == b",":
            if top is not None and top.is_obj:
                top.want_key = True
            continue
        if token == b":" or top is None:
            continue
        value = _scalar(token)
        if top.is_obj and top.want_key:
            top.key, top.want_key = (value if isinstance(value, str) else None), False
        elif top.is_obj and top.path in PLACES and top.key in WANTED:
            found.setdefault(top.path, {})[top.key] = value
            if {"id", "command_type"} <= found[top.path].keys():
                return found[top.path]
    for place in PLACES:
        if found.get(place, {}).get("id") is not None:
            return found[place]
    return {}
