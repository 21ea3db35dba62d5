"""A full state dir (issue 26): heartbeats go on, nothing is taken that cannot be journaled,
commands keep their order, nothing accepted is lost, every command is finished once, and
the operator is told (the report's health, `caldera status`).

The disk is "full" through fsutil's temp-file step (every durable write of the state file
and the outbox goes through it), so the tests run as any user, without a tmpfs."""
import errno
import json
import logging
import os
import threading
import types

import pytest
from core_helpers import Args, install_agent, make_parts
from daemon_helpers import INSTANCE, wait_for
from fault_inject_helpers import Faulty, injected_bug
from plane_helpers import heartbeats

from caldera.cli import status
from caldera.config import agent_from_args
from caldera.daemon import lanes as lanes_module
from caldera.daemon import life as life_module
from caldera.daemon import sender
from caldera.daemon.heartbeat import ConnectionStatus, heartbeat_loop
from caldera.daemon.lanes import Lanes
from caldera.daemon.life import Life, life_for
from caldera.daemon.live import DROPS_KEY, LiveStatus
from caldera.daemon.poller import poll_loop
from caldera.daemon.sender import sender_loop
from caldera.daemon.wakeups import Wakeups
from caldera.host import fsutil
from caldera.host.statefile import StateFile
from caldera.host.storage import StorageHealth, free_space_problem
from caldera.protocol.client import Retryable
from caldera.protocol.command import parse_command
from caldera.protocol.outbox import Outbox
from caldera.redact import Redactor


class FullDisk:
    """Durable writes under `root` (whose path passes `which`) fail with ENOSPC while `full`."""

    def __init__(self, monkeypatch, root, which=lambda path: True):
        self.full, self.refused = False, 0
        real = fsutil._temp_beside

        def temp_beside(path):
            if self.full and root in path.parents and which(path):
                self.refused += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path)

        monkeypatch.setattr(fsutil, "_temp_beside", temp_beside)

    def refusals_after(self, n):
        """Wait until `n` more writes were refused than now (the loops tried again)."""
        start = self.refused
        wait_for(lambda: self.refused >= start + n, timeout=30, what=f"{n} more refused writes")


def _commands(plane):
    return {c["id"]: c for c in plane.store.commands(INSTANCE)}


class Loops:
    """The daemon's loops in this process, on `parts` (the plane's heartbeat and poll are 1 s)."""

    def __init__(self, parts):
        self.parts = parts
        client, auth = parts.connection()
        self.executor = life_for(parts)
        self.lanes = Lanes(self.executor, on_idle=parts.wake.poll.set)
        self.status = ConnectionStatus(parts.state, parts.redactor, auth)
        wake, live = parts.wake, parts.live
        bodies = [(heartbeat_loop, (client, auth, parts.reports, self.status, wake, live, lambda r: None)),
                  (poll_loop, (client, auth, self.executor, self.lanes, wake, live)),
                  (sender_loop, (client, parts.outbox, wake, live, parts.redactor))]
        self.lanes.start()
        self.threads = [threading.Thread(target=body, args=args, daemon=True) for body, args in bodies]
        for thread in self.threads:
            thread.start()

    def stop(self):
        self.parts.wake.shutdown()
        self.lanes.cancel.set()
        self.lanes.close(timeout=10)
        for thread in self.threads:
            thread.join(10)
        self.parts.pool.shutdown(wait=False)


