"""The client and the outbox against a failing or hostile control plane (issue 13):
a loopback plane with faults injected per endpoint (fault_helpers.FaultPlane)."""
import json
import threading

import pytest
from fault_helpers import API, FaultPlane

from caldera.daemon import sender
from caldera.protocol import client as client_mod
from caldera.protocol.client import (
    NEXT_CAP,
    ControlPlaneClient,
    Forbidden,
    Redirected,
    Retryable,
    Transport,
    Unaccepted,
    Unsendable,
    encode_body,
)
from caldera.protocol.outbox import Outbox, held_items, outbox_health
from caldera.protocol.session import Auth, SessionFile
from caldera.redact import Redactor

AGENT = "caldera-7-main"


@pytest.fixture
def plane():
    plane = FaultPlane().start()
    yield plane
    plane.stop()


def make_client(plane, tmp_path, agent_id=AGENT, **transport):
    transport = Transport(plane.url, **transport)
    sf = SessionFile(tmp_path / "session.json", plane.url, 7, agent_id)
    holder = {}
    auth = Auth(bootstrap_token="boot-token-xyz", session_file=sf,
                register=lambda: holder["client"].register({"instance_id": 7, "agent_id": agent_id}),
                redactor=Redactor())
    holder["client"] = client = ControlPlaneClient(transport, auth)
    return client


def finish_paths(plane):
    return [r.path for r in plane.seen(r"/finish$")]


# ------------------------------------------------------------------ 1. no finish lost, none blocks the rest

@pytest.mark.parametrize("fault", [
    {"status": 403, "body": b'{"success":false,"error":"Access denied"}'},
    {"status": 200, "body": b"<html>proxy</html>"},
    {"status": 200, "body": b'{"success":false,"error":"not now"}'},
    {"status": 500, "body": b'{"success":false,"error":"Data too long for column"}'},
    {"status": 404, "body": b"<html>not found</html>"},  # a proxy's 404 is not the plane speaking
    {"status": 307, "redirect": "http://127.0.0.1:9/elsewhere"},
])
def test_a_finish_not_taken_stays_held_and_the_next_one_goes(plane, tmp_path, fault):
    client = make_client(plane, tmp_path)
    outbox = Outbox(tmp_path / "outbox")
    outbox.put("finish", {"command_id": 1, "body": {"agent_id": AGENT, "status": "succeeded"}})
    outbox.put("finish", {"command_id": 2, "body": {"agent_id": AGENT, "status": "succeeded"}})
    plane.fault(API + "/commands/1/finish", times=None, **fault)
    sender.flush(client, outbox, threading.Event())
    assert finish_paths(plane) == [API + "/commands/1/finish", API + "/commands/2/finish"]
    [(name, item)] = list(outbox.items())  # 2 delivered; 1 kept, held back with its reason
    assert item["command_id"] == 1 and item["retry"]["attempts"] == 1
    assert not (outbox.dir / "rejected").exists()
    [held] = held_items(outbox.dir)
    assert held["command_id"] == 1 and held["reason"]
    assert outbox_health(outbox)["outbox"]["held_back"][0]["command_id"] == 1
    # held back: the next pass leaves it alone until its own backoff has passed
    sender.flush(client, outbox, threading.Event())
    assert len(plane.seen(r"/commands/1/finish$")) == 1


def test_a_bug_one_finish_meets_holds_it_back_and_the_rest_goes_on(plane, tmp_path, caplog):
    """An error no rule foresaw (a bug met by one item) stalled the whole outbox, pass after
    pass; now that item waits on its own backoff, named by type and place, never by value."""
    client = make_client(plane, tmp_path)
    real_finish = client.finish_command

    def finish(command_id, body):
        if command_id == 1:
            raise TypeError("secret-looking value sk-should-not-be-logged")
        return real_finish(command_id, body)

    client.finish_command = finish
    outbox = Outbox(tmp_path / "outbox")
    outbox.put("finish", {"command_id": 1, "body": {"agent_id": AGENT, "status": "succeeded"}})
    outbox.put("finish", {"command_id": 2, "body": {"agent_id": AGENT, "status": "succeeded"}})
    with caplog.at_level("DEBUG", logger="caldera"):
        assert sender.flush(client, outbox, threading.Event()) is False
    assert finish_paths(plane) == [API + "/commands/2/finish"]
    [(_, item)] = list(outbox.items())
    assert item["command_id"] == 1 and item["retry"]["attempts"] == 1
    [held] = held_items(outbox.dir)
    assert "unexpected TypeError at test_protocol_faults.py:" in held["reason"]
    assert "unexpected TypeError" in caplog.text and "sk-should-not-be-logged" not in caplog.text


