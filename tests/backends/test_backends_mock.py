"""T1 and T2 of seed 003 against the scripted mock app-server: normalisation,
redaction and every failure kind, end to end through the Codex backend."""
from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import pytest
from backends_helpers import (
    CANARY,
    KEY_ENV,
    environment,
    everything_text,
    execute,
    mock_binary,
    of_type,
    request,
    types,
    workspace,
    write_projection,
)

from caldera.backends import failures as fk
from caldera.backends import service


def _notif(method, **params):
    return {"method": method, "params": params}


def _item(kind, **fields):
    return dict({"type": kind, "id": fields.pop("id", f"{kind}_1")}, **fields)


def _failed(error, retry_first=None):
    steps = []
    if retry_first:
        steps.append(_notif("error", error=retry_first, willRetry=True, threadId="$THREAD", turnId="$TURN"))
    steps.append(_notif("error", error=error, willRetry=False, threadId="$THREAD", turnId="$TURN"))
    steps.append(_notif("turn/completed", threadId="$THREAD",
                        turn={"id": "$TURN", "status": "failed", "error": error, "items": []}))
    return {"on_turn": steps}


def _completed():
    return _notif("turn/completed", threadId="$THREAD", turn={"id": "$TURN", "status": "completed", "error": None})


def run_mock(tmp_path, script, secrets=True, **kw):
    sec = write_projection(tmp_path) if secrets else None
    env = environment(tmp_path, mock_binary(tmp_path, script), sec)
    result, events = execute(request(workspace(tmp_path), **kw), env)
    return result, events, env


def _one_terminal(events):
    assert types(events).count("terminal_status") == 1
    assert events[-1]["type"] == "terminal_status"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    return events[-1]["data"]


# ---------------------------------------------------------------- T1: normalisation + redaction

def test_text_turn_normalised_and_secrets_redacted(tmp_path):
    leaky = (f"key {CANARY} header Authorization: Bearer abcdefghijklmnop0123 "
             f"url https://user:hunter2pass@example.com/x?api_key=QWERTYUIOP12 "
             f"b64 {base64.b64encode(CANARY.encode()).decode()} json {json.dumps({'api_key': 'zzzzzzzz1'})}")
    script = {"stderr": [f"ERROR auth {CANARY}", "\x1b[31mcoloured\x1b[0m"], "on_turn": [
        _notif("item/started", item=_item("agentMessage", id="m1", text="")),
        _notif("item/agentMessage/delta", itemId="m1", delta="Hel"),
        _notif("item/completed", item=_item("agentMessage", id="m1", text="Hello " + leaky)),
        _notif("item/started", item=_item("commandExecution", id="c1", command="/bin/bash -lc env", cwd="/w")),
        _notif("item/commandExecution/outputDelta", itemId="c1", delta="partial"),
        _notif("item/completed", item=_item("commandExecution", id="c1", command="/bin/bash -lc env",
                                            status="completed", exitCode=0,
                                            aggregatedOutput=f"hello\nKEY=$ENV:{KEY_ENV}\n")),
        _notif("turn/diff/updated", diff="diff --git a/x b/x\n-old\n+new 1\n"),
        _notif("turn/diff/updated", diff="diff --git a/x b/x\n-old\n+new 2\n"),
        _notif("thread/tokenUsage/updated", tokenUsage={"total": {"totalTokens": 15, "inputTokens": 10}}),
        _completed()]}
    result, events, env = run_mock(tmp_path, script)
    terminal = _one_terminal(events)
    assert terminal["status"] == "completed" and terminal["failure_kind"] is None
    assert terminal["usage"] == {"totalTokens": 15, "inputTokens": 10}
    phases = [d["phase"] for d in of_type(events, "backend_status")]
    assert phases[:4] == ["starting", "ready", "thread_started", "turn_started"]
    text = of_type(events, "assistant_message")[0]["text"]
    assert text.startswith("Hello key [REDACTED]")
    for secret in (CANARY, "abcdefghijklmnop0123", "hunter2pass", "QWERTYUIOP12", "zzzzzzzz1",
                   base64.b64encode(CANARY.encode()).decode()):
        assert secret not in text
    output = of_type(events, "command_output")[0]
    assert output["output"] == "hello\nKEY=[REDACTED]\n"  # aggregatedOutput, not the delta
    assert output["exit_code"] == 0 and output["status"] == "completed"
    diffs = of_type(events, "diff")
    assert len(diffs) == 1 and "+new 2" in diffs[0]["diff"]  # the latest full diff, once
    assert result["status"] == "completed" and result["events_total"] == len(events)
    everything = everything_text(result, events, env)
    assert CANARY not in everything
    log = Path(result["log"]).read_text()
    assert "stderr ERROR auth [REDACTED]" in log and "\x1b[" not in log  # stderr: redacted, no ANSI
    assert not Path(env.runs_dir, "run-1").exists()  # the private CODEX_HOME is gone