@pytest.fixture
def connected(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    parts = make_parts(with_driver=False)
    loops = Loops(parts)
    wait_for(lambda: heartbeats(plane.store, INSTANCE), what="the first heartbeat")
    yield parts, loops
    loops.stop()


# ------------------------------------------------------------------ defect 1: the heartbeat

def test_heartbeats_go_on_while_the_state_dir_is_full_and_after(connected, plane, monkeypatch, caplog):
    parts, loops = connected
    disk = FullDisk(monkeypatch, parts.paths.state_dir)
    disk.full = True
    before = len(heartbeats(plane.store, INSTANCE))
    with caplog.at_level(logging.WARNING, logger="caldera.heartbeat"):
        wait_for(lambda: len(heartbeats(plane.store, INSTANCE)) >= before + 3, timeout=30,
                 what="heartbeats while the disk is full")
    assert all(t.is_alive() for t in loops.threads)
    # A heartbeat the plane took is no failure: no backoff, no traceback (the mirror's write is
    # best effort; when its ENOSPC escaped, each beat was counted failed and backed off 1, 2, 5 s...)
    lines = [r.getMessage() for r in caplog.records if r.name == "caldera.heartbeat"]
    assert [m for m in lines if "heartbeats go on" in m] and not [m for m in lines if "failed" in m], lines
    assert parts.state.storage.failure()["state"] == "full"
    disk.full = False
    during = len(heartbeats(plane.store, INSTANCE))
    wait_for(lambda: len(heartbeats(plane.store, INSTANCE)) >= during + 2, timeout=30, what="heartbeats after")
    wait_for(lambda: json.loads((parts.paths.state_dir / "state.json").read_text()).get("connection"),
             what="the connection mirror written again")
    assert parts.state.storage.failure() is None


# ------------------------------------------------------------------ defect 2: commands

def test_a_command_the_journal_refuses_is_finished_failed_and_later_ones_wait_in_order(connected, plane, monkeypatch):
    parts, loops = connected
    disk = FullDisk(monkeypatch, parts.paths.state_dir)
    fetch = parts.client.next_command

    def next_command():  # the disk fills between the plane's first answer and the journal's write
        raw, too_large = fetch()
        if raw and not fills:
            fills.append(raw["id"])
            disk.full = True
        return raw, too_large

    fills = []

    monkeypatch.setattr(parts.client, "next_command", next_command)
    first = plane.store.enqueue(INSTANCE, "collect_system_info")
    second = plane.store.enqueue(INSTANCE, "collect_system_info")
    wait_for(lambda: _commands(plane)[first]["status"] == "failed", timeout=30, what="the refused command failed")
    assert fills == [first]
    refused = _commands(plane)[first]
    assert "not run" in refused["error_message"] and "No space left on device" in refused["error_message"]
    disk.refusals_after(3)  # the poller probed the disk again and again meanwhile
    assert _commands(plane)[second]["status"] == "pending"  # not taken: it waits at the plane, in order
    assert str(first) not in (parts.state.get("commands") or {})  # memory is what the disk has
    disk.full = False
    wait_for(lambda: _commands(plane)[second]["status"] == "succeeded", timeout=30, what="the second command run")
    wait_for(lambda: parts.outbox.depth() == 0, what="the outbox empty")
    assert [_commands(plane)[c]["finish_count"] for c in (first, second)] == [1, 1]
    # nothing resurrects the refused command: the journal on disk has neither
    assert str(first) not in (StateFile(parts.paths.state_dir / "state.json").get("commands") or {})
    assert life_for(parts).recover() == []


def test_the_report_and_status_json_say_the_disk_is_full(connected, plane, monkeypatch):
    parts, loops = connected
    disk = FullDisk(monkeypatch, parts.paths.state_dir, which=lambda path: path.name != "status.json")
    parts.reports.state_report()  # its drop counters' mirror is written (reporter.py writes it when they change)
    disk.full = True
    disk.refusals_after(1)  # the heartbeat's connection mirror
    health = parts.reports.state_report()["health"]
    assert health["storage"]["state"] == "full" and health["storage"]["level"] == "bad"
    assert health["storage"]["error"] == "No space left on device"
    from caldera.daemon.snapshot import write_snapshot
    write_snapshot(parts)
    snap = json.loads((parts.paths.state_dir / "status.json").read_text())
    assert snap["storage"]["state"] == "full"
    disk.full = False
    wait_for(lambda: parts.state.storage.failure() is None, what="the record cleared by a write")
    assert "storage" not in parts.reports.state_report()["health"]


def test_every_report_while_full_says_so_when_the_drop_counts_differ_from_their_mirror(local_parts, monkeypatch):
    """The drop counters' state.json mirror was written inside the report: with a previous
    process's counts on disk (a restart into a full disk) every report raised ENOSPC, so no
    report said the disk was full for as long as it was."""
    parts = local_parts
    parts.state.set(DROPS_KEY, {name: 1 for name in parts.live.drops()})  # the last process dropped some
    disk = FullDisk(monkeypatch, parts.paths.state_dir)
    disk.full = True
    with pytest.raises(OSError):
        parts.state.set("connection", {})  # the heartbeat's mirror: the failed write is recorded
    for _ in range(3):  # every report while the disk stays full
        health = parts.reports.state_report()["health"]
        assert health["storage"]["state"] == "full" and health["dropped"] == parts.live.drops()
    disk.full = False
    parts.reports.state_report()
    assert parts.state.get(DROPS_KEY) == parts.live.drops()  # mirrored once there is space


# ------------------------------------------------------------------ the state file and the outbox

def test_a_failed_state_write_changes_nothing_in_memory_nor_later_on_disk(tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch, tmp_path)
    state = StateFile(tmp_path / "state.json")
    state.set("commands", {"1": {"phase": "fetched"}})
    disk.full = True
    with pytest.raises(OSError):
        state.update("commands", lambda j: {**j, "2": {"phase": "fetched"}})
    assert set(state.get("commands")) == {"1"}
    assert state.storage.failure()["state"] == "full"
    disk.full = False
    state.set("connection", {"ok": True})  # someone else's write, once there is space
    assert set(StateFile(tmp_path / "state.json").get("commands")) == {"1"}
    assert state.storage.failure() is None


def test_a_delivered_finish_that_cannot_be_recorded_stays_until_it_can(tmp_path, monkeypatch):
    # Deleting it would let a kill -9 before the journal's last write finish the command twice.
    disk = FullDisk(monkeypatch, tmp_path)
    box = Outbox(tmp_path / "outbox")
    name = box.put("finish", {"command_id": 5, "body": {"status": "succeeded"}})
    [(_, item)] = list(box.items())
    disk.full = True
    life_module.delivered(box, name, item)
    assert list(box.items()) == []  # not sent again
    assert box.has_finish(5) and box.depth() == 1  # a restart now settles it, never "interrupted"
    assert Outbox(tmp_path / "outbox").has_finish(5)
    disk.full = False
    assert list(box.items()) == [] and box.depth() == 0
    assert box.has_finish(5)  # by the record now


class Plane500:
    def __init__(self):
        self.calls = 0

    def finish_command(self, command_id, body):
        self.calls += 1
        raise Retryable(500, "internal server error (test)")


def test_a_held_finish_still_backs_off_while_its_retry_record_cannot_be_written(tmp_path, monkeypatch):
    """The retry record of a held item was dropped when the disk refused it: the item kept its
    old, passed `next_at`, and the sender tried it against a failing plane twice a second."""
    clock = [1000.0]
    outbox = Outbox(tmp_path / "outbox", clock=lambda: clock[0])
    outbox.put("finish", {"command_id": 7, "body": {"status": "succeeded"}})
    plane = Plane500()
    sender.flush(plane, outbox, threading.Event())  # held once, with space
    disk = FullDisk(monkeypatch, tmp_path)
    disk.full = True
    waits = []
    for _ in range(5):
        clock[0] += outbox.next_try_in() + 0.01  # the sender wakes when the item is due
        sender.flush(plane, outbox, threading.Event())
        waits.append(outbox.next_try_in())
    assert plane.calls == 6 and disk.refused >= 5
    assert waits == sorted(waits) and waits[-1] > 10  # the backoff grows: 2, 5, 10, 20, 40 s (±20 %)
    [(_, item)] = list(outbox.items())
    assert item["retry"]["attempts"] == 6
    disk.full = False
    clock[0] += outbox.next_try_in() + 0.01
    sender.flush(plane, outbox, threading.Event())
    assert json.loads(next((tmp_path / "outbox").glob("*.json")).read_text())["retry"]["attempts"] == 7  # on disk again


def test_retry_records_kept_in_memory_are_forgotten_once_their_items_are_gone(tmp_path, monkeypatch):
    clock = [1000.0]
    outbox = Outbox(tmp_path / "outbox", clock=lambda: clock[0])
    for command_id in range(1, 6):
        outbox.put("finish", {"command_id": command_id, "body": {"status": "succeeded"}})
    disk, plane = FullDisk(monkeypatch, tmp_path), Plane500()
    disk.full = True
    sender.flush(plane, outbox, threading.Event())  # each held, its record in memory only
    assert len(outbox._holds) == 5
    disk.full = False
    taken = []
    clock[0] += 3600
    assert sender.flush(types.SimpleNamespace(finish_command=lambda cid, body: taken.append(cid)), outbox,
                        threading.Event()) is True
    outbox.put("finish", {"command_id": 6, "body": {"status": "succeeded"}})
    sender.flush(plane, outbox, threading.Event())  # a later hold sweeps the records of items gone
    assert taken == [1, 2, 3, 4, 5] and list(outbox._holds) == []


def test_the_poller_stays_alive_for_the_watchdog_while_it_retries_a_refused_command(monkeypatch):
    """A full disk and a plane away at once: the failed finish of a command the journal refused
    is retried for minutes inside one poll turn, which never said it was alive: past 90 s the
    watchdog pings stop and systemd kills the unit."""
    monkeypatch.setattr(life_module, "Backoff", lambda: types.SimpleNamespace(after=lambda exc: 0.01))
    stop, tries, ticks = threading.Event(), [], []

    def finish_command(command_id, body):
        tries.append(command_id)
        if len(tries) == 4:
            stop.set()
        raise Retryable(None, "connection refused (test)")

    def update(key, func):
        raise OSError(errno.ENOSPC, "No space left on device")

    state = types.SimpleNamespace(path="/var/lib/caldera/a/state.json", update=update)
    life = Life(agent_id="a", client=types.SimpleNamespace(finish_command=finish_command), state=state,
                outbox=types.SimpleNamespace(put=Faulty(None, 99)), redactor=str, executor=None,
                report_now=lambda: None)
    taken = life.take(parse_command({"id": 81, "command_type": "pause", "payload": {}}), stop, None,
                      tick=lambda: ticks.append(1))
    assert not taken and life.states == {}  # refused: not handed on, not alive here
    assert len(tries) == 4 and len(ticks) == 4  # one tick per try, until the stop


# ------------------------------------------------------------------ the executor waits for space

@pytest.fixture
def local_parts(caldera_env):
    install_agent(caldera_env, base_url="http://127.0.0.1:9")
    parts = make_parts(with_driver=False)
    yield parts
    parts.pool.shutdown(wait=False)


def _execute_in_thread(executor, command):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("status", executor.run(command)), daemon=True)
    thread.start()
    return thread, out


