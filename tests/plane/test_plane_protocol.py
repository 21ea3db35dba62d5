"""Protocol conformance of caldera plane against ClawManager's server behaviour (clawmanager-notes 1)."""
import hashlib
import json
import re

import pytest
import requests
from plane_helpers import (  # noqa: F401
    AGENT,
    BOOT,
    Agent,
    add_config_revision,
    add_skill_version,
    agent,
    clock,
    error_of,
    heartbeats,
    inventory,
    plane,
    run_events,
    runtime,
    skill_zip,
    skills,
    uploads,
)

# ---- register and sessions -----------------------------------------------------------------

def test_register_answers_the_envelope_with_session_and_intervals(plane):
    resp = Agent(plane.url).register()
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["success"] is True and isinstance(doc["message"], str)
    data = doc["data"]
    assert re.fullmatch(r"agt_sess_[0-9a-f]{48}", data["session_token"])
    assert data["heartbeat_interval_seconds"] == 15 and data["command_poll_interval_seconds"] == 5
    assert data["session_expires_at"].endswith("Z") and data["server_time"].endswith("Z")


@pytest.mark.parametrize("token, instance", [("wrong-token", 1), (BOOT, 2), ("other-token", 1)])
def test_register_with_a_wrong_token_or_instance_is_400_invalid_bootstrap_token(plane, token, instance):
    resp = Agent(plane.url, instance_id=instance, bootstrap=token).register()
    assert resp.status_code == 400
    assert error_of(resp) == "invalid agent bootstrap token"


def test_register_without_a_bearer_token_is_401(plane):
    resp = Agent(plane.url, bootstrap=None).register()
    assert resp.status_code == 401 and error_of(resp) == "Agent bootstrap token is required"


def test_register_body_rules(plane):
    a = Agent(plane.url)
    assert a.register(protocol_version="v2").status_code == 400
    assert error_of(a.register(protocol_version="v2")) == "unsupported agent protocol version"
    resp = a.register(instance_id="1")  # a string, not a JSON number
    assert resp.status_code == 400 and "instance_id" in error_of(resp)
    assert a.register(agent_id="").status_code == 400
    assert a.register(agent_version="x" * 50).status_code == 200
    resp = a.register(agent_version="x" * 51)  # VARCHAR(50): the real server's MySQL error is a 500
    assert resp.status_code == 500 and "agent_version" in error_of(resp)
    empty = a.http.post(a.base + "/register", data=b"", headers=a.auth(BOOT))
    assert empty.status_code == 400 and error_of(empty) == "EOF"


def test_each_register_invalidates_the_previous_session(plane):
    a = Agent(plane.url)
    a.register()
    first = a.token
    a.register()
    assert a.token != first
    stale = a.post("/heartbeat", {"agent_id": AGENT}, token=first)
    assert stale.status_code == 401 and error_of(stale) == "invalid or expired agent session token"
    assert a.heartbeat().status_code == 200
    assert plane.store.agents()[0]["registrations"] == 2


def test_session_rolls_with_heartbeats_and_expires_without(plane, clock):
    a = Agent(plane.url)
    a.register()
    clock.advance(86000)
    assert a.heartbeat().status_code == 200  # renews to now + 24 h
    clock.advance(86000)
    assert a.report().status_code == 200  # a report does not renew
    clock.advance(1000)
    resp = a.heartbeat()
    assert resp.status_code == 401 and error_of(resp) == "invalid or expired agent session token"


def test_missing_or_malformed_session_token_is_401(agent):
    resp = agent.http.post(agent.base + "/heartbeat", json={"agent_id": AGENT})
    assert resp.status_code == 401 and error_of(resp) == "Agent session token is required"
    resp = agent.http.post(agent.base + "/heartbeat", json={"agent_id": AGENT},
                           headers={"Authorization": f"Token {agent.token}"})
    assert resp.status_code == 401
    resp = agent.http.post(agent.base + "/heartbeat", json={"agent_id": AGENT},
                           headers={"Authorization": f"bearer   {agent.token} "})
    assert resp.status_code == 200  # scheme case-insensitive, parts trimmed