def test_codex_home_is_private_and_holds_enforced_config(tmp_path):
    # The mock reports what CODEX_HOME held while it ran (mode and config) as an agent message.
    script = {"on_turn": [{"raw": "not json"}]}  # ends the run quickly
    sec = write_projection(tmp_path)
    env = environment(tmp_path, mock_binary(tmp_path, script), sec)
    seen = {}
    from caldera.backends.codex import appserver

    original = appserver.AppServer.start

    def spy(self):
        import os
        import stat as st
        home = Path(self.env["CODEX_HOME"])
        seen["mode"] = st.S_IMODE(os.stat(home).st_mode)
        seen["config"] = (home / "config.toml").read_text()
        seen["env"] = dict(self.env)
        seen["tmp_mode"] = st.S_IMODE(os.stat(self.env["TMPDIR"]).st_mode)
        return original(self)

    appserver.AppServer.start = spy
    try:
        execute(request(workspace(tmp_path)), env)
    finally:
        appserver.AppServer.start = original
    import tomllib
    config = tomllib.loads(seen["config"])
    assert seen["mode"] == 0o700
    assert config["shell_environment_policy"]["exclude"] == [KEY_ENV]
    assert config["features"]["unbounded_connection_retries"] is False
    assert config["analytics"]["enabled"] is False
    assert config["model_providers"]["fake"]["stream_max_retries"] == 0
    assert seen["env"][KEY_ENV] == CANARY
    assert set(seen["env"]) == {"PATH", "HOME", "LANG", "CODEX_HOME", "TMPDIR", KEY_ENV}  # nothing else leaks in
    # A private TMPDIR in the run dir (removed with it), not the shared /tmp.
    assert seen["env"]["TMPDIR"].startswith(env.runs_dir) and seen["tmp_mode"] == 0o700
    assert not Path(env.runs_dir, "run-1").exists()


def test_long_assistant_text_is_split_into_8k_parts(tmp_path):
    text = "é" * 10000 + "END"  # 20 KiB of UTF-8
    script = {"on_turn": [_notif("item/completed", item=_item("agentMessage", text=text)), _completed()]}
    _, events, _ = run_mock(tmp_path, script)
    parts = of_type(events, "assistant_message")
    assert [p["part"] for p in parts] == [1, 2, 3] and all(p["parts"] == 3 for p in parts)
    assert all(len(p["text"].encode()) <= 8192 for p in parts)
    assert "".join(p["text"] for p in parts) == text


def test_huge_command_output_capped_and_diff_capped(tmp_path):
    script = {"on_turn": [
        _notif("item/completed", item=_item("commandExecution", command="yes", status="completed",
                                            exitCode=0, aggregatedOutput="y\n" * 100000)),
        _notif("turn/diff/updated", diff="+" + "x" * 200000), _completed()]}
    result, events, _ = run_mock(tmp_path, script)
    outputs = of_type(events, "command_output")
    assert len(outputs) == 4 and outputs[-1]["truncated"] is True and outputs[-1]["total_bytes"] == 200000
    diff = of_type(events, "diff")[0]
    assert len(diff["diff"].encode()) == 64 * 1024 and diff["truncated"] is True and diff["bytes"] == 200001
    assert Path(result["log"]).stat().st_size > 200000  # the whole transcript is in the run log


