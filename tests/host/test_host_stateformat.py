"""caldera/host/stateformat.py: the state dir's format marker, the refusal of a newer
format, and the migration steps (with a kill -9 in the middle of one)."""
import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from caldera.errors import EXIT_USAGE
from caldera.host import stateformat
from caldera.host.stateformat import MARKER, BadMarker, NewerFormat, prepare, read_format


def old_state(path: Path) -> Path:
    """A state dir as 0.1.0 leaves one: no marker."""
    path.mkdir()
    (path / "state.json").write_text('{"commands": {}}')
    (path / "session.json").write_text('{"session_token": "agt_sess_x"}')
    return path


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_no_marker_is_010s_format_and_start_writes_the_marker(tmp_path):
    state = old_state(tmp_path / "s")
    assert read_format(state) == (1, "0.1.0")
    assert prepare(state, version="0.2.0") == 1
    assert json.loads((state / MARKER).read_text()) == {"format": 1, "written_by": "0.2.0"}
    assert (state / MARKER).stat().st_mode & 0o777 == 0o644
    assert json.loads((state / "state.json").read_text()) == {"commands": {}}  # the layout is 0.1.0's


def test_a_marked_state_dir_of_this_format_is_left_alone(tmp_path):
    state = old_state(tmp_path / "s")
    prepare(state, version="0.2.0")
    before = snapshot(state)
    prepare(state, version="0.2.1")  # a later release of the same format rewrites nothing
    assert snapshot(state) == before


def test_a_newer_format_is_refused_in_one_sentence_naming_both_versions_and_nothing_changes(tmp_path):
    state = old_state(tmp_path / "s")
    (state / MARKER).write_text(json.dumps({"format": 2, "written_by": "0.3.0"}))
    before = snapshot(state)
    with pytest.raises(NewerFormat) as err:
        prepare(state, version="0.2.0")
    message = str(err.value)
    assert err.value.exit_code == EXIT_USAGE
    assert "state format 2" in message and "caldera 0.3.0" in message and "caldera 0.2.0" in message
    assert message.count(". ") == 0 and "\n" not in message
    assert snapshot(state) == before


@pytest.mark.parametrize("text", ["{not json", "[]", '{"format": "2"}', '{"format": true}', '{"format": 0}', "{}"])
def test_a_marker_caldera_did_not_write_is_refused_by_name(tmp_path, text):
    state = old_state(tmp_path / "s")
    (state / MARKER).write_text(text)
    before = snapshot(state)
    with pytest.raises(BadMarker, match=MARKER):
        prepare(state, version="0.2.0")
    assert snapshot(state) == before


def test_an_unprintable_writer_is_not_echoed(tmp_path):
    state = old_state(tmp_path / "s")
    (state / MARKER).write_text(json.dumps({"format": 9, "written_by": "\x1b[31mred"}))
    with pytest.raises(NewerFormat) as err:
        prepare(state, version="0.2.0")
    assert "\x1b" not in str(err.value) and "written by a newer caldera" in str(err.value)


def _rename_step(state: Path) -> None:
    """Format 1 -> 2 of a made-up layout: state.json becomes core.json (written beside it)."""
    data = (state / "state.json").read_bytes()
    tmp = state / ".core.json.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, state / "core.json")


def test_the_steps_run_in_order_and_the_marker_follows_each(tmp_path):
    state = old_state(tmp_path / "s")
    seen = []

    def step2(path):
        seen.append((2, read_format(path)[0]))

    def step1(path):
        _rename_step(path)
        seen.append((1, read_format(path)[0]))

    assert prepare(state, current=3, migrations={1: step1, 2: step2}, version="0.4.0") == 1
    assert seen == [(1, 1), (2, 2)]  # step 2 ran on a dir already marked 2
    assert read_format(state) == (3, "0.4.0")
    assert (state / "core.json").read_text() == '{"commands": {}}'
    before = snapshot(state)
    prepare(state, current=3, migrations={1: step1, 2: step2}, version="0.4.0")
    assert snapshot(state) == before and len(seen) == 2  # nothing runs twice


KILLED_IN_STEP = """
import os, signal, sys
from pathlib import Path
from caldera.host import stateformat

def step(state):
    (state / "core.json").write_text("half")  # a step's first write ...
    os.kill(os.getpid(), signal.SIGKILL)      # ... and kill -9 before the marker moves

stateformat.prepare(Path(sys.argv[1]), current=2, migrations={1: step}, version="0.3.0")
"""


def test_kill_9_in_the_middle_of_a_step_leaves_the_old_state_usable_and_the_next_start_finishes(tmp_path):
    state = old_state(tmp_path / "s")
    done = subprocess.run([sys.executable, "-c", KILLED_IN_STEP, str(state)], timeout=60)
    assert done.returncode == -9
    assert not (state / MARKER).exists()  # still format 1: what 0.1.0 and 0.2.0 read
    assert read_format(state) == (1, "0.1.0")
    assert (state / "state.json").read_text() == '{"commands": {}}'
    # The next start (of the newer release) runs the step again, from the start, and completes.
    prepare(state, current=2, migrations={1: _rename_step}, version="0.3.0")
    assert read_format(state) == (2, "0.3.0")
    assert (state / "core.json").read_text() == '{"commands": {}}'


def test_two_starts_at_once_migrate_one_after_the_other(tmp_path):
    """The migration holds an flock on the state dir: a second start waits for it, then finds
    the work done."""
    state = old_state(tmp_path / "s")
    calls = []
    fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a first start does while it migrates
    worker = threading.Thread(target=prepare, args=(state,),
                              kwargs={"current": 2, "migrations": {1: calls.append}, "version": "0.3.0"})
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and calls == []  # waiting for the lock, not migrating
    stateformat._mark(state, 2, "0.3.0")  # the first start finished the migration
    os.close(fd)
    worker.join(30)
    assert not worker.is_alive() and calls == []  # re-read under the lock: nothing left to do


def test_a_full_disk_at_the_first_start_skips_the_stamp_and_goes_on(tmp_path, monkeypatch, caplog):
    """The stamp of a layout read as it is must not keep the daemon from starting (issue 26's
    full disk); the next start writes it. A real migration step's failure does stop the start."""
    import errno

    state = old_state(tmp_path / "s")

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(stateformat, "atomic_write_json", full)
    assert prepare(state, version="0.2.0") == 1
    assert not (state / MARKER).exists() and "No space left on device" in caplog.text
    with pytest.raises(OSError):
        prepare(state, current=2, migrations={1: _rename_step}, version="0.3.0")
    assert read_format(state) == (1, "0.1.0")
    monkeypatch.undo()
    prepare(state, version="0.2.0")
    assert read_format(state) == (1, "0.2.0")
