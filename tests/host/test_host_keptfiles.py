"""KeptFiles: one pread per read on a kept descriptor, the current text every time."""
import os

import pytest

from caldera.host.keptfiles import FIRST_SIZE, KeptFiles, ReadError


def test_reads_the_current_text_through_a_kept_descriptor(tmp_path):
    path = tmp_path / "figure"
    path.write_text("1\n")
    files = KeptFiles()
    assert files.read(str(path)) == "1\n" and len(files) == 1
    with open(path, "r+") as fh:  # rewritten in place, as the kernel regenerates a pseudo-file
        fh.write("22\n")
    assert files.read(str(path)) == "22\n" and len(files) == 1
    files.close()
    assert len(files) == 0


def test_a_long_file_is_read_whole_and_remembers_its_size(tmp_path):
    path = tmp_path / "long"
    text = "".join(f"line {i}\n" for i in range(3000))
    assert len(text) > FIRST_SIZE * 4
    path.write_text(text)
    files = KeptFiles()
    assert files.read(str(path)) == text
    assert files.read(str(path)) == text
    files.close()


def test_missing_is_none_and_a_removed_file_is_reopened(tmp_path, monkeypatch):
    files = KeptFiles()
    assert files.read(str(tmp_path / "absent")) is None
    path = tmp_path / "gone"
    path.write_text("x")
    assert files.read(str(path)) == "x"
    fd = files._fds[str(path)]
    real_pread = os.pread

    failed = []

    def failing(f, n, off):  # what a removed cgroup's file does: ENODEV on the old descriptor
        if f == fd and not failed:
            failed.append(f)
            raise OSError(19, "No such device")
        return real_pread(f, n, off)

    monkeypatch.setattr(os, "pread", failing)
    path.write_text("y")
    assert files.read(str(path)) == "y" and failed == [fd]
    path.unlink()
    monkeypatch.setattr(os, "pread", real_pread)
    files.close()


def test_not_kept_when_told_or_over_the_limit(tmp_path):
    for i in range(3):
        (tmp_path / str(i)).write_text(str(i))
    plain = KeptFiles(keep=False)
    assert plain.read(str(tmp_path / "0")) == "0" and len(plain) == 0
    capped = KeptFiles(limit=2)
    assert [capped.read(str(tmp_path / str(i))) for i in range(3)] == ["0", "1", "2"]
    assert len(capped) == 2
    capped.close()


def test_an_unreadable_file_is_a_read_error(tmp_path):
    with pytest.raises(ReadError):
        KeptFiles().read(str(tmp_path))  # a directory: open works, read fails with EISDIR