def test_will_retry_is_progress_then_completes(tmp_path):
    retry = {"message": "Reconnecting... 1/2",
             "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": 503}}}
    script = {"on_turn": [_notif("error", error=retry, willRetry=True),
                          _notif("item/completed", item=_item("agentMessage", text="ok")), _completed()]}
    _, events, _ = run_mock(tmp_path, script)
    retrying = [d for d in of_type(events, "backend_status") if d["phase"] == "retrying"]
    assert retrying == [{"phase": "retrying", "attempt": 1, "max_attempts": 2, "message": "Reconnecting... 1/2",
                         "cause": "provider-unavailable", "details": None}]
    assert of_type(events, "error") == []
    assert _one_terminal(events)["status"] == "completed"


def test_interrupted_items_are_closed_at_the_end(tmp_path):
    script = {"on_turn": [
        _notif("item/started", item=_item("commandExecution", id="c9", command="sleep 100")),
        _notif("item/commandExecution/outputDelta", itemId="c9", delta="tick\n"),
        _notif("turn/completed", turn={"id": "$TURN", "status": "interrupted", "error": None})]}
    _, events, _ = run_mock(tmp_path, script)
    out = of_type(events, "command_output")
    assert out == [{"item_id": "c9", "command": "sleep 100", "status": "incomplete", "exit_code": None,
                    "duration_ms": None, "output": "tick\n"}]
    terminal = _one_terminal(events)
    assert terminal["status"] == "cancelled" and terminal["failure_kind"] == fk.CANCELLED


def test_approval_requests_are_declined_never_hang(tmp_path):
    ask = {"method": "item/commandExecution/requestApproval", "id": 0,
           "params": {"threadId": "$THREAD", "turnId": "$TURN", "itemId": "c1", "command": "rm -rf /"}}
    unknown = {"method": "item/tool/requestUserInput", "id": 1, "params": {}}
    script = {"on_turn": [{"request": ask}, {"request": unknown}, _completed()]}
    _, events, _ = run_mock(tmp_path, script, approval="never")
    replies = [json.loads(m["text"]) for m in of_type(events, "assistant_message")]
    assert replies[0] == {"id": 0, "result": {"decision": "decline"}}
    assert replies[1]["id"] == 1 and replies[1]["error"]["code"] == -32601
    declined = [d for d in of_type(events, "tool_call") if d["tool"] == "approval"]
    assert [d["request"] for d in declined] == ["item/commandExecution/requestApproval", "item/tool/requestUserInput"]
    assert _one_terminal(events)["status"] == "completed"


# ---------------------------------------------------------------- T2: failure kinds

