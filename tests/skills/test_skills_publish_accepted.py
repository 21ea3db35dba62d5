"""An inventory goes out only when it differs from the last one the plane accepted (issue 16)."""
from skills_helpers import FakeRuntime, write_tree

from caldera.skills import publish, watcher


def _skill(rt, name, text="hello"):
    write_tree(rt.paths.state_dir / "skills" / name, {"SKILL.md": f"---\nname: {name}\n---\n{text}\n"})


def _accept_all(rt):
    """What the sender does after each 2xx (the line the lead adds to daemon/sender.flush)."""
    for name, item in rt.outbox.items():
        publish.delivered(rt.outbox.dir, item)
        rt.outbox.done(name)


def test_unchanged_after_acceptance_sends_nothing(tmp_path):
    rt = FakeRuntime(tmp_path)
    _skill(rt, "alpha")
    _, body = rt.publisher.scan_and_send_if_changed("startup")
    assert body is not None and len(rt.inventories()) == 1
    _accept_all(rt)
    _, again = rt.publisher.scan_and_send_if_changed("startup")
    assert again is None and rt.inventories() == []
    assert rt.skill_count == 1  # the count still reaches the heartbeats


def test_not_yet_accepted_is_sent_again(tmp_path):
    rt = FakeRuntime(tmp_path)
    _skill(rt, "alpha")
    rt.publisher.scan_and_send_if_changed("startup")
    # delivery failed (plane down): nothing accepted, so the next run queues it again
    _, body = rt.publisher.scan_and_send_if_changed("startup")
    assert body is not None and len(rt.inventories()) == 1  # the newer one supersedes the waiting one


def test_a_change_after_acceptance_is_sent(tmp_path):
    rt = FakeRuntime(tmp_path)
    _skill(rt, "alpha")
    rt.publisher.scan_and_send_if_changed("startup")
    _accept_all(rt)
    _skill(rt, "alpha", text="changed")
    _, body = rt.publisher.scan_and_send_if_changed("startup")
    assert body is not None and [s["identifier"] for s in body["skills"]] == ["alpha"]


def test_delivered_ignores_other_kinds_and_items_without_digest(tmp_path):
    publish.delivered(tmp_path, {"kind": "finish", "digest": "x"})
    publish.delivered(tmp_path, {"kind": "inventory"})
    assert publish.accepted_digest(tmp_path) is None
    publish.delivered(tmp_path, {"kind": "inventory", "digest": "full:abc"})
    assert publish.accepted_digest(tmp_path) == "full:abc"


def test_watcher_startup_skips_an_accepted_inventory_but_a_command_always_sends(tmp_path):
    rt = FakeRuntime(tmp_path)
    _skill(rt, "alpha")
    scanner = rt.publisher.scanner()
    assert watcher.check_once(rt.publisher, scanner, "startup") is True
    _accept_all(rt)
    assert watcher.check_once(rt.publisher, scanner, "startup") is False
    assert watcher.check_once(rt.publisher, scanner, "change") is False
    assert watcher.check_once(rt.publisher, scanner, "command") is True


def test_a_planted_link_is_not_read_as_the_accepted_digest(tmp_path):
    (tmp_path / "elsewhere").write_text("full:forged")
    (tmp_path / publish.ACCEPTED_FILE).symlink_to(tmp_path / "elsewhere")
    assert publish.accepted_digest(tmp_path) is None