def test_a_held_finish_survives_a_restart_and_goes_once_the_plane_takes_it(plane, tmp_path):
    client = make_client(plane, tmp_path)
    clock = [1000.0]
    outbox = Outbox(tmp_path / "outbox", clock=lambda: clock[0])
    outbox.put("finish", {"command_id": 1, "body": {"agent_id": AGENT, "status": "failed"}})
    plane.fault(API + "/commands/1/finish", status=500, body=b'{"success":false,"error":"db"}')
    sender.flush(client, outbox, threading.Event())
    restarted = Outbox(tmp_path / "outbox", clock=lambda: clock[0])  # a new process reads the hold
    sender.flush(client, restarted, threading.Event())
    assert len(plane.seen(r"/commands/1/finish$")) == 1 and restarted.depth() == 1
    clock[0] += 3600
    assert sender.flush(client, restarted, threading.Event()) is True
    assert len(plane.seen(r"/commands/1/finish$")) == 2


def test_a_404_from_the_plane_for_that_command_rejects_it(plane, tmp_path):
    client = make_client(plane, tmp_path)
    outbox = Outbox(tmp_path / "outbox")
    outbox.put("finish", {"command_id": 1, "body": {"agent_id": AGENT, "status": "failed"}})
    plane.fault(API + "/commands/1/finish", status=404, body=b'{"success":false,"error":"instance command not found"}')
    assert sender.flush(client, outbox, threading.Event()) is True
    assert "instance command not found" in next((outbox.dir / "rejected").glob("*.reason")).read_text()
    assert outbox.rejected == 1 and outbox_health(outbox)["outbox"]["rejected"] == 1


def test_a_400_is_answered_by_the_body_cut_to_what_the_server_accepts(plane, tmp_path):
    client = make_client(plane, tmp_path)
    outbox = Outbox(tmp_path / "outbox")
    huge = "x" * 100_000
    outbox.put("finish", {"command_id": 4, "body": {"agent_id": AGENT, "status": "failed", "result": {"r": huge},
                                                   "error_message": huge}})
    plane.fault(API + "/commands/4/finish", status=400, body=b'{"success":false,"error":"invalid request body"}')
    assert sender.flush(client, outbox, threading.Event()) is True
    first, second = plane.seen(r"/commands/4/finish$")
    cut = second.json()
    assert cut["status"] == "failed" and cut["result"]["cut"] is True
    assert len(cut["error_message"].encode()) <= 16 * 1024
    assert not (outbox.dir / "rejected").exists()


def test_results_go_before_inventories_and_a_held_start_keeps_its_finish_behind_it(plane, tmp_path):
    client = make_client(plane, tmp_path)
    outbox = Outbox(tmp_path / "outbox")
    outbox.put("inventory", {"body": {"agent_id": AGENT, "skills": []}})
    outbox.put("start", {"command_id": 5, "body": {"agent_id": AGENT}})
    outbox.put("finish", {"command_id": 5, "body": {"agent_id": AGENT, "status": "succeeded"}})
    outbox.put("finish", {"command_id": 6, "body": {"agent_id": AGENT, "status": "succeeded"}})
    plane.fault(API + "/commands/5/start", status=500, body=b'{"success":false,"error":"x"}')
    sender.flush(client, outbox, threading.Event())
    order = [r.path.rsplit("/", 2)[-2:] for r in plane.requests if r.path != API + "/register"]
    assert order == [["5", "start"], ["6", "finish"], ["skills", "inventory"]]
    assert sorted(item["kind"] for _, item in outbox.items()) == ["finish", "start"]