def test_a_command_whose_executing_mark_cannot_be_written_waits_then_runs_once(local_parts, monkeypatch):
    parts = local_parts
    executor = life_for(parts)
    command = parse_command({"id": 61, "command_type": "make_coffee", "payload": {}})
    executor.journal(command)
    disk = FullDisk(monkeypatch, parts.paths.state_dir)
    disk.full = True
    thread, out = _execute_in_thread(executor, command)
    disk.refusals_after(2)
    assert parts.state.get("commands")["61"]["phase"] == "fetched" and parts.outbox.depth() == 0  # not begun
    disk.full = False
    thread.join(30)
    assert out["status"] == "failed"  # unsupported type: it ran (once)
    assert [i["command_id"] for _, i in parts.outbox.items() if i["kind"] == "finish"] == [61]
    assert parts.state.get("commands") == {}


def test_a_stop_while_waiting_for_space_keeps_the_command_for_the_next_start(local_parts, monkeypatch):
    parts = local_parts
    executor = life_for(parts)
    command = parse_command({"id": 62, "command_type": "make_coffee", "payload": {}})
    executor.journal(command)
    disk = FullDisk(monkeypatch, parts.paths.state_dir)
    disk.full = True
    thread, out = _execute_in_thread(executor, command)
    disk.refusals_after(1)
    parts.wake.shutdown()
    thread.join(30)
    assert out["status"] == "deferred" and parts.outbox.depth() == 0
    disk.full = False
    assert [c.id for c in life_for(parts).recover()] == [62]  # the next start runs it, once


