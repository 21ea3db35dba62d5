"""Skills against ClawManager's real server rules (clawmanager-notes section 9) and a
failing plane (issue 13): one-shot commands retried within their timeout, upload
skill_id only as skill_<n>, SKILL.md checked first, archive metadata out of md5 and
zip, Unicode names reported, column limits, one timestamp format, URL path values."""
import time
import zipfile

import pytest
import skills_helpers
from core_helpers import replaced
from fault_helpers import FaultPlane
from skills_helpers import (
    FakeRuntime,
    content_md5_mapping,
    content_md5_zip,
    ctx,
    multipart_fields,
    write_tree,
    zip_bytes,
)

from caldera.daemon import dispatch
from caldera.errors import CommandError
from caldera.skills import inventory, md5, package


@pytest.fixture
def served(tmp_path, monkeypatch):
    plane = FaultPlane().start()
    monkeypatch.setattr(skills_helpers, "BASE", plane.url)
    yield plane, FakeRuntime(tmp_path)
    plane.stop()


def run_timed(rt, command_type, payload, seconds=60):
    """Like skills_helpers.run, with the command's own deadline (the executor gives one)."""
    context = replaced(ctx(rt, command_type), deadline=time.monotonic() + seconds)
    return dispatch.routes()[command_type].handler()(context, payload)


def uploads(plane):
    return [multipart_fields(r.body, r.headers["Content-Type"]) for r in plane.seen(r"/skills/upload$")]


# ------------------------------------------------------------------ 8. transient errors retried inside the command

def test_install_outlasts_transient_errors_within_its_timeout(served):
    plane, rt = served
    files = {"SKILL.md": b"# calc\n"}
    plane.downloads["ver_4"] = zip_bytes([(f"calc/{k}", v) for k, v in files.items()])
    plane.fault(r"/versions/ver_4/download$", status=502, body=b"bad gateway")
    plane.fault(r"/versions/ver_4/download$", status=429, body=b'{"error":"slow"}', headers={"Retry-After": "1"})
    result = run_timed(rt, "install_skill", {"skill_id": "skill_4", "skill_version": "ver_4", "target_name": "calc",
                                             "content_md5": content_md5_mapping(files)})
    assert result["target_name"] == "calc" and len(plane.seen(r"/download$")) == 3


def test_a_refusal_is_not_retried_and_time_runs_out_for_transients(served):
    plane, rt = served
    plane.fault(r"/download$", status=404, body=b'{"success":false,"error":"skill version not found"}')
    with pytest.raises(CommandError, match="not found"):
        run_timed(rt, "install_skill", {"skill_version": "ver_9", "target_name": "x"})
    assert len(plane.seen(r"/download$")) == 1
    plane.fault(r"/download$", status=503, body=b"down", times=None)
    with pytest.raises(CommandError, match="503"):
        run_timed(rt, "install_skill", {"skill_version": "ver_9", "target_name": "x"}, seconds=0.5)


def test_collect_skill_package_retries_an_upload_cut_by_a_500(served, tmp_path):
    plane, rt = served
    write_tree(rt.paths.state_dir / "skills" / "notes", {"SKILL.md": "# notes\n", "a.txt": "a"})
    plane.fault(r"/skills/upload$", status=500, body=b'{"success":false,"error":"db gone"}')
    result = run_timed(rt, "collect_skill_package", {"identifier": "notes"})
    assert result["uploaded"]["external_skill_id"] == "skill_1" and len(uploads(plane)) == 2


# ------------------------------------------------------------------ 9. what the server rules demand

@pytest.mark.parametrize("given, sent", [("2fa-helper", None), ("skill_12", "skill_12"), (12, "skill_12"),
                                         (None, None)])
def test_upload_skill_id_only_as_skill_n(served, given, sent):
    plane, rt = served
    write_tree(rt.paths.state_dir / "skills" / "helper", {"SKILL.md": "# h\n"})
    payload = {"identifier": "helper", **({"skill_id": given} if given is not None else {})}
    run_timed(rt, "collect_skill_package", payload)
    [form] = uploads(plane)
    assert (form["skill_id"][1].decode() if "skill_id" in form else None) == sent


