"""content_md5 (SPEC section 9): each expected value is the MD5 of a byte stream
written out by hand in the test, per ClawManager's spec."""
import hashlib
import os

import pytest
from skills_helpers import content_md5_mapping, content_md5_zip, hand_md5, write_tree, zip_bytes

from caldera.skills import md5


def test_published_vectors_from_spec():
    assert content_md5_mapping({}) == "d41d8cd98f00b204e9800998ecf8427e"
    assert content_md5_mapping({"SKILL.md": b"hello\n"}) == "bab02a68eaf254c164cf4d590bdd8693"
    assert content_md5_mapping({"src/main.py": b"print('hello')\n"}) == "484c78266deda9cff6a07d6df6ce0cad"
    assert content_md5_mapping({"utils.py": b"A\n", "utils/a.py": b"B\n"}) == "ae95bc697ef760b144d614f57b3bd33e"


def test_nested_dirs_global_sort(tmp_path):
    write_tree(tmp_path, {"a/b/c.txt": "c", "a/d.txt": "d", "b.txt": "b", "utils.py": "A\n", "utils/x.py": "B\n"})
    expected = hand_md5([("dir", "a"), ("dir", "a/b"), ("file", "a/b/c.txt", b"c"), ("file", "a/d.txt", b"d"),
                         ("file", "b.txt", b"b"), ("dir", "utils"), ("file", "utils.py", b"A\n"),
                         ("file", "utils/x.py", b"B\n")])
    assert md5.content_md5_dir(tmp_path) == expected


def test_empty_file_and_binary_file(tmp_path):
    blob = bytes(range(256)) * 3 + b"\r\n\x00"
    write_tree(tmp_path, {"empty.txt": b"", "bin/data.bin": blob})
    expected = hand_md5([("dir", "bin"), ("file", "bin/data.bin", blob), ("file", "empty.txt", b"")])
    assert md5.content_md5_dir(tmp_path) == expected
    assert expected != hand_md5([("dir", "bin"), ("file", "bin/data.bin", blob)])  # the empty file counts


def test_dot_file_and_dot_dir_excluded(tmp_path):
    write_tree(tmp_path, {"SKILL.md": "hello\n", ".DS_Store": "x", ".git/config": "y", "docs/.cache/a": "z",
                          "only-hidden/.keep": ""})
    (tmp_path / "empty").mkdir()
    expected = hand_md5([("file", "SKILL.md", b"hello\n")])
    assert expected == "bab02a68eaf254c164cf4d590bdd8693"
    assert md5.content_md5_dir(tmp_path) == expected
    # the reference OpenClaw agent's walk order gives these instead (clawmanager-notes 3.2)
    assert md5.content_md5_dir(tmp_path) not in ("2d92d5461d50d687abda4cfe97556ccb", "63662a5a89126c9be6d19b86604a93d8")


def test_non_ascii_names(tmp_path):
    write_tree(tmp_path, {"été/résumé.md": "café\n".encode()})
    expected = hand_md5([("dir", "été"), ("file", "été/résumé.md", "café\n".encode())])
    assert md5.content_md5_dir(tmp_path) == expected == "50fffdce9f60c982bce311a029b3a54a"


def test_zip_single_top_level_dir_is_stripped_once(tmp_path):
    data = zip_bytes([("weather/", b""), ("weather/skill.json", b'{"name":"weather"}\n'),
                      ("weather/src/main.py", b"print('weather')\n"), ("weather/.hidden", b"x")])
    path = tmp_path / "w.zip"
    path.write_bytes(data)
    expected = hand_md5([("file", "skill.json", b'{"name":"weather"}\n'), ("dir", "src"),
                         ("file", "src/main.py", b"print('weather')\n")])
    assert content_md5_zip(path) == expected == "ab4d1523ea445a77023f96fb7241afbc"


def test_symlinks_skipped_not_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    skill = write_tree(tmp_path / "s", {"SKILL.md": "hello\n"})
    os.symlink(outside, skill / "leak.txt")
    os.symlink("/etc", skill / "etc")
    assert md5.content_md5_dir(skill) == "bab02a68eaf254c164cf4d590bdd8693"
    assert [f.rel for f in md5.collect_files(skill)] == ["SKILL.md"]


def test_backslash_and_non_utf8_names_refused(tmp_path):
    skill = write_tree(tmp_path / "s", {"a\\b.txt": "x"})
    with pytest.raises(md5.SkillNameError, match="backslash"):
        md5.content_md5_dir(skill)
    other = tmp_path / "t"
    other.mkdir()
    (other / os.fsdecode(b"bad\xff.txt")).write_text("x")
    with pytest.raises(md5.SkillNameError, match="UTF-8"):
        md5.content_md5_dir(other)


