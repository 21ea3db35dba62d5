"""Inventory records, remove/disable/quarantine/handle_skill_risk (idempotent),
collect_skill_package (multipart upload of exactly the fingerprinted files), the watcher."""
import io
import json
import os
import zipfile

import pytest
from fault_helpers import API
from skills_helpers import FakeRuntime, content_md5_zip, multipart_fields, run, write_tree

from caldera.errors import CommandError
from caldera.skills import inventory, md5, watcher


@pytest.fixture
def rt(tmp_path, wire):
    extra = tmp_path / "agent-skills"
    runtime = FakeRuntime(tmp_path, env={"CALDERA_SKILL_DIRS": f"{extra}:relative/dir"}, base_url=wire.url)
    skills = runtime.paths.state_dir / "skills"
    write_tree(skills / "notes", {"SKILL.md": "---\nname: Notes\nversion: 2.0.1\n---\nbody\n", "run.sh": "echo\n"})
    os.chmod(skills / "notes" / "run.sh", 0o755)
    write_tree(extra / "category" / "weather",
               {"SKILL.md": "Weather.\n", "skill.json": '{"id": "wx", "version": "0.3"}', "a.py": "A\n"})
    write_tree(extra / "plain", {"SKILL.md": "No front matter.\n", "x.txt": "x"})
    return runtime


def test_inventory_records(rt):
    scan = inventory.Inventory(rt.paths.state_dir, rt.settings.env, "caldera").scan()
    assert scan.complete
    by_id = {r["identifier"]: r for r in scan.records}
    assert sorted(by_id) == ["notes", "plain", "weather"]  # the category folder is not a skill
    notes = by_id["notes"]
    assert (notes["skill_id"], notes["skill_version"], notes["source"]) == ("Notes", "2.0.1", "discovered_in_instance")
    assert notes["content_md5"] == md5.content_md5_dir(notes["install_path"])
    assert (notes["file_count"], notes["size_bytes"]) == (2, len("---\nname: Notes\nversion: 2.0.1\n---\nbody\n") + 5)
    assert notes["metadata"]["runtime_type"] == "caldera" and notes["metadata"]["status"] == "active"
    assert (by_id["weather"]["skill_id"], by_id["weather"]["skill_version"]) == ("wx", "0.3")
    assert (by_id["plain"]["skill_id"], by_id["plain"]["skill_version"]) == ("plain", "0.0.0")
    assert any("relative/dir" in p for p in scan.problems)


def test_second_scan_hashes_only_changes(rt):
    inv = inventory.Inventory(rt.paths.state_dir, rt.settings.env, "caldera")
    assert inv.scan().hashed == 3
    again = inventory.Inventory(rt.paths.state_dir, rt.settings.env, "caldera")  # from the persisted cache
    assert again.scan().hashed == 0
    path = rt.paths.state_dir / "skills" / "notes" / "run.sh"
    path.write_text("echo changed\n")
    scan = again.scan()
    assert scan.hashed == 1
    record = next(r for r in scan.records if r["identifier"] == "notes")
    assert record["content_md5"] == md5.content_md5_dir(path.parent)


