"""caldera/host/stateformat.py: the state dir's format marker, the refusal of a newer
format, and the migration steps (with a kill -9 in the middle of one)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from stateformat_helpers import read_format

from caldera.errors import EXIT_USAGE
from caldera.host import stateformat
from caldera.host.fsutil import StateLock
from caldera.host.stateformat import MARKER, BadMarker, NewerFormat, StateBusy, Step, check, prepare


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

    steps = {1: Step(step1), 2: Step(step2)}
    assert prepare(state, current=3, migrations=steps, version="0.4.0") == 1
    assert seen == [(1, 1), (2, 2)]  # step 2 ran on a dir already marked 2
    assert read_format(state) == (3, "0.4.0")
    assert (state / "core.json").read_text() == '{"commands": {}}'
    before = snapshot(state)
    prepare(state, current=3, migrations=steps, version="0.4.0")
    assert snapshot(state) == before and len(seen) == 2  # nothing runs twice


KILLED_IN_STEP = """
import os, signal, sys
from pathlib import Path
from caldera.host import stateformat

def step(state):
    (state / "core.json").write_text("half")  # a step's first write ...
    os.kill(os.getpid(), signal.SIGKILL)      # ... and kill -9 before the marker moves

stateformat.prepare(Path(sys.argv[1]), current=2, migrations={1: stateformat.Step(step)}, version="0.3.0")
"""


def test_kill_9_in_the_middle_of_a_step_leaves_the_old_state_usable_and_the_next_start_finishes(tmp_path):
    state = old_state(tmp_path / "s")
    done = subprocess.run([sys.executable, "-c", KILLED_IN_STEP, str(state)], timeout=60)
    assert done.returncode == -9
    assert not (state / MARKER).exists()  # still format 1: what 0.1.0 and 0.2.0 read
    assert read_format(state) == (1, "0.1.0")
    assert (state / "state.json").read_text() == '{"commands": {}}'
    # The next start (of the newer release) runs the step again, from the start, and completes.
    prepare(state, current=2, migrations={1: Step(_rename_step)}, version="0.3.0")
    assert read_format(state) == (2, "0.3.0")
    assert (state / "core.json").read_text() == '{"commands": {}}'


def test_a_migration_waits_for_no_one_under_a_running_daemon_and_changes_nothing(tmp_path):
    """The migration takes the state dir's own lock, the one a daemon holds all its life: a
    newer `report --once` (cron) beside an older daemon still running on format 1 must not
    move the layout under it. It says who holds the state dir, and changes nothing."""
    state = old_state(tmp_path / "s")
    calls = []
    daemon = StateLock(state, "daemon")
    assert daemon.acquire()  # the older release's daemon, running on this state dir
    before = snapshot(state)
    with pytest.raises(StateBusy) as err:
        prepare(state, current=2, migrations={1: Step(calls.append)}, version="0.3.0")
    assert calls == [] and snapshot(state) == before
    assert f"pid {os.getpid()} daemon holds it" in str(err.value) and "nothing was changed" in str(err.value)
    assert err.value.exit_code == 1  # not a configuration error: under systemd the unit starts again
    daemon.release()
    assert prepare(state, current=2, migrations={1: Step(calls.append)}, version="0.3.0") == 1
    assert calls == [state] and read_format(state) == (2, "0.3.0")


def test_the_stamp_alone_is_skipped_while_another_process_holds_the_state_dir(tmp_path):
    """No step to run (0.1.0's layout is this format): a start beside a holder (cron's
    report --once beside the daemon) leaves the marker to a later start and goes on."""
    state = old_state(tmp_path / "s")
    holder = StateLock(state, "daemon")
    assert holder.acquire()
    assert prepare(state, version="0.2.0") == 1
    assert not (state / MARKER).exists()
    holder.release()
    prepare(state, version="0.2.0")
    assert read_format(state) == (1, "0.2.0")


def test_two_starts_at_once_migrate_once(tmp_path):
    """The second start, while the first migrates, is told to try again (StateBusy); when it
    does, the work is done and nothing runs twice."""
    state = old_state(tmp_path / "s")
    calls, second = [], []

    def step(path):
        calls.append(path)
        with pytest.raises(StateBusy):
            prepare(path, current=2, migrations={1: Step(second.append)}, version="0.3.0")

    prepare(state, current=2, migrations={1: Step(step)}, version="0.3.0")
    prepare(state, current=2, migrations={1: Step(second.append)}, version="0.3.0")
    assert calls == [state] and second == [] and read_format(state) == (2, "0.3.0")


def _core_step(state: Path) -> None:
    _rename_step(state)


def _drop_state_json(state: Path) -> None:
    (state / "state.json").unlink(missing_ok=True)


def test_a_cleanup_runs_only_after_the_marker_moved(tmp_path):
    state = old_state(tmp_path / "s")
    seen = []

    def cleanup(path):
        seen.append(json.loads((path / MARKER).read_text()))
        _drop_state_json(path)

    prepare(state, current=2, migrations={1: Step(_core_step, cleanup)}, version="0.3.0")
    assert seen == [{"format": 2, "written_by": "0.3.0", "cleanup": 1}]  # the marker had moved
    assert json.loads((state / MARKER).read_text()) == {"format": 2, "written_by": "0.3.0"}
    assert not (state / "state.json").exists() and (state / "core.json").exists()


KILLED_IN_CLEANUP = """
import os, signal, sys
from pathlib import Path
from caldera.host import stateformat

