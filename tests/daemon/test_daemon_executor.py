import json
import os
import threading
import time

import pytest
from core_helpers import BOOT, install_agent, make_parts
from fault_helpers import API

from caldera.daemon import life
from caldera.daemon.executor import Executor, executor_for
from caldera.daemon.life import INTERRUPTED, life_for
from caldera.protocol.command import parse_command
from caldera.protocol.outbox import Outbox

BASE = "http://127.0.0.1:9"  # nothing listens: a test that talks to a plane asks for the `wire` fixture's


def ok(data=None):
    return {"success": True, "data": data}


@pytest.fixture
def runtime(caldera_env, request):
    install_agent(caldera_env, base_url=request.getfixturevalue("wire").url if "wire" in request.fixturenames else BASE)
    rt = make_parts(with_driver=False)
    yield rt
    rt.pool.shutdown(wait=False)


def finishes(rt):
    return [item for _, item in rt.outbox.items() if item["kind"] == "finish"]


def mock_plane(wire):
    wire.route("POST", API + "/register", json=ok({"session_token": "agt_sess_abcdef123"}), required=False)
    wire.route("POST", API + "/state/report", json=ok(), required=False)
    wire.route("POST", API + "/commands/1/start", body="{}", required=False)


def test_unknown_type_is_finished_failed(runtime, wire):
    mock_plane(wire)
    command = parse_command({"id": 1, "command_type": "make_coffee", "payload": {}})
    life_for(runtime).journal(command)
    assert life_for(runtime).run(command) == "failed"
    [finish] = finishes(runtime)
    assert finish["body"]["error_message"] == "unsupported command type: make_coffee"
    assert finish["body"]["status"] == "failed" and finish["command_id"] == 1
    assert runtime.state.get("commands") == {}
    assert wire.seen(r"/commands/1/start$")


def test_collect_system_info_reports_and_returns_summary(runtime, wire):
    mock_plane(wire)
    command = parse_command({"id": 1, "command_type": "collect_system_info", "payload": {}})
    life_for(runtime).journal(command)
    assert life_for(runtime).run(command) == "succeeded"
    [finish] = finishes(runtime)
    report = wire.seen(r"/state/report$")[0].json()
    assert finish["body"]["result"]["system_info"]["cpu"]["cores"] == report["system_info"]["cpu"]["cores"]
    assert report["runtime"]["current_config_revision_id"] is None
    assert "openclaw_pid" in report["runtime"]


def test_invalid_payload_is_refused_before_running(runtime, wire):
    mock_plane(wire)
    command = parse_command({"id": 1, "command_type": "collect_system_info", "payload": ["not", "an", "object"]})
    life_for(runtime).journal(command)
    life_for(runtime).run(command)
    [finish] = finishes(runtime)
    assert "invalid payload for collect_system_info" in finish["body"]["error_message"]
    assert not wire.seen(r"/state/report$")


def test_404_on_start_finishes_failed_without_running(runtime, wire):
    wire.route("POST", API + "/register", json=ok({"session_token": "agt_sess_abcdef123"}), required=False)
    wire.route("POST", API + "/commands/1/start", status=404, json={"success": False, "error": "no such command"},
               required=False)
    command = {"id": 1, "command_type": "collect_system_info", "payload": {}}
    life_for(runtime).journal(parse_command(command))
    life_for(runtime).run(parse_command(command))
    [finish] = finishes(runtime)
    assert "does not know this command" in finish["body"]["error_message"]
    assert not wire.seen(r"/state/report$")  # (and the fixture fails on a request no route answers)


def test_start_during_outage_is_queued_before_the_finish(runtime, wire):
    wire.route("POST", API + "/register", json=ok({"session_token": "agt_sess_abcdef123"}), required=False)
    wire.route("POST", API + "/commands/1/start", status=503, json={"success": False, "error": "down"},
               required=False)
    command = parse_command({"id": 1, "command_type": "make_coffee", "payload": {}})
    life_for(runtime).journal(command)
    life_for(runtime).run(command)
    kinds = [item["kind"] for _, item in runtime.outbox.items()]
    assert kinds == ["start", "finish"]


def test_timeout_kills_the_work_and_finishes_failed(runtime, monkeypatch):
    from caldera.daemon import dispatch as commands
    from caldera.host.proc import run
    from caldera.protocol.handlers import route

    seen = {}

    def slow(ctx, payload):
        seen["proc"] = run(["sleep", "30"], env={"PATH": "/bin:/usr/bin"}, timeout=60, stdout_cap=10,
                           cancel=ctx.cancel, grace=0.5)
        return {}

    table = commands.routes()
    table["slow_thing"] = route(lambda parts, call: call, lambda: slow)
    monkeypatch.setattr(commands, "routes", lambda: table)

    started = time.monotonic()
    command = parse_command({"id": 9, "command_type": "slow_thing", "timeout_seconds": 1})
    status, _, error = executor_for(runtime).run_handler(command)
    assert status == "failed" and error == "timed out after 1 s"
    assert time.monotonic() - started < 10
    assert seen["proc"].cancelled  # the subprocess was killed, not left running