def test_a_result_the_outbox_cannot_take_is_held_until_it_can(local_parts, monkeypatch):
    parts = local_parts
    executor = life_for(parts)
    command = parse_command({"id": 63, "command_type": "make_coffee", "payload": {}})
    executor.journal(command)
    disk = FullDisk(monkeypatch, parts.paths.state_dir, which=lambda path: path.parent.name == "outbox")
    disk.full = True
    thread, out = _execute_in_thread(executor, command)
    disk.refusals_after(3)  # the start's queueing (the plane is away) and the finish, tried again
    assert parts.state.get("commands")["63"]["phase"] == "executing" and parts.outbox.depth() == 0
    disk.full = False
    thread.join(30)
    finishes = [i for _, i in parts.outbox.items() if i["kind"] == "finish"]
    assert [f["command_id"] for f in finishes] == [63] and finishes[0]["body"]["status"] == "failed"
    assert parts.state.get("commands") == {}


def test_an_interrupted_command_found_while_full_is_finished_by_a_lane_once(local_parts, monkeypatch):
    parts = local_parts
    executor = life_for(parts)
    command = parse_command({"id": 64, "command_type": "collect_system_info", "payload": {}})
    executor.journal(command)
    executor._journal_phase("64", "executing")  # then a kill -9
    disk = FullDisk(monkeypatch, parts.paths.state_dir)
    disk.full = True
    [again] = executor.recover()  # the start must not fail: heartbeats begin
    assert again.id == 64 and again.refusal == "interrupted: runtime restarted"
    disk.full = False
    assert executor.run(again) == "failed"
    [finish] = [i for _, i in parts.outbox.items() if i["kind"] == "finish"]
    assert finish["body"]["error_message"] == "interrupted: runtime restarted"