def test_the_plane_away_stops_the_pass_without_holding_items(plane, tmp_path):
    client = make_client(plane, tmp_path)
    outbox = Outbox(tmp_path / "outbox")
    for i in (1, 2):
        outbox.put("finish", {"command_id": i, "body": {"agent_id": AGENT, "status": "succeeded"}})
    client.auth.token()
    plane.fault(r"/finish$", status=503, body=b'{"success":false,"error":"maintenance"}', times=None)
    with pytest.raises(Retryable):
        sender.flush(client, outbox, threading.Event())
    assert len(plane.seen(r"/finish$")) == 1 and held_items(outbox.dir) == []


def test_a_nan_result_is_never_sent(plane, tmp_path):
    from caldera.protocol.payloads import finish_body

    with pytest.raises(Unsendable, match="non-finite"):
        encode_body({"x": float("nan")})
    body = finish_body(AGENT, "succeeded", {"load": float("nan"), "n": [float("inf"), 1]}, "e" * 70_000)
    assert body["result"] == {"load": None, "n": [None, 1]} and len(body["error_message"].encode()) <= 16 * 1024
    outbox = Outbox(tmp_path / "outbox")
    outbox.put("finish", {"command_id": 1,
                          "body": {"agent_id": AGENT, "status": "failed", "result": {"v": float("nan")}}})
    sender.flush(make_client(plane, tmp_path), outbox, threading.Event())
    assert plane.seen(r"/finish$")[0].json()["result"] == {"v": None}


# ------------------------------------------------------------------ 2. 403 by its meaning

def test_session_mismatch_on_finish_registers_again_and_delivers(plane, tmp_path):
    client = make_client(plane, tmp_path)
    client.auth.token()
    plane.fault(r"/finish$", status=403, body=b'{"success":false,"error":"agent id does not match session"}')
    client.finish_command(3, {"agent_id": AGENT, "status": "succeeded"})
    assert plane.registrations == 2 and client.auth.blocked_reason is None
    assert plane.seen(r"/finish$")[-1].headers["Authorization"] == "Bearer agt_sess_fault_2"


def test_a_result_queued_under_an_earlier_agent_id_goes_out_under_the_sessions(plane, tmp_path, caplog):
    """0.1.0's `desktop-7-main` queued it; the session is `hermes-7-main`'s: the plane
    takes a body only with the session's id, so that is the id it is sent with."""
    client = make_client(plane, tmp_path, agent_id="hermes-7-main")
    outbox = Outbox(tmp_path / "outbox")
    for kind, cid in (("start", 4), ("finish", 4), ("finish", 5)):
        outbox.put(kind, {"command_id": cid, "body": {"agent_id": "desktop-7-main", "status": "succeeded"}})
    outbox.put("inventory", {"body": {"agent_id": "desktop-7-main", "mode": "full", "skills": []}})
    with caplog.at_level("INFO", logger="caldera"):
        assert sender.flush(client, outbox, threading.Event()) is True
    sent = [r.json()["agent_id"] for r in plane.seen(r"/(start|finish|inventory)$")]
    assert sent == ["hermes-7-main"] * 4 and plane.registrations == 1
    assert caplog.text.count("what was queued as agent 'desktop-7-main' goes out as 'hermes-7-main'") == 1


def test_a_mismatch_a_register_cannot_fix_never_loops_registers(plane, tmp_path, caplog):
    """A plane that answers every finish 403 "agent id does not match session": one register
    for the refusal (the session may be another id's), then none: the session registered for
    that very refusal is this agent's, so the next one is about the call. Said once."""
    client = make_client(plane, tmp_path)
    clock = [1000.0]
    outbox = Outbox(tmp_path / "outbox", clock=lambda: clock[0])
    outbox.put("finish", {"command_id": 3, "body": {"agent_id": AGENT, "status": "succeeded"}})
    plane.fault(r"/finish$", status=403, body=b'{"success":false,"error":"agent id does not match session"}',
                times=None)
    with caplog.at_level("INFO", logger="caldera"):
        for _ in range(5):
            sender.flush(client, outbox, threading.Event())
            clock[0] += 3600  # each pass finds the item due again
    assert plane.registrations == 2  # the first session's, and one for the refusal
    assert len(plane.seen(r"/finish$")) == 6 and outbox.depth() == 1  # kept, held, tried each pass
    assert caplog.text.count("not registering again (that call is refused; said once)") == 1
    assert caplog.text.count("registering again") == 2  # the one register, and the one refusal
    client.heartbeat({"agent_id": AGENT})  # the session goes on
    assert plane.registrations == 2


