"""fsutil: files in the state dir are never opened through a planted symlink."""
import pytest


def test_state_dir_files_are_never_opened_through_a_planted_symlink(tmp_path):
    import errno

    from caldera.host.fsutil import StateLock, read_json

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "lock").symlink_to(victim)
    with pytest.raises(OSError) as err:
        StateLock(state, "daemon").acquire()
    assert err.value.errno == errno.ELOOP and victim.read_text() == "precious\n"  # not truncated
    (state / "state.json").symlink_to(victim)
    with pytest.raises(OSError):
        read_json(state / "state.json")