# ------------------------------------------------------------------ a command whose execution raises

def _finishes(parts):
    return {i["command_id"]: i["body"] for _, i in parts.outbox.items() if i["kind"] == "finish"}


def _bug_for(monkeypatch, method, command_id, message):
    """Life.`method` raises RuntimeError(message) for that one command (a bug it meets)."""
    real = getattr(Life, method)

    def buggy(self, command, *args):
        if command.id == command_id:
            raise RuntimeError(message)
        return real(self, command, *args)

    monkeypatch.setattr(Life, method, buggy)


def _run_in_lanes(parts, executor, numbers, monkeypatch):
    monkeypatch.setattr(lanes_module, "LANE_BACKOFF", (0.05,))
    lanes = Lanes(executor, on_idle=lambda: None)
    lanes.start()
    try:
        for number in numbers:
            command = parse_command({"id": number, "command_type": "make_coffee", "payload": {}})
            executor.journal(command)
            lanes.submit(command)
        wait_for(lambda: set(_finishes(parts)) == set(numbers) and parts.state.get("commands") == {},
                 timeout=30, what="every command finished and out of the journal")
    finally:
        assert lanes.close(timeout=30)


def test_a_command_whose_execution_raises_is_finished_failed_at_once(local_parts, monkeypatch):
    """It stayed in the journal, `running` at the plane, until the next start (weeks, under
    systemd); now the lane finishes it failed, naming the bug by type and place, never by value."""
    executor = life_for(local_parts)
    _bug_for(monkeypatch, "_send_start", 71, "a bug holding sk-not-for-the-plane")
    _run_in_lanes(local_parts, executor, (71, 72), monkeypatch)
    broken, after = _finishes(local_parts)[71], _finishes(local_parts)[72]
    assert broken["status"] == "failed"
    assert broken["error_message"].startswith("internal error in the runtime: RuntimeError at test_daemon_diskfull.py:")
    assert "sk-not-for-the-plane" not in json.dumps(broken)
    assert after["status"] == "failed" and "make_coffee" in after["error_message"]  # the lane went on


def test_a_command_that_raises_after_its_finish_is_recorded_keeps_that_one_finish(local_parts, monkeypatch):
    executor = life_for(local_parts)
    monkeypatch.setattr(Life, "_remember", lambda *args: (_ for _ in ()).throw(RuntimeError("a bug")))
    _run_in_lanes(local_parts, executor, (73,), monkeypatch)
    [(_, item)] = [(n, i) for n, i in local_parts.outbox.items() if i["kind"] == "finish"]
    assert item["command_id"] == 73 and "make_coffee" in item["body"]["error_message"]  # its own, not a second