def test_agent_id_mismatch_is_403(agent):
    resp = agent.post("/heartbeat", {"agent_id": "someone-else"})
    assert resp.status_code == 403 and error_of(resp) == "agent id does not match session"
    resp = agent.post("/state/report", {"agent_id": "someone-else"})
    assert resp.status_code == 403


# ---- heartbeat -------------------------------------------------------------------------------

def test_heartbeat_answer_and_pending_flag(plane, agent):
    data = agent.heartbeat(openclaw_status="running").json()["data"]
    assert data["has_pending_command"] is False and data["desired_power_state"] == "running"
    assert "desired_config_revision_id" not in data
    plane.store.enqueue(1, "collect_system_info")
    assert agent.heartbeat().json()["data"]["has_pending_command"] is True
    agent.next()
    assert agent.heartbeat().json()["data"]["has_pending_command"] is False  # dispatched is not pending


def test_heartbeat_reports_desired_revision(plane, agent):
    rev = add_config_revision(plane.store, 1, {"schemaVersion": 1, "mode": "none", "resources": [], "payloads": []})
    plane.store.enqueue(1, "apply_config_revision", {"revision_id": rev, "snapshot_id": 1})
    assert agent.heartbeat().json()["data"]["desired_config_revision_id"] == rev


def test_heartbeat_resets_current_revision_when_omitted(plane, agent):
    agent.heartbeat(current_config_revision_id=7)
    assert runtime(plane.store, 1)["current_config_revision_id"] == 7
    agent.heartbeat()
    assert runtime(plane.store, 1)["current_config_revision_id"] is None


def test_heartbeat_column_limit_and_types(plane, agent):
    assert agent.heartbeat(openclaw_status="x" * 30).status_code == 200
    resp = agent.heartbeat(openclaw_status="x" * 31)
    assert resp.status_code == 500 and "openclaw_status" in error_of(resp)
    resp = agent.heartbeat(current_config_revision_id=3.0)
    assert resp.status_code == 400 and "current_config_revision_id" in error_of(resp)
    resp = agent.heartbeat(timestamp="2026-04-27T10:00:15")  # naive time
    assert resp.status_code == 400 and "timestamp" in error_of(resp)
    assert agent.heartbeat(timestamp="2026-04-27T10:00:15.123456789Z").status_code == 200
    body = agent.heartbeat(summary={"openclaw_pid": 245, "runtime_type": "caldera"})
    assert body.status_code == 200
    assert runtime(plane.store, 1)["openclaw_pid"] == 245
    assert heartbeats(plane.store, 1, last=True)["body"]["summary"]["runtime_type"] == "caldera"


# ---- presence ---------------------------------------------------------------------------------

def test_presence_follows_the_last_heartbeat(plane, agent, clock):
    def presence():
        return plane.store.agents()[0]["presence"]

    agent.heartbeat()
    assert presence() == "online"
    clock.advance(45)
    assert presence() == "online"
    clock.advance(1)
    assert presence() == "stale"
    clock.advance(74)
    assert presence() == "stale"
    clock.advance(1)
    assert presence() == "offline"
    agent.heartbeat()
    assert presence() == "online"


def test_state_report_sets_last_seen_from_reported_at(plane, agent, clock):
    from caldera.plane.api import rfc3339

    agent.report(reported_at=rfc3339(clock.now - 60))  # a skewed agent clock shows as stale
    assert plane.store.agents()[0]["presence"] == "stale"


# ---- state report -------------------------------------------------------------------------------

def test_state_report_is_kept_and_resets_pid_and_revision(plane, agent):
    resp = agent.report(runtime={"openclaw_status": "running", "openclaw_pid": 245, "openclaw_version": "1.2",
                                 "current_config_revision_id": 4},
                        system_info={"cpu": {"cores": 2, "load": {"1m": 0.5}}}, health={"agent": "ok"},
                        agent_status={"gauges": [{"name": "quota", "used": 0.4}]})
    assert resp.status_code == 200 and resp.json()["data"] is None
    rt = runtime(plane.store, 1)
    assert (rt["openclaw_pid"], rt["current_config_revision_id"], rt["openclaw_version"]) == (245, 4, "1.2")
    agent.report(runtime={"openclaw_status": "running"})
    rt = runtime(plane.store, 1)
    assert rt["openclaw_pid"] is None and rt["current_config_revision_id"] is None
    assert rt["openclaw_version"] == "1.2"  # blank is not written
    assert len(plane.store.reports(1)) == 2
    assert plane.store.reports(1, last=True)["body"]["runtime"] == {"openclaw_status": "running"}


