"""Codex's state databases, made once per binary and copied into each run's fresh CODEX_HOME.

Codex 0.169 creates five SQLite databases in an empty CODEX_HOME when it starts (`state_5`
with 62 migrations, `logs_2`, `memories_1`, `goals_1`, `queue_1`): ≈ 60-70 ms of a 250 ms
turn, which every run paid since each has a CODEX_HOME of its own (docs/performance.md,
section 10). Once made they hold no one's data (empty tables, the migrations' bookkeeping),
so they are made once per binary (path, mtime, size) by `codex app-server` started with an
empty CODEX_HOME and its stdin at EOF (it creates them and exits, no network, ≈ 0.2 s),
kept as bytes (≈ 0.5 MB: each database and its write-ahead log; SQLite rebuilds the shared
index file `-shm` itself), and written into the run's CODEX_HOME before Codex starts.

Fails safe: when they cannot be made (the command failed or timed out, left no database,
something unexpected or too much), the run writes none and its Codex makes them itself, as
before; a timeout is tried again at the next run.
"""
from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from caldera.backends.codex.binary import DEFAULT_PATH, PerBinary
from caldera.host import proc

SEED_TIMEOUT = 10.0
SEED_CAP = 4 * 1024 * 1024  # all the files together (0.169: ≈ 0.5 MB)
OUTPUT_CAP = 64 * 1024
_DATABASE = re.compile(r"[a-z]+_[0-9]+\.sqlite(-wal)?")


def seed_home(binary: str, home: Path, note: Callable[[str], None] | None = None) -> bool:
    """Write the binary's fresh databases into `home` (a run's new CODEX_HOME, before Codex
    starts); False (and `note` says so) when there are none to write."""
    files = _databases.get(binary)
    if not files:
        if note is not None:
            note("codex's state databases could not be made ahead: the run's Codex makes its own")
        return False
    for name, data in files.items():
        fd = os.open(home / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    return True


def _make(binary: str) -> tuple[dict[str, bytes] | None, bool]:
    """(The databases an empty CODEX_HOME's `codex app-server` left, by name, or None; whether
    that holds for this binary)."""
    with tempfile.TemporaryDirectory(prefix="caldera-codex-seed-") as home:
        result = proc.run([binary, "app-server"], env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "HOME": home,
                                                       "CODEX_HOME": home},
                          timeout=SEED_TIMEOUT, stdout_cap=OUTPUT_CAP)
        if not result.ok:
            return None, not result.timed_out
        return _read(Path(home)), True


def _read(home: Path) -> dict[str, bytes] | None:
    files: dict[str, bytes] = {}
    total = 0
    with os.scandir(home) as entries:
        for entry in entries:
            if not _DATABASE.fullmatch(entry.name):
                continue
            if not entry.is_file(follow_symlinks=False):
                return None
            total += entry.stat(follow_symlinks=False).st_size
            if total > SEED_CAP:
                return None
            files[entry.name] = Path(entry.path).read_bytes()
    return files if any(name.endswith(".sqlite") for name in files) else None


_databases: PerBinary[dict[str, bytes]] = PerBinary(_make)
