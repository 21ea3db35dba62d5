"""Where the native Codex binary is, and the bubblewrap its npm package bundles."""
from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic, TypeVar

from caldera import config

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
T = TypeVar("T")
TRIPLES = {"x86_64": ("codex-linux-x64", "x86_64-unknown-linux-musl"),
           "aarch64": ("codex-linux-arm64", "aarch64-unknown-linux-musl")}


def find_binary(env: Mapping[str, str]) -> str | None:
    """CALDERA_CODEX_BIN, else `codex` on PATH (the npm wrapper resolved to its native binary)."""
    explicit = config.codex_binary(env)
    if explicit:
        return explicit
    found = shutil.which("codex", path=env.get("PATH") or DEFAULT_PATH)
    return native_for(found) if found else None


def native_for(path: str) -> str:
    """The native binary inside the npm package when `path` is its Node wrapper (bin/codex.js)."""
    real = os.path.realpath(path)
    if not real.endswith(".js"):
        return path
    package = Path(real).parent.parent  # node_modules/@openai/codex
    pkg, triple = TRIPLES.get(os.uname().machine, TRIPLES["x86_64"])
    for base in (package / "node_modules" / "@openai", package.parent):
        candidate = base / pkg / "vendor" / triple / "bin" / "codex"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return path


def bundled_bwrap(binary: str | None) -> str | None:
    """The bubblewrap in Codex's npm package (`codex-resources/bwrap` beside its `bin/`), which
    Codex uses itself without one on PATH: caldera's box then uses it too."""
    if not binary:
        return None
    return str(Path(os.path.realpath(binary)).parent.parent / "codex-resources" / "bwrap")


class PerBinary(Generic[T]):
    """What is read once per Codex binary (its path, mtime and size), each binary once even
    with runs starting together: `read(binary)` gives (the value, whether it holds for this
    binary: a timeout may be a loaded host's, and the next run then tries again)."""

    def __init__(self, read: Callable[[str], tuple[T | None, bool]]):
        self._read = read
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, int, int], T | None] = {}

    def get(self, binary: str) -> T | None:
        try:
            st = os.stat(binary)
        except OSError:
            return None
        key = (os.path.realpath(binary), st.st_mtime_ns, st.st_size)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            value, lasting = self._read(binary)
            if lasting:
                self._cache[key] = value
            return value
