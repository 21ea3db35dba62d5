"""Codex's state databases made once per binary and written into a run's CODEX_HOME
(caldera/backends/codex/seed.py): with a fake `codex` script, and the real binary when set."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import subprocess

import pytest

from caldera.backends.codex import seed

CODEX_BIN = os.environ.get("CALDERA_CODEX_BIN")


def fake_codex(tmp_path, body: str):
    """A `codex` that counts its starts and runs `body` in sh ($CODEX_HOME set by the caller)."""
    script = tmp_path / "codex"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/starts\n{body}\n')
    script.chmod(0o755)
    return str(script)


def starts(tmp_path) -> list[str]:
    path = tmp_path / "starts"
    return path.read_text().splitlines() if path.exists() else []


MAKES = ('printf db > "$CODEX_HOME/state_5.sqlite"; printf wal > "$CODEX_HOME/state_5.sqlite-wal"; '
         'printf shm > "$CODEX_HOME/state_5.sqlite-shm"; printf x > "$CODEX_HOME/installation_id"')


def test_the_databases_are_made_once_per_binary_and_written_private(tmp_path):
    binary = fake_codex(tmp_path, MAKES)
    homes = [tmp_path / "home1", tmp_path / "home2"]
    for home in homes:
        home.mkdir()
        assert seed.seed_home(binary, home) is True
        # the database and its log; not the index SQLite rebuilds, nor the run's own id
        assert sorted(os.listdir(home)) == ["state_5.sqlite", "state_5.sqlite-wal"]
        assert (home / "state_5.sqlite-wal").read_bytes() == b"wal"
        assert stat.S_IMODE((home / "state_5.sqlite").stat().st_mode) == 0o600
    assert starts(tmp_path) == ["app-server"]  # once for both runs
    os.utime(binary, ns=(1, 1))  # another binary at the same path: made again
    (tmp_path / "home3").mkdir()
    assert seed.seed_home(binary, tmp_path / "home3") is True
    assert starts(tmp_path) == ["app-server", "app-server"]


@pytest.mark.parametrize("body", [
    "exit 3",  # failed
    'printf x > "$CODEX_HOME/installation_id"',  # no database
    'ln -s /etc/passwd "$CODEX_HOME/state_5.sqlite"',  # not a file
    'head -c 5000000 /dev/zero > "$CODEX_HOME/state_5.sqlite"',  # more than SEED_CAP
])
def test_without_databases_the_run_writes_none_and_says_so(tmp_path, body):
    binary = fake_codex(tmp_path, body)
    home = tmp_path / "home"
    home.mkdir()
    notes: list[str] = []
    assert seed.seed_home(binary, home, notes.append) is False
    assert os.listdir(home) == []
    assert notes == ["codex's state databases could not be made ahead: the run's Codex makes its own"]


def test_a_timeout_is_tried_again_at_the_next_run(tmp_path, monkeypatch):
    monkeypatch.setattr(seed, "SEED_TIMEOUT", 0.3)
    marker = tmp_path / "slow"
    marker.touch()
    binary = fake_codex(tmp_path, f'[ -e {marker} ] && exec sleep 30\n{MAKES}')
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert seed.seed_home(binary, tmp_path / "a") is False
    marker.unlink()
    assert seed.seed_home(binary, tmp_path / "b") is True


@pytest.mark.skipif(not (CODEX_BIN and os.access(CODEX_BIN, os.X_OK)), reason="CALDERA_CODEX_BIN is not set")
def test_the_real_codex_starts_on_the_seeded_databases_without_remaking_them(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert seed.seed_home(CODEX_BIN, home) is True
    names = set(os.listdir(home))
    assert {"state_5.sqlite", "state_5.sqlite-wal"} <= names, names
    with contextlib.closing(sqlite3.connect(home / "state_5.sqlite")) as db, db:
        db.execute("CREATE TABLE caldera_probe (x)")  # Codex keeps a database it finds migrated
    done = subprocess.run([CODEX_BIN, "app-server"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "CODEX_HOME": str(home), "LANG": "C.UTF-8"})
    assert done.returncode == 0, done.stderr[-500:]
    with contextlib.closing(sqlite3.connect(home / "state_5.sqlite")) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"caldera_probe", "threads", "_sqlx_migrations"} <= tables, tables
