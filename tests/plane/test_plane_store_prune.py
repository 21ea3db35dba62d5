"""What the plane keeps (issue 16): a bounded inventory history, and old rows pruned by age and count."""
import pytest
from plane_helpers import inventories, inventory

from caldera.plane import store as store_mod
from caldera.plane.store import Store

DAY = 86400.0


class Clock:
    def __init__(self, now=1_800_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def make_store(tmp_path):
    """Store(clock) with instance 1 registered; closed after the test (Python 3.13 warns
    about a garbage-collected open sqlite3 connection)."""
    made = []

    def make(clock):
        s = Store(tmp_path / "plane.db", clock=clock)
        made.append(s)
        s.add_instance(1, "boot-token-1")
        s.register(1, {"agent_id": "a", "agent_version": "1", "protocol_version": "v1"}, None)
        return s

    yield make
    for s in made:
        s.close()


def _inventory(n):
    return {"agent_id": "a", "mode": "full", "skills": [
        {"identifier": f"s{n}", "content_md5": f"{n:032x}", "source": "discovered_in_instance"}]}


def test_inventory_history_is_the_latest_and_nineteen_before(make_store):
    s = make_store(Clock())
    for n in range(25):
        s.skills_inventory(1, _inventory(n), collect_packages=False)
    kept = inventories(s, 1)
    assert len(kept) == store_mod.INVENTORIES_KEPT == 20
    assert kept[-1]["body"]["skills"][0]["identifier"] == "s24"
    assert inventory(s, 1)["skills"][0]["identifier"] == "s24"


def test_prune_drops_old_finished_commands_and_reports_but_never_the_newest_or_pending(make_store):
    clock = Clock()
    s = make_store(clock)
    old_done = s.enqueue(1, "noop")
    s.finish_command(1, old_done, "succeeded", {}, None, clock.now)
    old_pending = s.enqueue(1, "noop")
    s.state_report(1, {"runtime": {}}, None)
    s.skills_inventory(1, _inventory(1), collect_packages=False)
    clock.now += 8 * DAY
    s.state_report(1, {"runtime": {}}, None)
    fresh_done = s.enqueue(1, "noop")
    s.finish_command(1, fresh_done, "failed", {}, "x", clock.now)
    gone = s.prune()
    assert gone["commands"] == 1 and gone["reports"] == 1 and gone["inventories"] == 0  # the only one is newest
    ids = [c["id"] for c in s.commands(1)]
    assert old_done not in ids and old_pending in ids and fresh_done in ids
    assert len(s.reports(1)) == 1 and inventory(s, 1) is not None


def test_prune_keeps_at_most_the_newest_finished_commands(make_store, monkeypatch):
    monkeypatch.setattr(store_mod, "COMMANDS_KEPT", 3)
    clock = Clock()
    s = make_store(clock)
    done = []
    for _ in range(5):
        cid = s.enqueue(1, "noop")
        s.finish_command(1, cid, "succeeded", {}, None, clock.now)
        done.append(cid)
    assert s.prune()["commands"] == 2
    assert [c["id"] for c in s.commands(1)] == done[2:]


def test_heartbeats_prune_now_and_then(make_store):
    clock = Clock()
    s = make_store(clock)
    cid = s.enqueue(1, "noop")
    s.finish_command(1, cid, "succeeded", {}, None, clock.now)
    s.heartbeat(1, {})  # prunes (first time), nothing old yet
    clock.now += 8 * DAY
    s.heartbeat(1, {})  # five minutes passed: prunes again, the command is a week old
    assert s.commands(1) == []