def test_a_changed_agent_id_never_reuses_the_old_session(plane, tmp_path):
    make_client(plane, tmp_path, agent_id="caldera-7-adapter").auth.token()
    other = make_client(plane, tmp_path, agent_id="caldera-7-process")
    assert other.auth.info is None
    other.heartbeat({})
    assert plane.registrations == 2


def test_access_denied_on_a_revision_fails_that_call_only(plane, tmp_path):
    client = make_client(plane, tmp_path)
    plane.fault(r"/config/revisions/8$", status=403, body=b'{"success":false,"error":"Access denied"}')
    with pytest.raises(Forbidden):
        client.config_revision_raw(8)
    client.heartbeat({})
    assert client.auth.blocked_reason is None and plane.registrations == 1


# ------------------------------------------------------------------ 3. a total deadline per request

def test_a_trickling_answer_ends_at_the_total_deadline(plane, tmp_path):
    client = make_client(plane, tmp_path)
    client.auth.token()
    plane.fault(r"/heartbeat$", size=400, body=b'{"success":true,"data":{}}', trickle=0.05)
    with pytest.raises(Retryable, match="no complete answer within"):
        client.transport.request("POST", "/heartbeat", client.auth.token(), body={}, total=1.0)


def test_within_bounds_every_call_by_the_callers_deadline(plane, tmp_path):
    import time

    client = make_client(plane, tmp_path)
    client.auth.token()
    plane.fault(r"/heartbeat$", hang=True)
    with client.within(time.monotonic() + 2.0):  # room for a slow machine to start the first call
        with pytest.raises(Retryable, match="no complete answer"):
            client.heartbeat({})
        with pytest.raises(Retryable, match="no time left"):
            threading.Event().wait(2.1)  # the caller's deadline has passed: no new request
            client.heartbeat({})


def test_abort_interrupts_a_hanging_request(plane, tmp_path):
    client = make_client(plane, tmp_path)
    client.auth.token()
    plane.fault(r"/heartbeat$", hang=True)
    outcome = {}

    def call():
        try:
            client.heartbeat({})
        except Retryable as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=call)
    thread.start()
    while not plane.seen(r"/heartbeat$"):
        threading.Event().wait(0.01)
    assert client.transport.abort("stopping") == 1
    thread.join(20)
    assert not thread.is_alive() and "interrupted: stopping" in outcome["error"]


# ------------------------------------------------------------------ 4. one connectivity state

def test_retry_after_is_honoured_up_to_300_s(plane, tmp_path):
    client = make_client(plane, tmp_path)
    client.auth.token()
    plane.fault(r"/heartbeat$", status=429, headers={"Retry-After": "86400"}, body=b'{"success":false,"error":"x"}')
    with pytest.raises(Retryable) as err:
        client.heartbeat({})
    assert err.value.retry_after == 300 and 0 < client.transport.quiet_for() <= 300


def test_the_first_answer_after_an_outage_wakes_every_loop(plane, tmp_path):
    woken = []
    client = make_client(plane, tmp_path, on_reconnect=lambda: woken.append(1))
    client.auth.token()
    plane.fault(r"/heartbeat$", status=502, body=b"bad gateway", times=2)
    for _ in range(2):
        with pytest.raises(Retryable):
            client.heartbeat({})
    assert woken == []
    client.state_report({})  # any loop's success
    client.heartbeat({})
    assert woken == [1]  # once, at the first answer


# ------------------------------------------------------------------ 5. commands/next up to 8 MiB, larger named

def test_a_command_up_to_8_mib_is_read(plane, tmp_path):
    client = make_client(plane, tmp_path)
    plane.commands.append({"id": 11, "command_type": "settings_set", "payload": {"blob": "y" * (6 * 1024 * 1024)}})
    command, too_large = client.next_command()
    assert too_large is None
    assert command["id"] == 11 and len(command["payload"]["blob"]) == 6 * 1024 * 1024


