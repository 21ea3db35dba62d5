"""Log names: refused by the runtime before any adapter call (SPEC section 7).

A name comes from Caldera or a person, so it is checked here first; the
adapter checks again (seed 000). Besides SPEC's list (empty, > 190 characters,
a NUL, a leading '-', '/' or '\\', '.' or '..') control characters are refused
too: no log name needs a newline, and one would forge lines in our own logs.
A name that is not valid Unicode text (a lone surrogate) is refused with a
sentence, never passed on (it can't be encoded into an argv).
"""
from __future__ import annotations

from caldera import TYPE_CHECKING
from caldera.agents.adapter.answer import ContractError
from caldera.host.jsonlimits import text_problem

if TYPE_CHECKING:
    from typing import Any

NAME_MAX = 190
LIST_MAX = 50
NO_SUCH_LOG = "There is no such log."


def name_problem(name: Any) -> str | None:
    """Why `name` is refused as a log name, or None when it may be asked for."""
    if not isinstance(name, str) or name == "":
        return "a log name is required"
    if len(name) > NAME_MAX:
        return f"a log name has at most {NAME_MAX} characters"
    if "\0" in name:
        return "a log name must not contain a NUL"
    if name.startswith("-"):
        return "a log name must not start with '-'"
    if "/" in name or "\\" in name:
        return "a log name is a name, not a path ('/' and '\\' are refused)"
    if name in (".", ".."):
        return "a log name must not be '.' or '..'"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "a log name must not contain control characters"
    problem = text_problem(name)  # a lone surrogate (a "\ud800" escape, undecodable argv bytes)
    if problem:
        return f"a log name must be valid text: {problem}"
    return None


def check_log_list(data: Any) -> list[str]:
    """The usable names of a `log --list` answer: at most 50, each a valid name."""
    if not isinstance(data, dict) or not isinstance(data.get("logs"), list):
        raise ContractError("log --list: the answer must be {\"logs\": [{\"name\": …}, …]}")
    names: list[str] = []
    for index, entry in enumerate(data["logs"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ContractError(f"log --list: logs[{index}]: must be an object with a string 'name'")
        if name_problem(entry["name"]) is None and entry["name"] not in names:
            names.append(entry["name"])
        if len(names) == LIST_MAX:
            break
    return names