def test_settle_broken_sees_a_finish_the_sender_delivers_while_it_looks(local_parts):
    """execute() recorded command 91's `succeeded` finish, then raised: the lane settles it
    while the sender, woken by that very finish, delivers it. Looking at the delivered record
    first and the outbox after missed it when the delivery fell between the two looks, and a
    second finish, `failed`, went out."""
    parts = local_parts
    executor, outbox = life_for(parts), parts.outbox
    command = parse_command({"id": 91, "command_type": "collect_system_info", "payload": {}})
    executor.journal(command)
    executor._put_finish(command, "succeeded", {"ok": True}, "")  # execute's recorded finish
    sent = []
    plane = types.SimpleNamespace(finish_command=lambda cid, body: sent.append((cid, body["status"])))
    real_order = outbox.names_in_send_order

    def names_in_send_order():  # the sender delivers, records and removes it at this very moment
        outbox.names_in_send_order = real_order
        sender.flush(plane, outbox, threading.Event())
        return real_order()

    outbox.names_in_send_order = names_in_send_order
    # a life that does not hold it (as after a restart) asks the outbox whether its finish is recorded
    life_for(parts).fault(command, RuntimeError("a bug after the finish was recorded"))
    assert sent == [(91, "succeeded")]
    assert [i for _, i in outbox.items() if i.get("command_id") == 91] == []  # no second finish
    assert parts.state.get("commands") == {}