def test_a_skill_without_skill_md_is_refused_before_the_upload(served):
    plane, rt = served
    write_tree(rt.paths.state_dir / "skills" / "tools", {"skill.json": '{"name": "tools"}', "t.py": "x"})
    with pytest.raises(CommandError, match="no SKILL.md"):
        run_timed(rt, "collect_skill_package", {"identifier": "tools"})
    assert plane.seen(r"/skills/upload$") == []
    write_tree(rt.paths.state_dir / "skills" / "lower", {"skill.md": "# lower case is fine\n"})
    run_timed(rt, "collect_skill_package", {"identifier": "lower"})


def test_archive_metadata_is_out_of_md5_and_zip(tmp_path):
    clean = write_tree(tmp_path / "a" / "s", {"SKILL.md": "# s\n", "sub/x.txt": "x"})
    dirty = write_tree(tmp_path / "b" / "s", {"SKILL.md": "# s\n", "sub/x.txt": "x", "Thumbs.db": "t",
                                              "sub/Thumbs.db": "t", "__MACOSX/._SKILL.md": "m", "._SKILL.md": "m",
                                              ".DS_Store": "d"})
    assert md5.content_md5_dir(dirty) == md5.content_md5_dir(clean)
    zip_path, digest, count = package.build(dirty, tmp_path)
    names = zipfile.ZipFile(zip_path).namelist()
    assert sorted(names) == ["s/SKILL.md", "s/sub/x.txt"] and count == 2 and digest == md5.content_md5_dir(clean)
    # a zip made on a Mac hashes (and unpacks) as the server sees it
    mac = tmp_path / "mac.zip"
    mac.write_bytes(zip_bytes([("s/SKILL.md", b"# s\n"), ("s/sub/x.txt", b"x"), ("__MACOSX/s/._SKILL.md", b"m"),
                               ("s/Thumbs.db", b"t")]))
    assert content_md5_zip(mac) == md5.content_md5_dir(clean)


def test_unicode_names_are_reported_and_long_names_left_out(tmp_path):
    root = tmp_path / "state"
    write_tree(root / "skills" / "天气", {"SKILL.md": "# weather\n"})
    write_tree(root / "skills" / "Überblick Notizen", {"SKILL.md": "# notes\n"})
    write_tree(root / "skills" / ("k" * 101), {"SKILL.md": "# long key\n"})
    write_tree(root / "skills" / ("x-" * 60 + "y"), {"SKILL.md": "# long identifier\n"})
    scan = inventory.Inventory(root).scan()
    assert sorted(r["identifier"] for r in scan.records) == ["Überblick Notizen", "天气"]
    assert inventory.skill_key("Überblick Notizen") == "überblick-notizen" and inventory.skill_key("天气") == "天气"
    assert any("too long" in p for p in scan.problems)
    body = inventory.body("a", scan, "test")
    assert body["reported_at"].endswith("Z") and all(r["collected_at"].endswith("Z") for r in body["skills"])


def test_install_refuses_a_skill_version_that_is_not_a_version(served):
    plane, rt = served
    with pytest.raises(CommandError, match="refused to put .* in a URL"):
        run_timed(rt, "install_skill", {"skill_version": "../../plane/api/agents", "target_name": "x"})
    assert plane.requests == []


def test_metadata_files_in_a_download_do_not_break_the_install(served):
    plane, rt = served
    files = {"SKILL.md": b"# calc\n"}
    plane.downloads["ver_5"] = zip_bytes([("calc/SKILL.md", b"# calc\n"), ("__MACOSX/calc/._SKILL.md", b"m"),
                                          ("calc/Thumbs.db", b"t")])
    result = run_timed(rt, "install_skill", {"skill_version": "ver_5", "target_name": "calc",
                                             "content_md5": content_md5_mapping(files)})
    installed = rt.paths.state_dir / "skills" / "calc"
    assert result["content_md5"] == content_md5_mapping(files) and not (installed / "Thumbs.db").exists()


def test_apply_config_revision_outlasts_a_502(served):
    import hashlib

    plane, rt = served
    content = b'{"mode":"none","resources":[],"schemaVersion":1}'
    checksum = "sha256:" + hashlib.sha256(content).hexdigest()
    good = b'{"success":true,"data":{"revision":{"id":5,"revision_no":1,"checksum":"%s","content":%s}}}' % (
        checksum.encode(), content)
    plane.fault(r"/config/revisions/5$", status=502, body=b"bad gateway")
    plane.fault(r"/config/revisions/5$", body=good)
    result = run_timed(rt, "apply_config_revision", {"revision_id": 5, "snapshot_id": 1})
    assert result["current_config_revision_id"] == 5 and len(plane.seen(r"/config/revisions/5$")) == 2
