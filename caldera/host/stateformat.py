"""The state dir's format version, and the one place that migrates it (issue 35).

`<state-dir>/format.json` says which layout the state dir is in (`format`, an integer) and
which caldera wrote that (`written_by`). caldera 0.1.0 wrote no marker: a state dir without
one is format 1, 0.1.0's layout (`session.json`, `state.json` with its journal, `outbox/`
with the delivered record and the held-back items' retry records, `cache/`, `logs/`,
`skills/`, `runs/`). 0.2.0 reads and writes that same layout and adds only the marker,
which 0.1.0 never looks at: a downgrade to 0.1.0 works (docs/packaging.md, "Upgrades").

`prepare(state_dir)` runs once at start, before anything else opens the state dir
(`daemon/wiring.build_parts`: `caldera run` and `report --once`):
- a newer format than this runtime knows: `NewerFormat` (exit 2), one sentence naming both
  versions, and nothing in the state dir is touched;
- an older one: each step of `MIGRATIONS` from its format up, then the marker, under an
  flock on the state dir itself (two starts at once migrate once);
- no marker: format 1; the marker is written.

A migration step (format N -> N+1) must survive a kill -9 at any point: it writes what is
new beside the old files (each write atomic) and leaves the old ones as they were; the
marker then moves to N+1 (one atomic rename); only after that may a step's own cleanup
remove what format N used, and that cleanup is repeated harmlessly on the next start. A
kill before the marker moved leaves format N usable (the step runs again from the start),
a kill after it leaves format N+1.
"""
from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from caldera import TYPE_CHECKING, __version__
from caldera.errors import ConfigError
from caldera.host.fsutil import atomic_write_json, read_json

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

log = logging.getLogger("caldera.stateformat")
MARKER = "format.json"
FORMAT = 1  # the layout this runtime reads and writes
UNMARKED = 1  # a state dir without a marker: written by 0.1.0
FIRST_WRITER = {1: "0.1.0"}  # the release that first wrote each format
# format N -> the step that makes N+1 of it (see the module docstring). None yet: 0.2.0
# kept 0.1.0's layout.
MIGRATIONS: Mapping[int, Callable[[Path], None]] = {}


class NewerFormat(ConfigError):
    """The state dir was written by a newer caldera, in a format this one cannot read."""


class BadMarker(ConfigError):
    """format.json is not one caldera wrote."""


def read_format(state_dir: Path) -> tuple[int, str]:
    """(format, the caldera version that wrote it) of a state dir; (1, "0.1.0") without a marker."""
    path = state_dir / MARKER
    try:
        doc = read_json(path, None)
    except (ValueError, UnicodeDecodeError):
        raise BadMarker(f"{path} is not valid JSON; caldera writes it whole, so it was edited: "
                        f"restore it or remove it (a state dir without it counts as caldera 0.1.0's)") from None
    if doc is None:
        return UNMARKED, FIRST_WRITER[UNMARKED]
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise BadMarker(f"{path} holds no state format (a positive integer under \"format\"); "
                        f"restore it or remove it (a state dir without it counts as caldera 0.1.0's)")
    writer = doc.get("written_by")
    return fmt, writer if isinstance(writer, str) and writer.isprintable() and len(writer) <= 40 else "unknown"


def prepare(state_dir: Path, *, current: int = FORMAT, migrations: Mapping[int, Callable[[Path], None]] = MIGRATIONS,
            version: str = __version__) -> int:
    """Make an existing state dir this runtime's format (see the module docstring); returns
    the format it was found in. Raises NewerFormat or BadMarker, having changed nothing."""
    found, _ = _check(state_dir, current, version)
    if found == current and (state_dir / MARKER).exists():
        return found
    with _DirLock(state_dir):
        found, _ = _check(state_dir, current, version)  # another start may have migrated meanwhile
        for step in range(found, current):
            migrations[step](state_dir)
            _mark(state_dir, step + 1, version)
        if not (state_dir / MARKER).exists():
            try:
                _mark(state_dir, current, version)
            except OSError as exc:
                # Only the stamp of a layout this runtime reads as it is (a full disk at the
                # first start after an upgrade): the next start writes it; the runtime goes on.
                log.warning("%s not written (%s); the state dir is read as it is (format %d)",
                            state_dir / MARKER, exc.strerror or exc, current)
    return found


def _check(state_dir: Path, current: int, version: str) -> tuple[int, str]:
    found, writer = read_format(state_dir)
    if found > current:
        newer = f"caldera {writer}" if writer != "unknown" else "a newer caldera"
        raise NewerFormat(
            f"{state_dir} is in state format {found}, written by {newer}, and caldera {version} "
            f"reads formats up to {current}: install {newer} or later again (nothing was changed)")
    return found, writer


def _mark(state_dir: Path, fmt: int, version: str) -> None:
    # 0644: `caldera status` without sudo may name the format; it holds nothing secret.
    atomic_write_json(state_dir / MARKER, {"format": fmt, "written_by": version}, mode=0o644)


class _DirLock:
    """An exclusive flock on the state dir itself (no new file): two starts at once (the
    daemon and cron's report --once after an upgrade) migrate one after the other."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> _DirLock:
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # drops the flock
