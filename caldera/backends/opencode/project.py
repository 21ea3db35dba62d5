"""What OpenCode would load from a workspace into its own process: refused before a turn.

OpenCode 1.18.33 walks from the session's directory up to its project's root (the git
worktree; `/` outside one) for `.opencode/` dirs and `opencode.json[c]` files, and imports
every `.opencode/{plugin,plugins}/*.{js,ts}` and every plugin a found config names into the
*server's* process: unconfined, with its password, its account's files and its network
(measured: `--pure`, `OPENCODE_DISABLE_PROJECT_CONFIG=1` and `OPENCODE_DISABLE_DEFAULT_PLUGINS=1`
do not stop it). No flag or config key of the pinned CLI does, so caldera refuses a turn whose
workspace or a parent of it, up to `/`, holds such a file (`blocked`, one sentence naming it),
checked before every turn (a command or an edit of an earlier turn may have planted one), and
stops a server after a turn that left one (it must not load it later).
"""
from __future__ import annotations

import json
import os
import re
import stat

CONFIGS = ("opencode.json", "opencode.jsonc")
PLUGIN_DIRS = ("plugin", "plugins")
PLUGIN_SUFFIXES = (".js", ".ts")
MAX_CONFIG = 1024 * 1024
PLUGIN_KEYS = ("plugin", "plugins")  # the v1 and the v2 key
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def plugin_file(workspace: str) -> str | None:
    """The first file in `workspace` or a parent (its path as given and its real path) that
    OpenCode would load code from, else None."""
    seen: set[str] = set()
    for start in (os.path.abspath(workspace), os.path.realpath(workspace)):
        here = start
        while here not in seen:
            seen.add(here)
            found = _in_dir(here)
            if found:
                return found
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
    return None


def _in_dir(directory: str) -> str | None:
    dot = os.path.join(directory, ".opencode")
    for config in (*(os.path.join(directory, n) for n in CONFIGS), *(os.path.join(dot, n) for n in CONFIGS)):
        if _names_plugins(config):
            return config
    if not os.path.isdir(dot):
        return None
    for sub in PLUGIN_DIRS:
        try:
            names = sorted(os.listdir(os.path.join(dot, sub)))
        except OSError:
            continue  # none there (or not a dir)
        for name in names:
            if name.endswith(PLUGIN_SUFFIXES):
                return os.path.join(dot, sub, name)
    return None


def _names_plugins(path: str) -> bool:
    """Whether the config file at `path` names a plugin: parsed as OpenCode parses it (JSON with
    comments and trailing commas, escapes decoded: `"plug\\u0069n"` is `plugin`), a top-level
    `plugin` or `plugins` key with a value. One too large to read, or that does not parse, is
    counted as one (what OpenCode would make of it is not known)."""
    try:  # never blocks: a FIFO planted as the config would hold the turn before its loop
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # not there, or a dir
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True  # a FIFO, a device: what OpenCode would read there is not known
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(MAX_CONFIG + 1)
    except OSError:
        return True
    finally:
        os.close(fd)
    if len(raw) > MAX_CONFIG:
        return True
    try:
        pairs = json.loads(_plain_json(raw.decode("utf-8").removeprefix("\ufeff")), object_pairs_hook=_Pairs)
    except (ValueError, RecursionError):
        return True
    return isinstance(pairs, _Pairs) and any(key in PLUGIN_KEYS and value not in (None, [], {}, "")
                                           for key, value in pairs)


class _Pairs(list[tuple[str, object]]):
    """A JSON object's pairs in order (a key given twice: both, as a later one may not win)."""


def _plain_json(text: str) -> str:
    """JSONC as JSON: comments (`//`, `/* */`) and commas before `}` or `]` removed, strings kept."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[i:end + 1])
            i = end + 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return _TRAILING_COMMA.sub(r"\1", "".join(out))


def refusal(path: str) -> str:
    return (f"{path} is an OpenCode plugin (or a config naming one) that the OpenCode server would run "
            "outside the sandbox: remove it from the workspace and its parents to run OpenCode here")
