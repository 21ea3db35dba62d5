"""Small pure pieces of the plane: fingerprints, keys, Go-shaped JSON and times, presence."""
import pytest
from plane_helpers import compact_json

from caldera.plane import api, store, upload, validation


@pytest.mark.parametrize("files, md5", [
    ({}, "d41d8cd98f00b204e9800998ecf8427e"),
    ({"SKILL.md": b"hello\n"}, "bab02a68eaf254c164cf4d590bdd8693"),
    ({"src/main.py": b"print('hello')\n"}, "484c78266deda9cff6a07d6df6ce0cad"),
    ({"utils.py": b"A\n", "utils/a.py": b"B\n"}, "ae95bc697ef760b144d614f57b3bd33e"),
    ({"SKILL.md": b"hello\n", ".git/config": b"x", "docs/.hidden": b"y"}, "bab02a68eaf254c164cf4d590bdd8693"),
])
def test_content_md5_vectors_of_spec_section_9(files, md5):
    assert upload.content_md5(files) == md5


@pytest.mark.parametrize("identifier, key", [
    ("Vendor.Skill Name", "vendor-skill-name"), ("--a__b--", "a-b"), ("Ünï", "n"), ("", "0123456789abcdef")])
def test_skill_key_sanitising(identifier, key):
    assert store.skill_key(identifier, "0123456789abcdef0123") == key


def test_compact_json_is_go_marshal_shaped():
    assert compact_json({"b": "<&>", "a": [1, {"z": 1, "y": "é\u2028"}]}) == \
        '{"a":[1,{"y":"é\\u2028","z":1}],"b":"\\u003c\\u0026\\u003e"}'


def test_rfc3339_and_time_parsing_round_trip():
    text = api.rfc3339(1_800_000_000.25)
    assert text == "2027-01-15T08:00:00.25Z"
    assert validation.parse_time(text, "t") == pytest.approx(1_800_000_000.25)
    assert validation.parse_time("2027-01-15T09:00:00.000000001+01:00", "t") == pytest.approx(1_800_000_000.0)
    with pytest.raises(validation.BodyError):
        validation.parse_time("2027-13-15T09:00:00Z", "t")


def test_presence_thresholds():
    assert [store.presence(t, 1000.0) for t in (1000.0, 955.0, 954.0, 880.0, 879.0, None)] == \
        ["online", "online", "stale", "stale", "offline", "offline"]


def test_version_numbers():
    assert store.version_number("ver_34") == 34 == store.version_number("34")
    for bad in ("skill-version-34", "ver_", "ver_-1", ""):
        with pytest.raises(ValueError):
            store.version_number(bad)


def test_multipart_parsing_rejects_a_truncated_form():
    body = b'--B\r\nContent-Disposition: form-data; name="a"\r\n\r\nx\r\n--B--\r\n'
    assert upload.parse_multipart("multipart/form-data; boundary=B", body) == ({"a": "x"}, {})
    with pytest.raises(upload.UploadError):
        upload.parse_multipart("multipart/form-data; boundary=B", body[:-8])
    with pytest.raises(upload.UploadError):
        upload.parse_multipart("application/json", body)


def _open_paths() -> set[str]:
    import os

    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
    return found


def test_a_plane_that_cannot_listen_leaves_no_database_open(tmp_path):
    """The Store is opened before the port is bound: a port in use (or a file that is no
    database) must close it at once, not leave it to the garbage collector (Python 3.13
    warns about an unclosed connection at some later, unrelated point)."""
    import socket

    from caldera.plane.server import PlaneServer

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError) as failed:
            PlaneServer(tmp_path / "plane.db", port=busy.getsockname()[1])
    assert str(tmp_path / "plane.db") not in _open_paths(), "the database stays open behind the error"
    del failed
    (tmp_path / "junk.db").write_bytes(b"not a database, " * 512)
    with pytest.raises(store.sqlite3.DatabaseError) as failed:
        store.Store(tmp_path / "junk.db")
    assert "not a database" in str(failed.value)  # the error, still held, holds the Store's frame
    assert str(tmp_path / "junk.db") not in _open_paths()