HTTP = "unexpected status {code}: x, url: http://127.0.0.1:1/v1/responses"
FAILURES = [
    ("401", {"message": HTTP.format(code="401 Unauthorized"),
             "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 401}}},
     fk.PROVIDER_AUTH_FAILED),
    ("403", {"message": HTTP.format(code="403 Forbidden"),
             "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 403}}},
     fk.PROVIDER_AUTH_FAILED),
    ("unauthorized", {"message": "no", "codexErrorInfo": "unauthorized"}, fk.PROVIDER_AUTH_FAILED),
    ("429", {"message": "exceeded retry limit, last status: 429 Too Many Requests",
             "codexErrorInfo": {"responseTooManyFailedAttempts": {"httpStatusCode": 429}}}, fk.PROVIDER_RATE_LIMITED),
    ("quota", {"message": "Quota exceeded.", "codexErrorInfo": "usageLimitExceeded"}, fk.PROVIDER_RATE_LIMITED),
    ("503", {"message": HTTP.format(code="503 Service Unavailable"),
             "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 503}}}, fk.PROVIDER_UNAVAILABLE),
    ("500", {"message": "We're currently experiencing high demand", "codexErrorInfo": "internalServerError"},
     fk.PROVIDER_UNAVAILABLE),
    ("stream-5xx", {"message": "stream disconnected",
                    "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": 502}}},
     fk.PROVIDER_UNAVAILABLE),
    ("cut", {"message": "stream disconnected before completion: Transport error", "codexErrorInfo": "other"},
     fk.PROVIDER_UNAVAILABLE),
    ("idle", {"message": "stream disconnected before completion: idle timeout waiting for SSE",
              "codexErrorInfo": "other"},
     fk.PROVIDER_UNAVAILABLE),
    ("refused", {"message": "Connection failed: error sending request",
                 "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": None}}}, fk.PROVIDER_UNAVAILABLE),
    ("temporary", {"message": "provider temporary unavailable", "codexErrorInfo": "other"}, fk.PROVIDER_UNAVAILABLE),
    ("missing-env", {"message": f"Missing environment variable: `{KEY_ENV}`.", "codexErrorInfo": "other"},
     fk.SECRET_UNAVAILABLE),
    ("400", {"message": '{"error": {"message": "HTTP 400"}}', "codexErrorInfo": "other"}, fk.BACKEND_FAILED),
    ("404", {"message": "unexpected status 404", "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 404}}},
     fk.BACKEND_FAILED),
]


@pytest.mark.parametrize("name,error,kind", FAILURES, ids=[f[0] for f in FAILURES])
def test_turn_errors_map_to_failure_kinds(tmp_path, name, error, kind):
    retry = None
    if name == "503":  # with stream retries on, 503 first arrives as willRetry responseStreamDisconnected{503}
        retry = {"message": "Reconnecting... 1/1",
                 "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": 503}}}
    result, events, _ = run_mock(tmp_path, _failed(error, retry))
    terminal = _one_terminal(events)
    tries = 2 if retry else 1  # a provider's failure says how often it was asked: the retry, and the last
    message = f"{error['message']}; {tries} {'try' if tries == 1 else 'tries'}" if kind in fk.PROVIDER_KINDS \
        else error["message"]
    assert terminal == {"status": "failed", "failure_kind": kind, "message": message,
                        "duration_ms": terminal["duration_ms"]}
    errors = of_type(events, "error")
    assert len(errors) == 1 and errors[0]["failure_kind"] == kind
    assert errors[0].get("tries") == (tries if kind in fk.PROVIDER_KINDS else None)
    assert result["failure_kind"] == kind
    if kind == fk.PROVIDER_UNAVAILABLE:
        assert fk.BACKEND_FAILED not in json.dumps(events)


def _kind(events):
    return _one_terminal(events)["failure_kind"]


def test_missing_secret_is_secret_unavailable_before_spawn(tmp_path):
    marker = tmp_path / "spawned"
    sec = write_projection(tmp_path, key=None)
    binary = tmp_path / "codex"
    binary.write_text(f"#!/bin/sh\ntouch {marker}\n")
    binary.chmod(0o755)
    env = environment(tmp_path, str(binary), sec)
    result, events = execute(request(workspace(tmp_path)), env)
    assert _kind(events) == fk.SECRET_UNAVAILABLE
    assert "env/FAKE_PROVIDER_API_KEY is missing" in events[-1]["data"]["message"]
    assert not marker.exists()


def test_no_projection_and_no_gateway_is_secret_unavailable(tmp_path):
    env = environment(tmp_path, mock_binary(tmp_path, {}), tmp_path / "nothing")
    _, events = execute(request(workspace(tmp_path)), env)
    assert _kind(events) == fk.SECRET_UNAVAILABLE