def migrate(state):
    (state / "core.json").write_bytes((state / "state.json").read_bytes())

def cleanup(state):
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 after the marker moved, before the cleanup

stateformat.prepare(Path(sys.argv[1]), current=2, migrations={1: stateformat.Step(migrate, cleanup)},
                    version="0.3.0")
"""


def test_kill_9_in_a_cleanup_leaves_the_new_format_and_the_next_start_finishes_the_cleanup(tmp_path):
    state = old_state(tmp_path / "s")
    done = subprocess.run([sys.executable, "-c", KILLED_IN_CLEANUP, str(state)], timeout=60)
    assert done.returncode == -9
    assert read_format(state) == (2, "0.3.0")  # format 2: what the newer release reads
    assert (state / "state.json").exists()  # format 1's file, not cleaned up yet
    assert check(state, current=2, version="0.3.0") == 2
    migrated = []
    prepare(state, current=2, migrations={1: Step(migrated.append, _drop_state_json)}, version="0.3.0")
    assert migrated == []  # the step itself does not run again: only its cleanup
    assert not (state / "state.json").exists()
    assert json.loads((state / MARKER).read_text()) == {"format": 2, "written_by": "0.3.0"}


# ---------------------------------------------------------------- a marker that is not a file

def _refused(state: Path, *, contains: str) -> BadMarker:
    before = snapshot(state)
    with pytest.raises(BadMarker) as err:
        check(state, version="0.2.0")
    with pytest.raises(BadMarker):
        prepare(state, version="0.2.0")
    message = str(err.value)
    assert contains in message and str(state / MARKER) in message and "remove" in message, message
    assert "\n" not in message and err.value.exit_code == EXIT_USAGE
    assert snapshot(state) == before and not (state / "lock").exists()
    return err.value


def test_a_symbolic_link_is_refused_by_name_with_what_to_do(tmp_path):
    state = old_state(tmp_path / "s")
    (tmp_path / "elsewhere.json").write_text('{"format": 1}')
    os.symlink(tmp_path / "elsewhere.json", state / MARKER)
    _refused(state, contains="is a symbolic link")


def test_a_directory_is_refused_by_name(tmp_path):
    state = old_state(tmp_path / "s")
    (state / MARKER).mkdir()
    _refused(state, contains="is a directory")


FIFO_CHECK = """
import sys
from pathlib import Path
from caldera.host import stateformat
try:
    stateformat.check(Path(sys.argv[1]))
except stateformat.BadMarker as exc:
    print(exc)
"""


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    """A FIFO opened for reading blocks until someone writes: the start would hang for ever."""
    state = old_state(tmp_path / "s")
    os.mkfifo(state / MARKER)
    done = subprocess.run([sys.executable, "-c", FIFO_CHECK, str(state)], capture_output=True, text=True,
                          timeout=60)
    assert "is a FIFO" in done.stdout, done.stdout + done.stderr


def test_a_huge_marker_is_refused_after_reading_at_most_the_cap(tmp_path, monkeypatch):
    state = old_state(tmp_path / "s")
    with open(state / MARKER, "wb") as fh:
        fh.truncate(400 * 1024 * 1024)  # sparse: 400 MB that cost no disk
    read = []
    real_read = os.read

    def counting_read(fd, n):
        data = real_read(fd, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(stateformat.os, "read", counting_read)
    _refused(state, contains="larger than 64 KiB")
    assert 0 < max(read) and sum(read) <= 2 * (stateformat.MARKER_CAP + 1)  # two refusals, each one cap


def test_whitespace_around_a_marker_within_the_cap_is_still_read(tmp_path):
    state = old_state(tmp_path / "s")
    (state / MARKER).write_text(" " * 60000 + '{"format": 1, "written_by": "0.2.0"}\n')
    assert check(state) == 1 and read_format(state) == (1, "0.2.0")


def test_check_writes_nothing_and_accepts_a_state_dir_not_made_yet(tmp_path):
    assert check(tmp_path / "not-yet") == 1
    assert not (tmp_path / "not-yet").exists()
    state = old_state(tmp_path / "s")
    before = snapshot(state)
    assert check(state) == 1
    assert snapshot(state) == before and not (state / MARKER).exists()


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
        prepare(state, current=2, migrations={1: Step(_rename_step)}, version="0.3.0")
    assert read_format(state) == (1, "0.1.0")
    monkeypatch.undo()
    prepare(state, version="0.2.0")
    assert read_format(state) == (1, "0.2.0")
