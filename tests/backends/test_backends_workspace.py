"""The workspace diff (caldera/backends/workspace.py) on a workspace that is the agent's: a
FIFO or a socket in it never blocks the walk (the review's H2), a directory swapped for a
symlink to a secret while the walk runs never brings the secret into the diff (H1), and the
walk is bounded (entries, the caller's stop)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from caldera.backends import workspace
from caldera.backends.workspace import Snapshot


def test_text_binary_and_large_files_and_deletions_make_the_diff(tmp_path):
    (tmp_path / "keep.txt").write_text("same\n")
    (tmp_path / "edit.txt").write_text("one\ntwo\n")
    (tmp_path / "gone.txt").write_text("bye\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    before = Snapshot.take(str(tmp_path))
    (tmp_path / "edit.txt").write_text("one\nTWO\n")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new.txt").write_text("fresh")
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2")
    (tmp_path / "big.txt").write_text("x" * (workspace.FILE_BYTES + 1))
    (tmp_path / ".git" / "HEAD").write_text("changed\n")  # skipped
    diff = before.diff()
    assert "-two\n+TWO\n" in diff and "+++ /dev/null" in diff and "-bye" in diff
    assert "+++ b/sub/new.txt" in diff and "+fresh\n\\ No newline at end of file\n" in diff
    assert "Binary or large file blob.bin added\n" in diff and "Binary or large file big.txt added\n" in diff
    assert "keep.txt" not in diff and ".git" not in diff


def _take_bounded(root: Path) -> tuple[threading.Thread, dict]:
    """Snapshot.take in a thread, waited for (a liveness bound: a walk that blocks fails)."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(snap=Snapshot.take(str(root))), daemon=True)
    thread.start()
    thread.join(30)
    return thread, box


def _unblock(fifo: Path) -> None:
    """Open the FIFO for writing: a reader blocked in open() (the flaw) is let go."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader blocked on it


def test_a_fifo_or_a_socket_in_the_workspace_never_blocks_the_walk_and_is_one_line(tmp_path):
    """A FIFO opened for reading blocks until a writer comes: the run would never end."""
    (tmp_path / "a.txt").write_text("a\n")
    before_fifo = tmp_path / "early"
    os.mkfifo(before_fifo)
    try:
        thread, box = _take_bounded(tmp_path)
        assert not thread.is_alive(), "the walk blocked on a FIFO that was there before the turn"
        before = box["snap"]
        late = tmp_path / "p"
        os.mkfifo(late)  # made by the agent during the turn
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(tmp_path / "s.sock"))
            thread = threading.Thread(target=lambda: box.update(diff=before.diff()), daemon=True)
            thread.start()
            thread.join(30)
            assert not thread.is_alive(), "the walk blocked on a FIFO made during the turn"
    finally:
        _unblock(before_fifo)
        _unblock(tmp_path / "p")
    assert box["diff"] == "FIFO p added\nSocket s.sock added\n"


def test_a_file_swapped_for_a_fifo_or_a_symlink_is_never_opened_through(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("SECRETTEXT\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("plain\n")
    (ws / "g").write_text("plain\n")
    before = Snapshot.take(str(ws))
    (ws / "f").unlink()
    (ws / "f").symlink_to(secret)
    (ws / "g").unlink()
    os.mkfifo(ws / "g")
    box: dict = {}
    try:
        thread = threading.Thread(target=lambda: box.update(diff=before.diff()), daemon=True)
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        _unblock(ws / "g")
    assert box["diff"] == "f: file replaced by symlink\ng: file replaced by FIFO\n"


SWAPPER = r"""
import os, sys
ws, secret = sys.argv[1], sys.argv[2]
os.symlink(secret, os.path.join(ws, "dlink"))
d, tmp, link = (os.path.join(ws, n) for n in ("d", "dtmp", "dlink"))
print("ready", flush=True)
while True:  # d: a directory, then for a moment a symlink to the secret's, and back
    os.rename(d, tmp); os.rename(link, d); os.rename(d, link); os.rename(tmp, d)
"""


def test_a_directory_swapped_for_a_symlink_during_the_walk_never_brings_a_secret_in(tmp_path):
    """A process swaps a workspace directory for a symlink to a secret one as fast as it can
    while snapshots are taken: no snapshot ever holds the secret's text (the flaw checked a
    path, then opened it by path: the swap in between leaked it)."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "f").write_text("SECRETTEXT\n")
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_text("harmless\n")
    before = Snapshot.take(str(ws))
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(ws), str(hidden)], stdout=subprocess.PIPE)
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == b"ready\n"
        leaked = [n for n in range(400) if "SECRETTEXT" in before.diff()]
    finally:
        swapper.kill()
        swapper.wait()
        swapper.stdout.close()
    assert leaked == []


def test_the_walk_is_bounded_and_stops_when_asked(tmp_path, monkeypatch):
    for i in range(40):
        (tmp_path / f"f{i}").write_text("x")
    stopped = Snapshot.take(str(tmp_path), should_stop=lambda: True)
    assert not stopped.complete and stopped.reason == "the run was stopped" and stopped.diff() == ""
    assert Snapshot.take(str(tmp_path), should_stop=lambda: False).complete
    monkeypatch.setattr(workspace, "MAX_FILES", 10)
    many = Snapshot.take(str(tmp_path))
    assert not many.complete and many.reason == "more than 10 files"


def test_a_tree_past_the_depth_bound_gives_no_diff(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace, "MAX_DEPTH", 3)
    tmp_path.joinpath(*[f"d{i}" for i in range(5)]).mkdir(parents=True)
    snap = Snapshot.take(str(tmp_path))
    assert not snap.complete and snap.reason == "deeper than 3 levels"