def test_non_json_stdout_is_json_parse_error(tmp_path):
    _, events, _ = run_mock(tmp_path, {"on_turn": [{"raw": "Traceback: oops"}]})
    assert _kind(events) == fk.BACKEND_JSON_PARSE_ERROR


def test_json_that_is_not_an_object_is_protocol_error(tmp_path):
    _, events, _ = run_mock(tmp_path, {"on_turn": [{"raw": "[1, 2, 3]"}]})
    assert _kind(events) == fk.BACKEND_PROTOCOL_ERROR


@pytest.mark.parametrize("script", [
    {"on_turn": [_notif("turn/completed", turn={"id": "$TURN"})]},  # turn/completed without turn.status
    {"thread_start": "no_result"},  # a response without result
    {"thread_start": {"thread": {}}},  # a result without thread.id
], ids=["completed-no-status", "response-no-result", "thread-no-id"])
def test_missing_required_fields_is_response_invalid(tmp_path, script):
    _, events, _ = run_mock(tmp_path, script)
    assert _kind(events) == fk.BACKEND_RESPONSE_INVALID


def test_bad_binary_path_is_spawn_failed(tmp_path):
    env = environment(tmp_path, str(tmp_path / "no-such-codex"), write_projection(tmp_path))
    _, events = execute(request(workspace(tmp_path)), env)
    assert _kind(events) == fk.BACKEND_SPAWN_FAILED


def test_exit_before_initialize_is_spawn_failed_with_stderr_hint(tmp_path):
    _, events, _ = run_mock(tmp_path, {"exit_before_init": 2})
    data = events[-1]["data"]
    assert data["failure_kind"] == fk.BACKEND_SPAWN_FAILED and "rc 2" in data["message"]
    assert "Usage: codex app-server" in data["message"]


def test_exit_before_initialize_names_the_stderr_that_comes_after_stdout_eof(tmp_path):
    # Two readers, two pipes: the EOF on stdout can be seen before stderr's last lines are read.
    _, events, _ = run_mock(tmp_path, {"exit_before_init": 2, "late_stderr": 0.5})
    data = events[-1]["data"]
    assert data["failure_kind"] == fk.BACKEND_SPAWN_FAILED
    assert "Usage: codex app-server" in data["message"]


def test_exit_mid_turn_names_its_stderr(tmp_path):
    _, events, _ = run_mock(tmp_path, {"on_turn": [{"exit": 3, "late_stderr": [0.5, "panic: model stream broke"]}]})
    assert _kind(events) == fk.BACKEND_FAILED
    assert "rc 3" in events[-1]["data"]["message"] and "panic: model stream broke" in events[-1]["data"]["message"]


def test_exit_mid_turn_is_backend_failed(tmp_path):
    _, events, _ = run_mock(tmp_path, {"on_turn": [{"exit": 3}]})
    assert _kind(events) == fk.BACKEND_FAILED and "rc 3" in events[-1]["data"]["message"]


def test_rpc_error_on_thread_start_is_backend_failed(tmp_path):
    _, events, _ = run_mock(tmp_path, {"thread_start": "error"})
    assert _kind(events) == fk.BACKEND_FAILED and "failed to load configuration" in events[-1]["data"]["message"]


def test_policy_timeout_interrupts_then_backend_timeout(tmp_path):
    # The mock honours turn/interrupt: the turn ends interrupted, reported as the timeout it was.
    _, events, _ = run_mock(tmp_path, {"on_turn": []}, timeout_seconds=1)
    assert _kind(events) == fk.BACKEND_TIMEOUT
    assert any(d.get("phase") == "interrupting" for d in of_type(events, "backend_status"))


def test_timeout_with_deaf_backend_kills_it(tmp_path):
    # The mock ignores turn/interrupt: after the grace the process group is killed.
    result, events, _ = run_mock(tmp_path, {"on_turn": [], "interrupt": "ignore"}, timeout_seconds=1)
    assert _kind(events) == fk.BACKEND_TIMEOUT and events[-1]["data"]["status"] == "failed"
    assert "killing the backend" in Path(result["log"]).read_text()


