"""The state dir's format version, and the one place that migrates it (issue 35).

`<state-dir>/format.json` says which layout the state dir is in (`format`, an integer) and
which caldera wrote that (`written_by`). caldera 0.1.0 wrote no marker: a state dir without
one is format 1, 0.1.0's layout (`session.json`, `state.json` with its journal, `outbox/`
with the delivered record and the held-back items' retry records, `cache/`, `logs/`,
`skills/`, `runs/`). 0.2.0 reads and writes that same layout and adds only the marker,
which 0.1.0 never looks at: a downgrade to 0.1.0 works (docs/packaging.md, "Upgrades").

Two entries:
- `check(state_dir)`: read only, for every command that opens an agent's state dir
  (`caldera.cli._command`, `caldera init`): a newer format than this runtime knows raises
  `NewerFormat` (exit 2), one sentence naming both versions; a marker caldera did not write
  raises `BadMarker`. It imports nothing a quick verb does without (no logging, no typing:
  tests/cli/test_cli_import_budgets.py).
- `prepare(state_dir)`: the same check at the start of `caldera run` and `report --once`
  (`daemon/wiring.build_parts`, before anything else opens the state dir), then each step of
  `MIGRATIONS` from the format found up, and the marker. The work is done holding the state
  dir's own lock (`<state-dir>/lock`, `fsutil.StateLock`), the one a running daemon or
  `report --once` holds all its life: a newer `report --once` from cron never migrates under
  an older daemon that still runs on the old layout (`StateBusy`, nothing changed; it tries
  again on its next start), and two starts at once migrate once.

A migration step (format N -> N+1) is a `Step`: `migrate` writes what format N+1 adds
beside the old files (each write atomic) and changes no old file; the marker then moves to
N+1 in one atomic rename, with `"cleanup": N` in it when the step has a `cleanup`; then
`cleanup` removes what only format N used, and the marker is written once more without the
field. A kill -9 before the marker moved leaves format N, usable as it was (the step runs
again from its start); one after it leaves format N+1, and a cleanup still named in the
marker runs on the next start (so it must be harmless to repeat). An older runtime reading
a format it knows ignores the `cleanup` field.
"""
from __future__ import annotations

import errno
import json
import os
import stat

from caldera import TYPE_CHECKING, __version__
from caldera.errors import ConfigError, Retryable
from caldera.host.fsutil import StateLock, atomic_write_json, read_capped

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any, TypeGuard

MARKER = "format.json"
MARKER_CAP = 64 * 1024  # caldera writes about 40 bytes; more is not caldera's file
FORMAT = 1  # the layout this runtime reads and writes
UNMARKED = 1  # a state dir without a marker: written by 0.1.0
FIRST_WRITER = {1: "0.1.0"}  # the release that first wrote each format
_REMOVE = "(a state dir without it counts as caldera 0.1.0's)"


class Step:
    """One migration, format N -> N+1 (see the module docstring)."""

    __slots__ = ("migrate", "cleanup")

    def __init__(self, migrate: Callable[[Path], None], cleanup: Callable[[Path], None] | None = None) -> None:
        self.migrate = migrate
        self.cleanup = cleanup


# format N -> the step that makes N+1 of it. None yet: 0.2.0 kept 0.1.0's layout.
MIGRATIONS: Mapping[int, Step] = {}


class NewerFormat(ConfigError):
    """The state dir was written by a newer caldera, in a format this one cannot read."""


class BadMarker(ConfigError):
    """format.json is not one caldera wrote."""


class StateBusy(Retryable):
    """A migration is due, but another process holds the state dir (an older daemon on it)."""


def check(state_dir: Path, *, current: int = FORMAT, version: str = __version__) -> int:
    """The format of `state_dir` (1 when it has no marker, or does not exist yet), read
    without writing anything. Raises NewerFormat or BadMarker."""
    return _check(state_dir, current, version)[0]


