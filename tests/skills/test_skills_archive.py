"""The hostile-archive corpus (built here): each archive is refused by install_skill
with a message naming the problem, nothing on disk changes, the old version stays."""
import stat
import struct
import zipfile

import pytest
from fault_helpers import API
from skills_helpers import FakeRuntime, content_md5_mapping, run, snapshot, zip_bytes

from caldera.errors import CommandError
from caldera.skills import md5

GOOD = [("weather/", b""), ("weather/SKILL.md", b"---\nname: weather\nversion: 1.2.0\n---\nhello\n"),
        ("weather/src/main.py", b"print('weather')\n")]
GOOD_MD5 = content_md5_mapping({"SKILL.md": GOOD[1][1], "src/main.py": GOOD[2][1]})


def _shared_data_zip() -> bytes:
    """Two central-directory entries pointing at one local entry: zip's hard link."""
    data = bytearray(zip_bytes([("w/a.txt", b"AAAA"), ("w/b.txt", b"AAAA")], compression=zipfile.ZIP_STORED))
    second = data.index(b"PK\x01\x02", data.index(b"PK\x01\x02") + 4)
    data[second + 42:second + 46] = struct.pack("<I", 0)
    return bytes(data)


def _bomb() -> bytes:
    return zip_bytes([("w/", b""), ("w/zeros.bin", b"\0" * (20 * 1024 * 1024))])


def _many() -> bytes:
    return zip_bytes([(f"w/f{i}.txt", b"") for i in range(10_001)], compression=zipfile.ZIP_STORED)


CORPUS = {
    "zip-slip": (lambda: zip_bytes([("weather/SKILL.md", b"x"), ("weather/../../x", b"pwned")]), "'..'"),
    "zip-slip-top": (lambda: zip_bytes([("../x", b"pwned")]), "'..'"),
    "absolute": (lambda: zip_bytes([("/etc/caldera-pwned", b"x")]), "absolute path"),
    "symlink": (lambda: zip_bytes([("w/SKILL.md", b"x"), ("w/etc", b"/etc", stat.S_IFLNK | 0o777)]), "a symlink"),
    "hard-link": (_shared_data_zip, "shares its data"),
    "duplicate-name": (lambda: zip_bytes([("w/a", b"1"), ("w/a", b"2")]), "appears twice"),
    "device": (lambda: zip_bytes([("w/null", b"", stat.S_IFCHR | 0o666)]), "character device"),
    "two-top-dirs": (lambda: zip_bytes([("a/SKILL.md", b"x"), ("b/SKILL.md", b"y")]), "second top-level"),
    "loose-file": (lambda: zip_bytes([("SKILL.md", b"x")]), "loose file"),
    "zip-bomb": (_bomb, "compression ratio"),
    "too-many-members": (_many, "more than 10000"),
    "truncated": (lambda: zip_bytes(GOOD)[:120], "not a readable zip"),
    "not-a-zip": (lambda: b"<html>oops</html>", "not a readable zip"),
}


@pytest.fixture
def installed(tmp_path, wire):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("must survive")
    runtime = FakeRuntime(tmp_path, base_url=wire.url)
    wire.route("GET", f"{API}/skills/versions/ver_1/download", body=zip_bytes(GOOD), status=200, times=1)
    result = run(runtime, "install_skill", {"skill_id": "skill_3", "skill_version": "ver_1",
                                            "target_name": "weather", "content_md5": GOOD_MD5})
    return runtime, result


def test_good_install(installed, tmp_path):
    runtime, result = installed
    target = runtime.paths.state_dir / "skills" / "weather"
    assert result["install_path"] == str(target)
    assert (result["skill_id"], result["skill_version"], result["content_md5"]) == ("skill_3", "ver_1", GOOD_MD5)
    assert (target / "src" / "main.py").read_bytes() == GOOD[2][1]
    assert md5.content_md5_dir(target) == GOOD_MD5  # the install record is hidden: not in the fingerprint
    body = runtime.inventories()[-1]
    assert body["mode"] == "full"
    [record] = body["skills"]
    assert record["source"] == "injected_by_clawmanager"
    assert (record["skill_id"], record["skill_version"], record["identifier"]) == ("skill_3", "ver_1", "weather")
    assert runtime.skill_count == 1
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".caldera-staging")]


@pytest.mark.filterwarnings("ignore:Duplicate name")
@pytest.mark.parametrize("case", sorted(CORPUS))
def test_hostile_archive_refused(installed, tmp_path, wire, case):
    runtime, _ = installed
    build, needle = CORPUS[case]
    before = snapshot(tmp_path)
    wire.route("GET", f"{API}/skills/versions/ver_2/download", body=build(), status=200)
    with pytest.raises(CommandError) as err:
        run(runtime, "update_skill", {"skill_version": "ver_2", "target_name": "weather"})
    assert needle in str(err.value)
    assert snapshot(tmp_path) == before  # nothing inside or outside the roots touched; old version intact
    assert not (tmp_path.parent / "x").exists()


def test_md5_mismatch_keeps_old_version(installed, tmp_path, wire):
    runtime, _ = installed
    before = snapshot(tmp_path)
    new = [("weather/SKILL.md", b"v2\n")]
    wire.route("GET", f"{API}/skills/versions/ver_2/download", body=zip_bytes(new), status=200)
    with pytest.raises(CommandError, match="content_md5 mismatch"):
        run(runtime, "update_skill", {"skill_version": "ver_2", "target_name": "weather", "content_md5": "0" * 32})
    assert snapshot(tmp_path) == before


def test_update_replaces_atomically(installed, tmp_path, wire):
    runtime, _ = installed
    new = [("renamed-top/SKILL.md", b"v2\n")]
    wire.route("GET", f"{API}/skills/versions/ver_2/download", body=zip_bytes(new), status=200)
    result = run(runtime, "update_skill", {"skill_version": "ver_2", "target_name": "weather",
                                           "content_md5": content_md5_mapping({"SKILL.md": b"v2\n"})})
    target = runtime.paths.state_dir / "skills" / "weather"
    assert result["replaced"] is True
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == ["SKILL.md"]
    assert sorted(p.name for p in target.parent.iterdir()) == [".caldera-lock", "weather"]


def test_download_failure_and_missing_version(installed, tmp_path, wire):
    runtime, _ = installed
    before = snapshot(tmp_path)
    wire.route("GET", f"{API}/skills/versions/ver_9/download", status=500,
               json={"success": False, "error": "skill version not found"})
    with pytest.raises(CommandError, match="downloading skill version ver_9 failed"):
        run(runtime, "install_skill", {"skill_version": "ver_9", "target_name": "weather"})
    with pytest.raises(CommandError, match="needs skill_version"):
        run(runtime, "install_skill", {"target_name": "weather"})
    assert snapshot(tmp_path) == before


def test_ratio_is_judged_across_members_too(tmp_path):
    # 40 members of 100 KiB zeros: each under the per-member floor, together a bomb.
    import zipfile as _zf

    from caldera.skills import archive as _archive

    path = tmp_path / "bomb.zip"
    with _zf.ZipFile(path, "w", _zf.ZIP_DEFLATED) as zf:
        zf.writestr("alpha/SKILL.md", "# alpha\n")
        for n in range(40):
            zf.writestr(f"alpha/data/{n}.bin", b"\0" * (100 * 1024))
    with _archive.open_archive(path) as zf:
        with pytest.raises(_archive.ArchiveError, match="ratio across its members"):
            _archive.check(zf)