def test_state_report_typing(agent):
    resp = agent.report(runtime={"openclaw_pid": 245.0})  # Go cannot put 245.0 into an int
    assert resp.status_code == 400 and "openclaw_pid" in error_of(resp)
    assert agent.report(reported_at="").status_code == 400
    assert agent.report(system_info=[1, 2]).status_code == 400
    resp = agent.report(runtime={"openclaw_version": "v" * 101})
    assert resp.status_code == 500


def test_reports_keep_the_last_hundred(plane, agent):
    from caldera.plane import store

    for i in range(store.REPORTS_KEPT + 5):
        agent.report(health={"n": i})
    kept = plane.store.reports(1)
    assert len(kept) == store.REPORTS_KEPT
    assert kept[0]["body"]["health"]["n"] == 5 and kept[-1]["body"]["health"]["n"] == store.REPORTS_KEPT + 4


# ---- commands -------------------------------------------------------------------------------------

def test_next_is_null_when_idle_and_hands_out_oldest_once(plane, agent, clock):
    assert agent.next() is None
    first = plane.store.enqueue(1, "collect_system_info")
    clock.advance(1)
    second = plane.store.enqueue(1, "health_check", timeout_seconds=42, idempotency_key="hc-1")
    got = agent.next()
    assert got["id"] == first and got["command_type"] == "collect_system_info"
    assert got["payload"] == {} and got["timeout_seconds"] == 300 and got["idempotency_key"]
    assert got["issued_at"].endswith("Z")
    got2 = agent.next()
    assert (got2["id"], got2["timeout_seconds"], got2["idempotency_key"]) == (second, 42, "hc-1")
    assert agent.next() is None
    assert [c["status"] for c in plane.store.commands(1)] == ["dispatched", "dispatched"]


def test_next_never_crosses_instances(plane, agent):
    plane.store.enqueue(2, "collect_system_info")
    assert agent.next() is None


def test_enqueue_idempotency_key_and_defaults(plane):
    a = plane.store.enqueue(1, "pause", idempotency_key="k")
    assert plane.store.enqueue(1, "pause", idempotency_key="k") == a
    c = plane.store.enqueue(1, "collect_skill_package", {"content_md5": "x"})
    assert plane.store.command(1, c)["timeout_seconds"] == 600
    with pytest.raises(ValueError):
        plane.store.enqueue(1, "x" * 51)
    with pytest.raises(ValueError):
        plane.store.enqueue(9, "pause")


def test_start_and_finish_lifecycle_and_idempotence(plane, agent):
    cid = plane.store.enqueue(1, "collect_system_info")
    agent.next()
    assert agent.start(cid).status_code == 200
    assert plane.store.command(1, cid)["status"] == "running"
    assert agent.start(cid).status_code == 200  # again: nothing changes
    resp = agent.finish(cid, result={"message": "done"})
    assert resp.status_code == 200 and resp.json()["data"] is None
    resp = agent.finish(cid, "failed", error_message="late duplicate")
    assert resp.status_code == 200
    cmd = plane.store.command(1, cid)
    assert (cmd["status"], cmd["result"], cmd["error_message"]) == ("succeeded", {"message": "done"}, None)
    assert cmd["finish_count"] == 2 and cmd["start_count"] == 2
    assert agent.start(cid).status_code == 200
    assert plane.store.command(1, cid)["status"] == "succeeded"


def test_finish_without_start_and_failed_with_message(plane, agent):
    cid = plane.store.enqueue(1, "unknown_thing")
    agent.next()
    assert agent.finish(cid, "failed", error_message="unsupported command type: unknown_thing").status_code == 200
    cmd = plane.store.command(1, cid)
    assert cmd["status"] == "failed" and cmd["error_message"] == "unsupported command type: unknown_thing"
    pending = plane.store.enqueue(1, "pause")
    assert agent.finish(pending).status_code == 200  # pending moves straight to succeeded
    assert plane.store.command(1, pending)["status"] == "succeeded"