def test_recovery_runs_unbegun_and_fails_interrupted_never_reruns(runtime):
    never_began = parse_command({"id": 11, "command_type": "collect_system_info", "payload": {}})
    began = parse_command({"id": 12, "command_type": "collect_system_info", "payload": {}})
    recorded = parse_command({"id": 13, "command_type": "collect_system_info", "payload": {}})
    for command in (never_began, began, recorded):
        life_for(runtime).journal(command)

    life_for(runtime)._journal_phase("12", "executing")
    life_for(runtime)._journal_phase("13", "executing")
    life_for(runtime)._put_finish(recorded, "succeeded", {"message": "done before the crash"}, "")
    to_run = life_for(runtime).recover()
    assert [c.id for c in to_run] == [11]
    by_id = {f["command_id"]: f["body"] for f in finishes(runtime)}
    assert by_id[12]["status"] == "failed" and by_id[12]["error_message"] == INTERRUPTED
    assert by_id[13]["status"] == "succeeded"
    assert set(runtime.state.get("commands")) == {"11"}


def test_a_finish_delivered_before_the_journal_was_cleared_is_not_finished_again(runtime):
    # kill -9 after the sender delivered the finish but before the executor's last journal
    # write: the restarted daemon must not send a second ("interrupted") finish for it.
    command = parse_command({"id": 21, "command_type": "collect_system_info", "payload": {}})
    life_for(runtime).journal(command)
    life_for(runtime)._journal_phase("21", "executing")
    life_for(runtime)._put_finish(command, "succeeded", {"message": "done"}, "")
    [(name, item)] = list(runtime.outbox.items())
    life.delivered(runtime.outbox, name, item)  # what the sender does when the plane took it
    assert life_for(runtime).recover() == []
    assert finishes(runtime) == [] and runtime.state.get("commands") == {}


def test_an_accepted_agent_run_is_known_to_interrupts_until_its_finish(runtime):
    command = parse_command({"id": 41, "command_type": "agent_run", "payload": {"run_id": "r-41"}})  # no prompt
    life_for(runtime).journal(command)
    assert runtime.runs.interrupt("r-41") == "queued"  # before its turn: not lost
    assert life_for(runtime).run(command) == "failed"
    assert runtime.runs.interrupt("r-41") is None  # finished: nothing waits for it any more


def test_the_sender_records_a_delivered_finish_and_deletes_it(tmp_path):
    from caldera.daemon.sender import flush

    class Plane:
        def __init__(self):
            self.finished = []

        def finish_command(self, command_id, body):
            self.finished.append(command_id)

    box, plane = Outbox(tmp_path / "outbox"), Plane()
    box.put("finish", {"command_id": 31, "body": {"status": "succeeded"}})
    assert flush(plane, box, threading.Event(), deadline=time.monotonic() + 5)
    assert plane.finished == [31] and box.depth() == 0
    assert box.has_finish(31) and box.has_finish("31")  # the journal's keys are strings


def _planted(directory, kind):
    record = directory / ".finishes-delivered"
    if kind == "fifo":
        os.mkfifo(record)
    elif kind == "directory":
        record.mkdir()
    elif kind == "link":
        os.symlink("/dev/zero", record)
    elif kind == "huge":
        record.write_bytes(b"[" + b"1," * 100_000 + b"1]")
    elif kind == "deep":
        record.write_bytes(b"[" * 100_000)
    elif kind == "not a list":
        record.write_bytes(b'{"1": true}')


@pytest.mark.parametrize("kind", ["fifo", "directory", "link", "huge", "deep", "not a list"])
def test_a_hostile_delivered_record_never_holds_up_a_finish(tmp_path, kind):
    # The record only saves a redundant finish: whatever sits at its name, the finish is
    # delivered once, leaves the outbox, and nothing waits on the file.
    from caldera.daemon.sender import flush

    class Plane:
        finished = []

        def finish_command(self, command_id, body):
            self.finished.append(command_id)

    directory = tmp_path / "outbox"
    directory.mkdir()
    _planted(directory, kind)
    box = Outbox(directory)
    box.put("finish", {"command_id": 7, "body": {}})
    box.put("finish", {"command_id": 8, "body": {}})
    done = threading.Event()  # in a thread: a record that blocks fails the test, never hangs it
    worker = threading.Thread(target=lambda: box.has_finish(7)
                              and flush(Plane(), box, threading.Event(), deadline=time.monotonic() + 5)
                              and done.set(), daemon=True)
    worker.start()
    worker.join(20)
    assert done.is_set() and Plane.finished == [7, 8] and box.depth() == 0


def test_the_outbox_sweeps_only_stale_temp_files(tmp_path):
    directory = tmp_path / "outbox"
    directory.mkdir()
    stale, fresh = directory / ".000000000004-finish.json.0a1b.tmp", directory / ".000000000005-finish.json.2c3d.tmp"
    stale.write_bytes(b"{")
    fresh.write_bytes(b"{")
    odd = directory / ".old-directory.tmp"  # not a file we wrote: left, and the outbox still opens
    odd.mkdir()
    for path in (stale, odd):
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    Outbox(directory)
    assert not stale.exists() and fresh.exists() and odd.is_dir()