def test_interrupt_while_running_is_cancelled(tmp_path):
    sec = write_projection(tmp_path)
    env = environment(tmp_path, mock_binary(tmp_path, {"on_turn": []}), sec)
    registry = service.ActiveRuns()
    box = {}
    thread = threading.Thread(
        target=lambda: box.update(out=execute(request(workspace(tmp_path)), env, registry=registry)))
    thread.start()
    stop = threading.Event()
    while registry.get("run-1") is None or registry.get("run-1").context is None:
        stop.wait(0.01)
    stop.wait(0.3)
    registry.get("run-1").interrupt()
    thread.join(10)
    result, events = box["out"]
    assert result["status"] == "cancelled" and _kind(events) == fk.CANCELLED
    assert registry.get("run-1") is None


def test_command_cancel_is_cancelled_and_command_deadline_is_timeout(tmp_path):
    sec = write_projection(tmp_path)
    env = environment(tmp_path, mock_binary(tmp_path, {"on_turn": []}), sec)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    _, events = execute(request(workspace(tmp_path)), env, cancel=cancel)
    assert _kind(events) == fk.CANCELLED
    # A deadline close ahead shortens the policy timeout: the run ends as a timeout on its own.
    _, events = execute(request(workspace(tmp_path), run_id="run-2"), env, deadline=time.monotonic() + 6.5)
    assert _kind(events) == fk.BACKEND_TIMEOUT


def test_every_failure_kind_is_reachable_and_known():
    reached = {f[2] for f in FAILURES} | {fk.SECRET_UNAVAILABLE, fk.BACKEND_JSON_PARSE_ERROR,
                                          fk.BACKEND_PROTOCOL_ERROR, fk.BACKEND_RESPONSE_INVALID,
                                          fk.BACKEND_SPAWN_FAILED, fk.BACKEND_TIMEOUT, fk.CANCELLED}
    assert reached == set(fk.FAILURE_KINDS) and len(fk.FAILURE_KINDS) == 11


def test_a_stdout_line_nested_too_deep_is_one_failed_turn(tmp_path):
    # A hostile (or broken) backend: one line of 20,000 nested arrays. The reader thread lives,
    # the turn ends with one terminal_status naming the limit.
    _, events, _ = run_mock(tmp_path, {"on_turn": [{"raw": "[" * 20000 + "]" * 20000}]})
    data = _one_terminal(events)
    assert data["failure_kind"] == fk.BACKEND_JSON_PARSE_ERROR
    assert "nested deeper than 64 levels" in data["message"]


def test_a_stalled_stream_ends_the_turn_at_once_instead_of_being_retried(tmp_path):
    """Codex's idle timeout is the stall bound; each retry of a stalled stream would wait as
    long again (3 x 60 s with the defaults): the first ends the turn, and Codex with it."""
    idle = {"message": "Reconnecting... 1/2", "codexErrorInfo": "other",
            "additionalDetails": "stream disconnected before completion: idle timeout waiting for SSE"}
    script = {"on_turn": [_notif("error", error=idle, willRetry=True, threadId="$THREAD", turnId="$TURN")]}
    sec = write_projection(tmp_path)
    env = environment(tmp_path, mock_binary(tmp_path, script), sec, CALDERA_PROVIDER_STALL_SECONDS="7")
    result, events = execute(request(workspace(tmp_path)), env)
    terminal = _one_terminal(events)
    assert terminal["failure_kind"] == fk.PROVIDER_UNAVAILABLE and "nothing for 7 s" in terminal["message"]
    [error] = of_type(events, "error")
    assert error["tries"] == 1 and error["message"].endswith("; 1 try")
    assert not [s for s in of_type(events, "backend_status") if s["phase"] == "retrying"]