@pytest.mark.parametrize("status", ["ok", "cancelled", "SUCCEEDED", "running"])
def test_finish_status_must_be_succeeded_or_failed(plane, agent, status):
    cid = plane.store.enqueue(1, "pause")
    resp = agent.finish(cid, status)
    assert resp.status_code == 400 and error_of(resp) == "invalid instance command finish status"
    assert plane.store.command(1, cid)["status"] == "pending"


def test_finish_result_must_be_an_object(plane, agent):
    cid = plane.store.enqueue(1, "pause")
    assert agent.finish(cid, result=[1]).status_code == 400
    assert agent.finish(cid, result="done").status_code == 400
    assert agent.finish(cid, result=None).status_code == 200


def test_command_resource_errors(plane, agent):
    other = plane.store.enqueue(2, "pause")
    for resp in (agent.start(other), agent.finish(other), agent.start(9999), agent.finish(9999)):
        assert resp.status_code == 404 and error_of(resp) == "instance command not found"
    resp = agent.start("abc")
    assert resp.status_code == 400 and error_of(resp) == "Invalid command ID"
    mine = plane.store.enqueue(1, "pause")
    resp = agent.post(f"/commands/{mine}/start", {"agent_id": AGENT + " "})  # compared untrimmed
    assert resp.status_code == 403 and error_of(resp) == "Agent ID does not match session"
    resp = agent.post(f"/commands/{mine}/finish", {"agent_id": "intruder", "status": "failed"})
    assert resp.status_code == 403
    assert agent.post(f"/commands/{mine}/finish", {"agent_id": AGENT + " ", "status": "failed"}).status_code == 200


# ---- skills ----------------------------------------------------------------------------------------

def _inventory(agent, skills, mode="full"):
    return agent.post("/skills/inventory", {"agent_id": AGENT, "mode": mode, "trigger": "startup", "skills": skills})


def _skill(identifier, md5):
    return {"identifier": identifier, "content_md5": md5, "install_path": f"/x/{identifier}", "source": "runtime"}


def test_inventory_null_skills_is_400_and_empty_list_is_fine(agent):
    resp = agent.post("/skills/inventory", {"agent_id": AGENT, "mode": "full", "skills": None})
    assert resp.status_code == 400 and error_of(resp) == "Skills is required"
    assert agent.post("/skills/inventory", {"agent_id": AGENT}).status_code == 400
    assert _inventory(agent, []).status_code == 200


def test_inventory_full_removes_unlisted_incremental_keeps(plane, agent):
    _inventory(agent, [_skill("Vendor.Alpha", "a" * 32), _skill("beta", "b" * 32), _skill("nohash", "")])
    state = {s["skill_key"]: s["status"] for s in skills(plane.store, 1)}
    assert state == {"vendor-alpha": "active", "beta": "active"}  # empty content_md5 skipped
    _inventory(agent, [_skill("gamma", "c" * 32)], mode="incremental")
    assert {s["skill_key"]: s["status"] for s in skills(plane.store, 1)}["beta"] == "active"
    _inventory(agent, [_skill("gamma", "c" * 32)], mode="whatever")  # anything but incremental is full
    state = {s["skill_key"]: s["status"] for s in skills(plane.store, 1)}
    assert state == {"vendor-alpha": "removed", "beta": "removed", "gamma": "active"}
    assert inventory(plane.store, 1)["mode"] == "whatever"


def test_inventory_queues_collect_skill_package_once_per_hash(plane, agent):
    _inventory(agent, [_skill("alpha", "a" * 32)])
    _inventory(agent, [_skill("alpha", "a" * 32)])
    collect = [c for c in plane.store.commands(1) if c["command_type"] == "collect_skill_package"]
    assert len(collect) == 1
    assert collect[0]["payload"]["content_md5"] == "a" * 32 and collect[0]["timeout_seconds"] == 600
    assert collect[0]["idempotency_key"] == f"collect-skill-package-1-{'a' * 32}"