def test_a_larger_command_is_named_and_marked_too_large(plane, tmp_path):
    client = make_client(plane, tmp_path)
    head = b'{"success":true,"data":{"command":{"id":12,"command_type":"settings_set","payload":{"id":99,"x":"'
    plane.fault(r"/commands/next$", size=NEXT_CAP + 4096, body=head)
    command, too_large = client.next_command()
    assert command == {"id": 12, "command_type": "settings_set"}  # the head only
    assert too_large == f"over {NEXT_CAP} bytes"  # the client's finding, beside the plane's object


# ------------------------------------------------------------------ 7. redirects and URL path values

def test_an_api_redirect_is_not_followed_and_names_its_location(plane, tmp_path):
    evil = FaultPlane().start()
    try:
        client = make_client(plane, tmp_path)
        client.auth.token()
        plane.fault(r"/heartbeat$", status=307, redirect=evil.url + "/steal")
        with pytest.raises(Redirected, match="Location: " + evil.url):
            client.heartbeat({})
        assert evil.requests == []
    finally:
        evil.stop()


def test_a_download_follows_only_same_origin_redirects(plane, tmp_path):
    evil = FaultPlane().start()
    try:
        evil.downloads["ver_3"] = b"PK evil"
        plane.downloads["ver_2"] = b"PK good"
        client = make_client(plane, tmp_path)
        plane.fault(r"/versions/ver_1/download$", redirect=plane.url + API + "/skills/versions/ver_2/download")
        got = client.download_skill("ver_1", tmp_path / "a.zip")
        assert got.same_origin and (tmp_path / "a.zip").read_bytes() == b"PK good"
        plane.fault(r"/versions/ver_1/download$", redirect=evil.url + API + "/skills/versions/ver_3/download")
        with pytest.raises(Redirected, match="another origin"):
            client.download_skill("ver_1", tmp_path / "b.zip")
        assert evil.requests == []
    finally:
        evil.stop()


@pytest.mark.parametrize("call, value", [
    ("download_skill", "../../plane/api/agents"),
    ("download_skill", "ver_1?x=1"),
    ("finish_command", "1/../../register"),
    ("post_run_events", "../x"),
    ("config_revision_raw", "5;"),
])
def test_url_path_values_are_checked(plane, tmp_path, call, value):
    client = make_client(plane, tmp_path)
    args = (value, tmp_path / "x") if call == "download_skill" else (value, {}) if call != "config_revision_raw" \
        else (value,)
    with pytest.raises(Unsendable, match="refused to put"):
        getattr(client, call)(*args)
    assert plane.requests == []


# ------------------------------------------------------------------ 9. multipart names

def test_multipart_names_are_escaped(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(b"PK")
    form = client_mod.MultipartFile({"identifier": "x"}, "file", archive, 'we"ird\r\n.zip')
    head = b"".join(form)
    assert b'filename="we%22ird%0D%0A.zip"' in head


def test_unaccepted_is_retryable_but_not_transient():
    exc = Unaccepted(200, "success: false")
    assert exc.retryable and not client_mod.transient(exc)
    assert client_mod.transient(Retryable(502, "x")) and client_mod.transient(Retryable(None, "reset"))
    assert not client_mod.transient(Forbidden(403, "no"))
    assert json.loads(encode_body({"a": 1})) == {"a": 1}


def test_an_accepted_inventory_records_its_digest_and_a_held_one_does_not(plane, tmp_path):
    from caldera.skills import publish

    client = make_client(plane, tmp_path)
    outbox = Outbox(tmp_path / "outbox")
    outbox.put("inventory", {"body": {"agent_id": AGENT, "skills": []}, "digest": "full:one"})
    plane.fault(r"/skills/inventory$", status=500, body=b'{"success":false,"error":"db"}')
    sender.flush(client, outbox, threading.Event())
    assert publish.accepted_digest(outbox.dir) is None and outbox.depth() == 1
    outbox.done(next(n for n, _ in outbox.items()))
    outbox.put("inventory", {"body": {"agent_id": AGENT, "skills": []}, "digest": "full:two"})
    sender.flush(client, outbox, threading.Event())
    assert publish.accepted_digest(outbox.dir) == "full:two" and outbox.depth() == 0