def test_finish_results_are_redacted(runtime):

    life_for(runtime)._put_finish(parse_command({"id": 5}), "failed", {"echo": f"token={BOOT}"}, f"saw {BOOT}")
    [finish] = finishes(runtime)
    assert BOOT not in json.dumps(finish)


def test_outbox_bound_drops_inventories_never_finishes(tmp_path):
    box = Outbox(tmp_path / "outbox", max_items=5)
    for i in range(3):
        box.put("inventory", {"body": {"i": i}})
    for i in range(4):
        box.put("finish", {"command_id": i, "body": {}})
    kinds = [item["kind"] for _, item in box.items()]
    assert kinds.count("finish") == 4 and kinds.count("inventory") == 1 and box.dropped == 2
    for i in range(3):
        box.put("finish", {"command_id": 10 + i, "body": {}})
    assert [item["kind"] for _, item in box.items()].count("finish") == 7  # over the bound, still kept


def test_outbox_survives_reopen_in_order(tmp_path):
    box = Outbox(tmp_path / "outbox")
    names = [box.put("finish", {"command_id": i, "body": {}}) for i in range(3)]
    again = Outbox(tmp_path / "outbox")
    again.put("finish", {"command_id": 3, "body": {}})
    assert [item["command_id"] for _, item in again.items()] == [0, 1, 2, 3]
    assert names == sorted(names)


def test_a_journal_written_by_the_previous_version_is_recovered(runtime):
    # The journal keeps the plane's object verbatim: what an earlier runtime wrote parses again.
    runtime.state.set("commands", {
        "51": {"phase": "fetched", "command": {"id": 51, "command_type": "collect_system_info", "payload": {},
                                               "timeout_seconds": 60}, "fetched_at": "2026-01-01T00:00:00Z"},
        "52": {"phase": "executing", "command": {"id": 52, "command_type": "pause"},
               "fetched_at": "2026-01-01T00:00:00Z"},
        "53": {"phase": "executing", "command": ["not", "a", "command"]},  # settled by its key
    })
    [again] = life_for(runtime).recover()
    assert (again.id, again.type, again.timeout_seconds) == (51, "collect_system_info", 60.0)
    by_id = {f["command_id"]: f for f in finishes(runtime)}
    assert by_id[52]["body"]["error_message"] == INTERRUPTED and by_id[52]["command_type"] == "pause"
    assert by_id["53"]["body"]["error_message"] == INTERRUPTED
    assert set(runtime.state.get("commands")) == {"51"}


def test_a_command_that_cannot_be_named_is_logged_never_journaled(runtime, caplog):
    from caldera.daemon.poller import fetch_one

    class Plane:
        def next_command(self):
            return {"command_type": "pause", "payload": {}}, None

    assert fetch_one(Plane(), life_for(runtime)) is None
    assert "control plane sent an unusable command (a command without an id): " in caplog.text
    assert not runtime.state.get("commands")


def test_recovery_keeps_the_fetch_order_of_numeric_ids(runtime):
    """Ids sorted as text put "10" before "9": a backlog of fetched commands ran out of order."""
    for cid in (8, 9, 10, 11, "local-b", "local-a"):
        life_for(runtime).journal(parse_command({"id": cid, "command_type": "collect_system_info"}))
    assert [c.id for c in life_for(runtime).recover()] == [8, 9, 10, 11, "local-a", "local-b"]


def test_the_commands_deadline_bounds_every_request_its_handler_makes(runtime, monkeypatch):
    """A handler's request to a plane that accepts and never answers ends at the command's
    deadline (the executor's `client.within`), not at the client's own 30 s: the handler's
    thread is done by the time the executor has given up on it."""
    import socket

    from caldera.daemon import dispatch
    from caldera.protocol.client import ControlPlaneClient, Transport
    from caldera.protocol.handlers import route

    class Auth:
        bootstrap_token = "boot-token-for-tests-1234"
        agent_id = None  # bodies go out as built

        def token(self):
            return "agt_sess_test_token_1234"

        def renew(self, old):
            return old

    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    client = ControlPlaneClient(Transport(f"http://127.0.0.1:{silent.getsockname()[1]}"), Auth())
    ended = []

    def waits_on_the_plane(ctx, payload):
        try:
            client.state_report({})
        except Exception as exc:  # noqa: BLE001 -- what ended the request is the point
            ended.append(type(exc).__name__)
            raise

    table = dispatch.routes()
    table["slow_plane"] = route(lambda parts, call: call, lambda: waits_on_the_plane)
    monkeypatch.setattr(dispatch, "routes", lambda: table)
    monkeypatch.setattr("caldera.daemon.executor.CANCEL_GRACE", 3.0)
    executor = executor_for(runtime)
    executor = Executor(client=client, bind=executor.bind)
    try:
        status, _, error = executor.run_handler(parse_command({"id": 5, "command_type": "slow_plane",
                                                              "timeout_seconds": 1}))
    finally:
        silent.close()
    assert status == "failed"
    assert ended, f"the request was still waiting after the command's deadline and its grace ({error})"