def prepare(state_dir: Path, *, current: int = FORMAT, migrations: Mapping[int, Step] = MIGRATIONS,
            version: str = __version__) -> int:
    """Make an existing state dir this runtime's format (see the module docstring); returns
    the format it was found in. Raises NewerFormat, BadMarker or StateBusy, having changed nothing."""
    found, _, pending = _check(state_dir, current, version)
    if found == current and pending is None and (state_dir / MARKER).exists():
        return found
    lock = StateLock(state_dir, "migration")
    if not lock.acquire():
        if found == current and pending is None:
            # Only the stamp of a layout read as it is: whoever holds the lock runs on it; a
            # later start writes the marker.
            return found
        raise StateBusy(f"{state_dir} is in state format {found}, which caldera {version} migrates to "
                        f"{current} at its start, but pid {lock.holder()} holds it: nothing was changed; "
                        f"stop that process (an older caldera) and start this one again")
    with lock:
        found, _, pending = _check(state_dir, current, version)  # another start may have migrated meanwhile
        if pending is not None:
            _cleanup(state_dir, migrations, pending, found, version)  # a kill -9 cut it short last time
        for fmt in range(found, current):
            step = migrations[fmt]
            step.migrate(state_dir)
            _mark(state_dir, fmt + 1, version, cleanup=fmt if step.cleanup is not None else None)
            _cleanup(state_dir, migrations, fmt, fmt + 1, version)
        if not (state_dir / MARKER).exists():
            try:
                _mark(state_dir, current, version)
            except OSError as exc:
                # Only the stamp of a layout this runtime reads as it is (a full disk at the
                # first start after an upgrade): the next start writes it; the runtime goes on.
                import logging  # here: check() (the quick verbs) does without it

                logging.getLogger("caldera.stateformat").warning(
                    "%s not written (%s); the state dir is read as it is (format %d)",
                    state_dir / MARKER, exc.strerror or exc, current)
    return found


def _cleanup(state_dir: Path, migrations: Mapping[int, Step], fmt: int, now: int, version: str) -> None:
    """Step `fmt`'s cleanup (what only format `fmt` used), once the marker says `now`."""
    step = migrations.get(fmt)
    if step is not None and step.cleanup is not None:
        step.cleanup(state_dir)
        _mark(state_dir, now, version)


def _check(state_dir: Path, current: int, version: str) -> tuple[int, str, int | None]:
    found, writer, pending = _read(state_dir)
    if found > current:
        newer = f"caldera {writer}" if writer != "unknown" else "a newer caldera"
        raise NewerFormat(
            f"{state_dir} is in state format {found}, written by {newer}, and caldera {version} "
            f"reads formats up to {current}: install {newer} or later again (nothing was changed)")
    return found, writer, pending


def _read(state_dir: Path) -> tuple[int, str, int | None]:
    """(format, writer, the format whose cleanup is pending or None)."""
    path = state_dir / MARKER
    data = _marker_bytes(path)
    if data is None:
        return UNMARKED, FIRST_WRITER[UNMARKED], None
    try:
        doc: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise BadMarker(f"{path} is not valid JSON; caldera writes it whole, so it was edited: "
                        f"restore it or remove it {_REMOVE}") from None
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if not _positive(fmt):
        raise BadMarker(f"{path} holds no state format (a positive integer under \"format\"); "
                        f"restore it or remove it {_REMOVE}")
    writer = doc.get("written_by")
    pending = doc.get("cleanup")
    return (fmt, writer if isinstance(writer, str) and writer.isprintable() and len(writer) <= 40 else "unknown",
            pending if _positive(pending) and pending < fmt else None)


def _positive(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _marker_bytes(path: Path) -> bytes | None:
    """The marker's bytes, None when there is none. Opened without following a link and
    without blocking (a FIFO planted there would hang the start), a regular file only, at
    most MARKER_CAP bytes read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None  # no marker, or no state dir yet: nothing written there so far
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadMarker(f"{path} is a symbolic link, and caldera writes that file itself: remove the "
                            f"link {_REMOVE}") from None
        raise
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = "a directory" if stat.S_ISDIR(kind) else "a FIFO" if stat.S_ISFIFO(kind) else "not a regular file"
            raise BadMarker(f"{path} is {what}, and caldera writes that file itself: remove it {_REMOVE}")
        data = read_capped(fd, MARKER_CAP)
    finally:
        os.close(fd)
    if len(data) > MARKER_CAP:
        raise BadMarker(f"{path} is larger than {MARKER_CAP // 1024} KiB, and caldera writes a few bytes "
                        f"there: restore it or remove it {_REMOVE}")
    return data


def _mark(state_dir: Path, fmt: int, version: str, cleanup: int | None = None) -> None:
    # 0644: `caldera status` without sudo may name the format; it holds nothing secret.
    doc: dict[str, Any] = {"format": fmt, "written_by": version}
    if cleanup is not None:
        doc["cleanup"] = cleanup
    atomic_write_json(state_dir / MARKER, doc, mode=0o644)