def test_inventory_column_limit_is_500(agent):
    resp = _inventory(agent, [{"identifier": "x", "content_md5": "d" * 32, "source": "s" * 41}])
    assert resp.status_code == 500


def _upload(agent, data: bytes, filename="alpha.zip", **fields):
    form = {"agent_id": AGENT, **fields}
    return agent.http.post(agent.base + "/skills/upload", data=form, files={"file": (filename, data)},
                           headers=agent.auth(agent.token))


def test_upload_then_download_round_trip(plane, agent):
    from caldera.plane.upload import content_md5

    data = skill_zip({"alpha/SKILL.md": b"hello\n", "alpha/src/main.py": b"x\n", "__MACOSX/._junk": b"z"})
    md5 = content_md5({"SKILL.md": b"hello\n", "src/main.py": b"x\n"})
    resp = _upload(agent, data, content_md5=md5, identifier="alpha")
    assert resp.status_code == 201, resp.text
    out = resp.json()["data"]
    assert out["content_md5"] == md5 and out["current_version_id"].startswith("ver_")
    [kept] = uploads(plane.store, 1)
    assert kept["top_dir"] == "alpha" and kept["fields"]["identifier"] == "alpha"
    got = agent.get(f"/skills/versions/{out['current_version_id']}/download")
    assert got.status_code == 200 and got.content == data
    assert got.headers["Content-Type"] == "application/octet-stream"
    assert 'filename="alpha.zip"' in got.headers["Content-Disposition"]


@pytest.mark.parametrize("entries, needle", [
    ({"SKILL.md": b"loose"}, "loose file"),
    ({"a/SKILL.md": b"1", "b/SKILL.md": b"2"}, "exactly one skill directory"),
    ({"a/README.md": b"1"}, "must contain SKILL.md"),
])
def test_upload_archive_shape_errors_are_500(agent, entries, needle):
    resp = _upload(agent, skill_zip(entries))
    assert resp.status_code == 500 and needle in error_of(resp)


def test_upload_form_errors(agent):
    good = skill_zip({"a/skill.md": b"1"})  # SKILL.md matched case-insensitively
    assert _upload(agent, good).status_code == 201
    resp = _upload(agent, good, filename="a.tar.gz")
    assert resp.status_code == 400
    resp = _upload(agent, good, content_md5="0" * 32)
    assert resp.status_code == 400 and error_of(resp) == "skill_package_md5_mismatch"
    resp = _upload(agent, good, agent_id="intruder")
    assert resp.status_code == 403
    no_file = agent.http.post(agent.base + "/skills/upload", files={"agent_id": (None, AGENT)},
                              headers=agent.auth(agent.token))
    assert no_file.status_code == 400 and error_of(no_file) == "file is required"
    assert _upload(agent, b"not a zip").status_code == 500


def test_download_needs_a_session_and_a_known_version(plane, agent):
    add_skill_version(plane.store, "ver_34", b"PK-bytes", "alpha.zip")
    assert agent.get("/skills/versions/34/download").content == b"PK-bytes"  # a bare number parses too
    assert agent.http.get(agent.base + "/skills/versions/ver_34/download").status_code == 401
    for bad in ("skill-version-34", "ver_99"):
        resp = agent.get(f"/skills/versions/{bad}/download")
        assert resp.status_code == 500 and resp.json()["success"] is False
    with pytest.raises(ValueError):
        add_skill_version(plane.store, "skill-version-34", b"")


# ---- config revisions ----------------------------------------------------------------------------------

def test_config_revision_is_wrapped_and_checksum_matches_raw_bytes(plane, agent):
    content = {"schemaVersion": 1, "mode": "bundle", "resources": [{"id": 1, "name": "a<b>&c"}], "payloads": []}
    rev = add_config_revision(plane.store, 1, content)
    resp = agent.get(f"/config/revisions/{rev}")
    assert resp.status_code == 200
    revision = resp.json()["data"]["revision"]
    assert revision["content"] == content and revision["status"] == "published"
    raw = re.search(rb'"content":(\{.*\})\}\}\}\Z', resp.content).group(1)
    assert b"\\u003cb\\u003e\\u0026c" in raw  # Go escapes <>& inside JSON strings
    assert revision["checksum"] == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert revision["checksum"] != "sha256:" + hashlib.sha256(json.dumps(content).encode()).hexdigest()