def test_a_command_a_poll_turn_journals_and_then_raises_on_is_finished_failed_at_once(local_parts, monkeypatch):
    """A bug after the journal's write (here in Life.journal's announcement; lanes.submit
    alike) escaped the poll turn: command 95 stayed dispatched at the plane and `fetched` in the
    journal, with no lane to run it, until the next start."""
    executor = life_for(local_parts)
    _bug_for(monkeypatch, "_announce", 95, "a bug after the journal write")
    plane = [{"id": 95, "command_type": "collect_system_info", "payload": {}},
             {"id": 96, "command_type": "collect_system_info", "payload": {}}]
    client = types.SimpleNamespace(next_command=lambda: (plane.pop(0), None) if plane else (None, None))
    submitted = []
    lanes = types.SimpleNamespace(ready=lambda: True, submit=lambda command: submitted.append(command.id))
    auth = types.SimpleNamespace(info=types.SimpleNamespace(poll_interval=0.05))
    wake = Wakeups()
    thread = threading.Thread(target=poll_loop, args=(client, auth, executor, lanes, wake, LiveStatus()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: 96 in submitted, timeout=30, what="the next command handed on")
    finally:
        wake.shutdown()
        thread.join(10)
    [finish] = [i for _, i in local_parts.outbox.items() if i.get("kind") == "finish"]
    assert finish["command_id"] == 95 and finish["body"]["status"] == "failed"
    assert finish["body"]["error_message"].startswith("internal error in the runtime: RuntimeError at")
    assert set(local_parts.state.get("commands")) == {"96"}  # 95 left the journal; 96 is the lane's


# ------------------------------------------------------------------ no loop dies of an exception

def test_the_heartbeat_loop_survives_an_exception_in_its_error_path(tmp_path, caplog):
    # The state write of the success path raises, then that of the error path: before issue 26
    # the second escaped the loop and the thread was gone for good.
    state = StateFile(tmp_path / "state.json")
    flaky = Faulty(state.set, 2, injected_bug)
    state.set, state.update = flaky, Faulty(state.update, 1, injected_bug)
    beats = []
    client = types.SimpleNamespace(heartbeat=lambda body: beats.append(body) or {})
    auth = types.SimpleNamespace(info=types.SimpleNamespace(heartbeat_interval=0.05), blocked_reason=None)
    reports = types.SimpleNamespace(heartbeat=lambda: {"agent_id": "a"})
    wake = Wakeups()
    status = ConnectionStatus(state, str, auth)
    thread = threading.Thread(target=heartbeat_loop, args=(client, auth, reports, status, wake, LiveStatus(),
                                                           lambda r: None), daemon=True)
    with caplog.at_level(logging.WARNING):
        thread.start()
        wait_for(lambda: len(beats) >= 4 and flaky.left == 0, timeout=30, what="heartbeats after the bug")
        wake.shutdown()
        thread.join(10)
    assert "heartbeat loop failed: RuntimeError: injected bug; retrying" in caplog.text
    guarded = [r for r in caplog.records if r.getMessage().startswith("heartbeat loop failed")]
    assert len(guarded) == 1 and "Traceback" in guarded[0].getMessage()  # the same bug again: DEBUG only
    assert state.get("connection")["last_error"] is None  # the mirror written once the bug passed


def test_the_poll_loop_survives_an_exception_and_logs_it_once_with_its_traceback(caplog):
    fetched = []
    ready = Faulty(lambda: True, 2, injected_bug)
    lanes = types.SimpleNamespace(ready=ready, submit=fetched.append)
    client = types.SimpleNamespace(next_command=Faulty(lambda: (None, None), 1, injected_bug))
    auth = types.SimpleNamespace(info=types.SimpleNamespace(poll_interval=0.05))
    executor = types.SimpleNamespace(state=types.SimpleNamespace(storage=StorageHealth()), redactor=str)
    wake = Wakeups()
    thread = threading.Thread(target=poll_loop, args=(client, auth, executor, lanes, wake, LiveStatus()), daemon=True)
    with caplog.at_level(logging.INFO):
        thread.start()
        wait_for(lambda: client.next_command.calls >= 3, timeout=30, what="polls after the bugs")
        wake.shutdown()
        thread.join(10)
    warnings = [r.getMessage() for r in caplog.records if r.name == "caldera.poller" and r.levelno == logging.WARNING]
    # three times the same bug (twice in ready(), once in the fetch): one line with its traceback
    assert len(warnings) == 1 and "command poll failed: RuntimeError: injected bug" in warnings[0]
    assert "Traceback" in warnings[0]
    assert "command poll works again after 3 failed turns" in caplog.text


# ------------------------------------------------------------------ caldera status

def test_caldera_status_counts_the_reserved_blocks_for_a_daemon_that_writes_as_root(caldera_env):
    """A container's daemon runs as root and writes into ext4's reserved blocks: its state dir
    (root's) is not full while they last; an agent account's is."""
    install_agent(caldera_env)
    paths = agent_from_args(Args(agent="demo"))
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    only_reserved = _statvfs(0, reserved=500)
    assert free_space_problem(paths.state_dir, only_reserved, as_root=True) is None
    assert free_space_problem(paths.state_dir, only_reserved, as_root=False) == "file system full (0 bytes free)"
    as_root = paths.state_dir.stat().st_uid == 0  # `caldera status` asks the state dir's owner
    doc = status.snapshot(paths, Redactor(), statvfs=only_reserved)
    assert (doc["storage"] is None) is as_root
    assert status.storage_info(paths, statvfs=only_reserved) == doc["storage"]



def _statvfs(free_blocks, flag=0, favail=1000, reserved=0):
    # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
    return lambda path: os.statvfs_result((4096, 4096, 2560, free_blocks + reserved, free_blocks, 1000, favail,
                                           favail, flag, 255))


@pytest.mark.parametrize("fs, says", [
    (_statvfs(0), "file system full (0 bytes free): commands are not fetched until there is space"),
    (_statvfs(100, favail=0), "file system full (no free inodes)"),
    (_statvfs(100, flag=os.ST_RDONLY), "read-only file system: commands are not fetched until it "
                                                     "takes writes again"),
])
def test_caldera_status_says_when_the_state_dir_cannot_be_written(caldera_env, fs, says):
    install_agent(caldera_env)
    paths = agent_from_args(Args(agent="demo"))
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    doc = status.snapshot(paths, Redactor(), statvfs=fs)
    assert f"state dir {paths.state_dir}: {says}" in status.render("demo", doc)
    assert doc["storage"]["state_dir"] == str(paths.state_dir)
    healthy = status.snapshot(paths, Redactor(), statvfs=_statvfs(100))
    assert healthy["storage"] is None and "state dir" not in status.render("demo", healthy)