def test_dir_and_zip_agree(tmp_path):
    files = {"SKILL.md": b"# s\n", "lib/x.py": os.urandom(5000), "lib/y/z.txt": b"z"}
    skill = write_tree(tmp_path / "myskill", files)
    path = tmp_path / "m.zip"
    path.write_bytes(zip_bytes([(f"myskill/{k}", v) for k, v in files.items()]))
    assert md5.content_md5_dir(skill) == content_md5_zip(path) == content_md5_mapping(files)
    assert md5.content_md5_dir(skill) != hashlib.md5(path.read_bytes()).hexdigest()


def test_every_size_around_the_read_paths_hashes_the_same_through_a_shared_buffer(tmp_path):
    sizes = [0, 1, md5.SMALL_FILE - 1, md5.SMALL_FILE, md5.SMALL_FILE + 1, md5.HASH_BUFFER - 1,
             md5.HASH_BUFFER, md5.HASH_BUFFER + 1, 2 * md5.HASH_BUFFER + 7]
    buffer = bytearray(md5.HASH_BUFFER)  # one buffer for both skills, as a scan passes it
    for name in ("one", "two"):
        files = {f"f{size}.bin": os.urandom(size) for size in sizes}
        skill = write_tree(tmp_path / name, files)
        listed, digest = md5.hash_skill(skill, buffer)
        assert digest == content_md5_mapping(files)
        assert [f.size for f in listed] == [len(files[f.rel]) for f in listed]


def test_a_small_file_that_grew_after_its_fstat_is_hashed_whole(tmp_path, monkeypatch):
    data = os.urandom(md5.HASH_BUFFER + 5000)  # grown past the buffer: the rest is read as a big file
    skill = write_tree(tmp_path / "s", {"grown.bin": data, "small.txt": b"abc"})
    real = os.fstat

    def stale(fd):  # the size the file had when fstat ran, before a writer appended to it
        st = real(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid,
                               min(st.st_size, 100), st.st_atime, st.st_mtime, st.st_ctime))

    monkeypatch.setattr(md5.os, "fstat", stale)
    _, digest = md5.hash_skill(skill)
    assert digest == content_md5_mapping({"grown.bin": data, "small.txt": b"abc"})


def test_hash_skill_is_collect_files_and_content_md5_in_one_pass(tmp_path):
    skill = tmp_path / "s"
    (skill / "utils").mkdir(parents=True)
    (skill / "utils.py").write_bytes(b"u")
    (skill / "utils" / "a.py").write_bytes(b"a" * 300_000)  # bigger than the hash buffer
    (skill / "SKILL.md").write_text("---\nname: s\n---\n")
    (skill / "empty").write_bytes(b"")
    (skill / ".hidden").write_text("x")
    files, digest = md5.hash_skill(skill)
    listed = md5.collect_files(skill)
    assert digest == md5.content_md5_files(listed) == content_md5_mapping(
        {f.rel: (skill / f.rel).read_bytes() for f in listed})
    assert files == listed
    assert md5.files_signature(files) == md5.stat_signature(skill)
    (tmp_path / "empty-skill" / ".git").mkdir(parents=True)
    assert md5.hash_skill(tmp_path / "empty-skill") == ([], None)


def test_a_file_swapped_for_a_fifo_after_the_walk_is_refused_not_waited_on(tmp_path, monkeypatch):
    # The walk saw a regular file; a fifo with no writer now stands in its place. Opening it
    # for reading used to block the scan for good.
    skill = write_tree(tmp_path / "s", {"a.txt": b"a", "b.txt": b"b"})
    real_walk = md5._walk

    def walk_then_swap(directory, prefix, out, specials=None, with_stat=True):
        real_walk(directory, prefix, out, specials, with_stat)
        if prefix == "":
            os.unlink(skill / "b.txt")
            os.mkfifo(skill / "b.txt")

    import threading

    outcome = []

    def hash_it():
        try:
            md5.hash_skill(skill)
        except md5.ScanError as exc:
            outcome.append(str(exc))

    monkeypatch.setattr(md5, "_walk", walk_then_swap)
    worker = threading.Thread(target=hash_it, daemon=True)
    worker.start()
    worker.join(10)  # bounds a failure only
    assert not worker.is_alive(), "the scan blocked on the fifo"
    assert outcome and "no longer a regular file" in outcome[0] and "b.txt" in outcome[0]