def test_config_revision_errors(plane, agent):
    other = add_config_revision(plane.store, 2, {"schemaVersion": 1})
    resp = agent.get(f"/config/revisions/{other}")
    assert resp.status_code == 403 and error_of(resp) == "Access denied"
    resp = agent.get("/config/revisions/999")
    assert resp.status_code == 404 and error_of(resp) == "instance config revision not found"
    resp = agent.get("/config/revisions/x1")
    assert resp.status_code == 400 and error_of(resp) == "Invalid config revision ID"


# ---- run events (extension) ------------------------------------------------------------------------------

def _event(run_id, seq, type_="assistant_message"):
    return {"run_id": run_id, "seq": seq, "ts": "2026-12-02T10:00:00Z", "type": type_, "data": {"text": "hi"}}


def test_run_events_are_stored_in_order(plane, agent):
    resp = agent.post("/runs/r1/events", {"agent_id": AGENT, "events": [_event("r1", 0), _event("r1", 1)]})
    assert resp.status_code == 200 and resp.json()["data"] == {"accepted": 2, "stored": 2}
    agent.post("/runs/r1/events", {"agent_id": AGENT, "events": [_event("r1", 2, "terminal_status")]})
    assert [e["seq"] for e in run_events(plane.store, "r1")] == [0, 1, 2]


def test_run_events_validation(agent):
    resp = agent.post("/runs/r1/events", {"agent_id": AGENT, "events": [_event("r2", 0)]})
    assert resp.status_code == 400 and "run_id" in error_of(resp)
    resp = agent.post("/runs/r1/events", {"agent_id": AGENT, "events": [_event("r1", 0, "bogus")]})
    assert resp.status_code == 400


# ---- routing and fault injection ---------------------------------------------------------------------------

def test_unknown_route_is_404_with_an_empty_body(agent):
    for resp in (agent.get("/nothing"), agent.post("/commands/1/cancel", {}), agent.get("/heartbeat")):
        assert resp.status_code == 404 and resp.content == b""


def test_trailing_slash_redirects_like_gin(agent):
    resp = agent.http.post(agent.base + "/heartbeat/", json={}, allow_redirects=False)
    assert resp.status_code == 307 and resp.headers["Location"].endswith("/api/v1/agent/heartbeat")
    resp = agent.http.get(agent.base + "/commands/next/", allow_redirects=False)
    assert resp.status_code == 301


def test_inject_answers_matching_requests_then_stops(plane, agent):
    plane.inject("POST", r"/heartbeat$", 503, count=2, retry_after=7)
    first = agent.heartbeat()
    assert first.status_code == 503 and first.headers["Retry-After"] == "7"
    assert first.json()["success"] is False
    assert agent.heartbeat().status_code == 503
    assert agent.heartbeat().status_code == 200
    assert agent.report().status_code == 200  # other routes untouched
    plane.inject("*", r"/state/report", 200, body={"weird": True})
    assert agent.report().json() == {"weird": True}
    assert plane.count("POST", r"/heartbeat$", 503) == 2 and plane.count("POST", r"/heartbeat$", 200) == 1


def test_drop_closes_the_connection_without_answer(plane, agent):
    cid = plane.store.enqueue(1, "pause")
    plane.drop("POST", r"/finish$", 1)
    with pytest.raises(requests.ConnectionError):
        agent.finish(cid)
    assert plane.store.command(1, cid)["status"] == "pending"  # nothing was applied
    assert agent.finish(cid).status_code == 200
    assert ("POST", f"/api/v1/agent/commands/{cid}/finish", 0) in plane.requests
    assert ("POST", f"/api/v1/agent/commands/{cid}/finish", 200) in plane.requests


def test_chunked_request_bodies_are_read(agent):
    def gen():
        yield json.dumps({"agent_id": AGENT})[:5].encode()
        yield json.dumps({"agent_id": AGENT})[5:].encode()

    resp = agent.http.post(agent.base + "/heartbeat", data=gen(),
                           headers={**agent.auth(agent.token), "Content-Type": "application/json"})
    assert resp.status_code == 200
