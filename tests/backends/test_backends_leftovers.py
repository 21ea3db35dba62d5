"""What a runtime killed mid-run leaves, and its sweep (caldera/backends/leftovers.py): the
dirs of runs whose owner is gone are removed and the processes still holding them killed;
a live run's dirs, a dir being made and another backend's dot dirs are left alone."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from caldera.backends import leftovers
from caldera.host import proc


def _dead_owner() -> tuple[int, int]:
    """(pid, start time) of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    stat = proc.proc_stat(child.pid)
    assert stat is not None
    child.stdin.close()
    child.wait()
    return child.pid, int(stat["start_time"])


def _run_dir(parent, name: str, owner: tuple[int, int] | None):
    path = parent / name
    (path / "home").mkdir(parents=True)
    (path / "home" / "auth.json").write_text("{}")
    if owner is not None:
        (path / leftovers.OWNER).write_text(f"{owner[0]} {owner[1]}\n")
    return path


def test_the_sweep_removes_dead_runs_and_kills_their_processes_and_leaves_the_rest(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    runs = tmp_path / "state" / "runs"
    dead = _run_dir(runs, "run-dead", _dead_owner())
    private = _run_dir(leftovers.private_root(), "tmpabc", _dead_owner())
    live = _run_dir(runs, "run-live", None)
    leftovers.claim(live)  # this process: a run going on now
    young = _run_dir(runs, "run-being-made", None)
    old = _run_dir(runs, "run-of-an-older-release", None)
    past = time.time() - 2 * leftovers.YOUNG
    os.utime(old, (past, past))
    opencode = _run_dir(runs, ".opencode-1234", _dead_owner())  # an OpenCode server whose owner died
    serving = _run_dir(runs, ".opencode-5678", None)
    leftovers.claim(serving)  # the server of a live owner
    dotted = _run_dir(runs, ".not-a-run", _dead_owner())  # any other dot name is no run
    survivor = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"], "HOME": str(dead / "home")})
    try:
        removed = leftovers.sweep(runs)
        assert sorted(removed) == sorted(map(str, [dead, private, old, opencode]))
        assert survivor.wait(timeout=20) == -9  # it held the dead run's HOME
    finally:
        survivor.kill()
        survivor.wait()
    assert live.is_dir() and young.is_dir() and serving.is_dir() and dotted.is_dir()
    assert leftovers.sweep(runs) == []  # nothing twice
    assert leftovers.sweep(tmp_path / "no-state" / "runs") == []  # no runs dir: nothing to do


def test_claim_writes_the_owner_file_for_this_process(tmp_path):
    leftovers.claim(tmp_path)
    pid, started = (int(x) for x in (tmp_path / leftovers.OWNER).read_text().split())
    assert pid == os.getpid() and proc.same_process(pid, started)
    assert (tmp_path / leftovers.OWNER).stat().st_mode & 0o777 == 0o600