def test_unreadable_root_is_not_full(rt, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    os.chmod(tmp_path / "agent-skills", 0)
    try:
        scan = inventory.Inventory(rt.paths.state_dir, rt.settings.env, "caldera").scan()
        assert not scan.complete and inventory.body("a", scan, "t")["mode"] == "incremental"
    finally:
        os.chmod(tmp_path / "agent-skills", 0o755)


def test_incomplete_scan_never_sends_full(rt, monkeypatch):
    real = md5.hash_skill  # the inventory walks and hashes a skill in one pass

    def failing(root, *args):
        if root.name == "plain":
            raise md5.ScanError(13, "cannot read directory: Permission denied", str(root))
        return real(root, *args)

    monkeypatch.setattr(md5, "hash_skill", failing)
    with pytest.raises(CommandError, match="incomplete"):
        run(rt, "sync_skill_inventory", {"trigger": "manual", "mode": "full"})
    [body] = rt.inventories()
    assert body["mode"] == "incremental" and len(body["skills"]) == 2


def test_sync_sends_full_and_supersedes(rt):
    result = run(rt, "sync_skill_inventory", {"trigger": "manual", "mode": "full"})
    run(rt, "refresh_skill_inventory", {})
    bodies = rt.inventories()
    assert len(bodies) == 1 and bodies[0]["mode"] == "full" and bodies[0]["trigger"] == "refresh_skill_inventory"
    assert result["skills"] == 3 and rt.skill_count == 3


def test_remove_is_idempotent(rt):
    first = run(rt, "uninstall_skill", {"target_name": "notes", "skill_id": 12})
    assert first["removed"] is True and not (rt.paths.state_dir / "skills" / "notes").exists()
    second = run(rt, "remove_skill", {"target_name": "notes"})
    assert second["removed"] is False and second["already_absent"] is True
    assert sorted(r["identifier"] for r in rt.inventories()[-1]["skills"]) == ["plain", "weather"]


def test_disable_then_left_out_of_the_inventory(rt):
    result = run(rt, "disable_skill", {"target_name": "weather"})
    dest = rt.paths.state_dir / "skills-disabled" / "weather"
    assert result["install_path"] == str(dest) and dest.is_dir()
    again = run(rt, "disable_skill", {"target_name": "weather"})
    assert again["already_disabled"] is True
    # the server upserts every listed skill `active`: a disabled one is not listed (docs/skills.md)
    sent = rt.inventories()[-1]
    assert sent["mode"] == "full" and all(r["identifier"] != "weather" for r in sent["skills"])
    assert rt.skill_count == 2
    record = next(r for r in rt.publisher.scanner().scan().records if r["identifier"] == "weather")
    assert record["metadata"]["status"] == "disabled"
    assert record["metadata"]["disabled_from"].endswith("category/weather")


def test_quarantine_moves_out_of_every_root_not_executable(rt):
    result = run(rt, "handle_skill_risk", {"action": "quarantine", "target_name": "notes"})
    q = result["quarantine_path"]
    assert q.startswith(str(rt.paths.state_dir / "quarantine"))
    assert not (rt.paths.state_dir / "skills" / "notes").exists()
    for base, _, files in os.walk(q):
        for f in files:
            assert not os.stat(os.path.join(base, f)).st_mode & 0o111
    assert "notes" not in [r["identifier"] for r in rt.inventories()[-1]["skills"]]
    again = run(rt, "quarantine_skill", {"target_name": "notes"})
    assert again["already_quarantined"] is True


def test_missing_names_are_said(rt):
    with pytest.raises(CommandError, match="give target_name .* or skill_id"):
        run(rt, "remove_skill", {})
    with pytest.raises(CommandError, match="single name"):
        run(rt, "remove_skill", {"target_name": "../etc"})
    with pytest.raises(CommandError, match="action must be one of"):
        run(rt, "handle_skill_risk", {"target_name": "notes"})
    with pytest.raises(CommandError, match="no skill 'ghost' to disable"):
        run(rt, "disable_skill", {"target_name": "ghost"})


def test_collect_skill_package_uploads_the_fingerprinted_files(rt, wire):
    notes = rt.paths.state_dir / "skills" / "notes"
    write_tree(notes, {".git/config": "secret", "sub/.env": "KEY=1"})
    os.symlink("/etc/passwd", notes / "passwd")
    expected = md5.content_md5_dir(notes)
    seen = {}

    def upload(request):
        seen.update(multipart_fields(request.body, request.headers["Content-Type"]))
        return 201, {}, json.dumps({"success": True, "data": {"id": 5, "external_skill_id": "skill_5"}})

    wire.route("POST", f"{API}/skills/upload", callback=upload)
    result = run(rt, "collect_skill_package", {"skill_id": "Notes", "skill_version": "2.0.1",
                                               "identifier": "notes", "content_md5": expected,
                                               "source": "discovered_in_instance"})
    assert result["content_md5"] == expected and result["uploaded"]["external_skill_id"] == "skill_5"
    filename, data = seen["file"]
    assert filename == "notes.zip"
    assert seen["content_md5"][1].decode() == expected and seen["agent_id"][1].decode() == "caldera-7-main"
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert sorted(names) == ["notes/SKILL.md", "notes/run.sh"]
    zpath = rt.paths.state_dir / "up.zip"
    zpath.write_bytes(data)
    assert content_md5_zip(zpath) == expected
    assert not list((rt.paths.state_dir / "cache").glob(".skill-package-*"))


def test_collect_refuses_a_changed_skill(rt):
    with pytest.raises(CommandError, match="no skill in the inventory"):
        run(rt, "collect_skill_package", {"content_md5": "0" * 32, "identifier": "ghost"})
    with pytest.raises(CommandError, match="changed since it was reported"):
        run(rt, "collect_skill_package", {"content_md5": "0" * 32, "identifier": "notes"})
    assert rt.inventory_wakeup.is_set()


def test_watcher_sends_on_start_and_on_change_only(rt):
    scanner = inventory.Inventory(rt.paths.state_dir, rt.settings.env, "caldera")
    assert watcher.check_once(rt.publisher, scanner, "startup") is True
    assert watcher.check_once(rt.publisher, scanner, "change") is False  # nothing changed: nothing sent
    (rt.paths.state_dir / "skills" / "notes" / "new.md").write_text("n")
    assert watcher.check_once(rt.publisher, scanner, "change") is True
    [body] = rt.inventories()
    assert body["mode"] == "full" and body["trigger"] == "change" and rt.skill_count == 3


def test_watcher_loop_stops(rt):
    rt.stop.set()
    watcher.skills_loop(rt.publisher, rt.wake, rt.live)  # returns at once on a set stop
    assert rt.inventories() == []


def test_interrupted_swap_is_recovered(rt):
    skills = rt.paths.state_dir / "skills"
    os.rename(skills / "notes", skills / ".caldera-old-notes")
    (skills / ".caldera-staging-abc").mkdir()
    rt.stop.set()
    from caldera.skills import store

    notes = store.recover(skills)
    assert (skills / "notes" / "SKILL.md").is_file() and not (skills / ".caldera-staging-abc").exists()
    assert notes and "restored" in notes[0]


def test_notifier_skips_stats_and_still_sees_changes(rt, monkeypatch):
    from caldera.skills import notify

    notifier = notify.Notifier.open()
    if notifier is None:
        pytest.skip("no inotify here")
    try:
        inv = inventory.Inventory(rt.paths.state_dir, rt.settings.env, "caldera", notifier=notifier)
        assert inv.scan().hashed == 3  # first scan: every signature checked, watches set
        real = inventory.signature
        calls = []
        def counting(path, files=None):
            if files is None:
                calls.append(path)  # a stat walk
            return real(path, files)

        monkeypatch.setattr(inventory, "signature", counting)
        assert inv.scan().hashed == 0 and calls == []  # nothing changed: no stat walk at all
        target = rt.paths.state_dir / "skills" / "notes" / "run.sh"
        with open(target, "r+b") as fh:  # in place, same size: only an event can tell
            fh.write(b"ECHO")
        (rt.paths.state_dir / "skills" / "notes" / "deep").mkdir()
        scan = inv.scan()
        assert scan.hashed == 1 and [p.name for p in calls] == ["notes"]
        record = next(r for r in scan.records if r["identifier"] == "notes")
        assert record["content_md5"] == md5.content_md5_dir(target.parent)
        (rt.paths.state_dir / "skills" / "notes" / "deep" / "new.txt").write_text("n")
        assert inv.scan().hashed == 1  # the new directory was watched after the rescan
    finally:
        notifier.close()


@pytest.mark.parametrize("plant", ["hardlink", "fifo"])
def test_collect_refuses_hard_links_and_special_files(rt, tmp_path, wire, plant):
    notes = rt.paths.state_dir / "skills" / "notes"
    if plant == "hardlink":
        outside = tmp_path / "credential.txt"  # a file the runtime may read, outside the skill
        outside.write_text("token=very-secret\n")
        os.link(outside, notes / "innocent.txt")
        expect = "'innocent.txt' is a hard link"
    else:
        os.mkfifo(notes / "pipe")
        expect = "'pipe' is a special file"
    expected = md5.content_md5_dir(notes)  # the fingerprint skips a FIFO and counts a hard link
    with pytest.raises(CommandError, match=expect):  # no upload may happen: no route is registered
        run(rt, "collect_skill_package", {"skill_id": "Notes", "skill_version": "2.0.1",
                                          "identifier": "notes", "content_md5": expected,
                                          "source": "discovered_in_instance"})
    assert not wire.requests
    assert not list((rt.paths.state_dir / "cache").glob(".skill-package-*"))


def test_package_refuses_a_file_swapped_after_the_walk(tmp_path):
    from caldera.skills import package

    skill = tmp_path / "notes"
    write_tree(skill, {"SKILL.md": "x\n"})
    entry = md5.collect_files(skill)[0]
    (skill / "SKILL.md").unlink()
    os.symlink("/etc/passwd", skill / "SKILL.md")  # swapped for a symlink: never followed
    with pytest.raises(package.PackageError, match="cannot open it as a regular file"):
        package._open_checked(entry)
