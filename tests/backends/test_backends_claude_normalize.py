"""Claude Code's stream-json messages -> the standard events and failure kinds, without the
CLI (the shapes are those 2.1.332 sends: code-agents-notes.md and the real-CLI tests)."""
from __future__ import annotations

import pytest

from caldera.backends import failures as fk
from caldera.backends.claude_code.normalize import Normalizer, classify
from caldera.backends.events import EventSink
from caldera.redact import Redactor

KEY = "sk-ant-secret-0123456789abcdef"


def _normalizer():
    events = []
    return Normalizer(EventSink("run-1", Redactor([KEY]), listeners=[events.append])), events


def _tool(block_id, name, args):
    return {"type": "assistant", "message": {"id": "m1", "content": [
        {"type": "tool_use", "id": block_id, "name": name, "input": args}]}}


def _result(block_id, text, is_error=False):
    return {"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": block_id, "content": text, "is_error": is_error}]}}


@pytest.mark.parametrize("status,error,text,kind", [
    (401, None, "", fk.PROVIDER_AUTH_FAILED), (403, None, "", fk.PROVIDER_AUTH_FAILED),
    (429, None, "", fk.PROVIDER_RATE_LIMITED), (529, None, "", fk.PROVIDER_UNAVAILABLE),
    (500, None, "", fk.PROVIDER_UNAVAILABLE), (404, None, "service unavailable", fk.BACKEND_FAILED),
    (None, "authentication_failed", "", fk.PROVIDER_AUTH_FAILED), (None, "rate_limit", "", fk.PROVIDER_RATE_LIMITED),
    (None, None, "API Error: Connection dropped (ECONNRESET)", fk.PROVIDER_UNAVAILABLE),
    (None, None, "stream_truncated", fk.PROVIDER_UNAVAILABLE), (True, None, "", fk.BACKEND_FAILED),
])
def test_classify_the_status_first_then_the_error_name_then_words(status, error, text, kind):
    assert classify(status, error, text) == kind


def test_tools_open_and_close_as_events_with_their_input_redacted():
    norm, events = _normalizer()
    norm.handle(_tool("t1", "Bash", {"command": f"curl -H 'x-api-key: {KEY}' x"}))
    norm.handle(_result("t1", "Exit code 7\ncurl: failed", is_error=True))
    norm.handle(_tool("t2", "Read", {"file_path": "/w/README.md"}))
    norm.handle(_result("t2", "hello"))
    norm.handle(_tool("t3", "Write", {"file_path": "/w/a.txt", "content": "x"}))
    norm.handle({"type": "system", "subtype": "permission_denied", "tool_use_id": "t3", "tool_name": "Write",
                 "decision_reason": "no approval surface"})
    got = [(e["type"], {k: e["data"].get(k) for k in ("tool", "status", "exit_code", "path", "changes")})
           for e in events]
    assert got == [
        ("tool_call", {"tool": "command", "status": "started", "exit_code": None, "path": None, "changes": None}),
        ("command_output", {"tool": None, "status": "failed", "exit_code": 7, "path": None, "changes": None}),
        ("tool_call", {"tool": "read", "status": "started", "exit_code": None, "path": "/w/README.md",
                       "changes": None}),
        ("tool_call", {"tool": "read", "status": "completed", "exit_code": None, "path": "/w/README.md",
                       "changes": None}),
        ("tool_call", {"tool": "file_change", "status": "started", "exit_code": None, "path": None,
                       "changes": [{"path": "/w/a.txt", "kind": "write"}]}),
        ("tool_call", {"tool": "file_change", "status": "denied", "exit_code": None, "path": None,
                       "changes": [{"path": "/w/a.txt", "kind": "write"}]})]
    assert KEY not in repr(events) and "[REDACTED]" in events[0]["data"]["command"]
    assert norm.open_tools == {}


def test_a_provider_error_told_as_text_then_a_success_result_is_its_failure_kind():
    norm, _ = _normalizer()
    norm.handle({"type": "assistant", "is_api_error_message": True, "api_error_status": 401,
                 "message": {"content": [{"type": "text", "text": "Invalid API key"}]}})
    result = {"type": "result", "subtype": "success", "is_error": True, "api_error_status": 401,
              "terminal_reason": "api_error", "result": "Invalid API key · Fix external API key"}
    assert norm.outcome(result, None) == ("failed", fk.PROVIDER_AUTH_FAILED, result["result"])
    assert norm.outcome({"subtype": "success", "is_error": False}, None)[0] == "completed"
    aborted = {"subtype": "error_during_execution", "is_error": True, "terminal_reason": "aborted_streaming"}
    assert norm.outcome(aborted, "cancelled")[:2] == ("cancelled", fk.CANCELLED)
    with pytest.raises(fk.BackendFailure) as caught:
        norm.outcome({"is_error": False}, None)
    assert caught.value.kind == fk.BACKEND_RESPONSE_INVALID


def test_a_message_without_content_is_response_invalid_and_open_tools_close_at_the_end():
    norm, events = _normalizer()
    with pytest.raises(fk.BackendFailure) as caught:
        norm.handle({"type": "assistant", "message": {"id": "m"}})
    assert caught.value.kind == fk.BACKEND_RESPONSE_INVALID
    norm.handle(_tool("t9", "Bash", {"command": "sleep 100"}))
    norm.finish("cancelled", fk.CANCELLED, "the run was cancelled")
    assert [(e["type"], e["data"].get("status")) for e in events] == [
        ("tool_call", "started"), ("tool_call", "incomplete"), ("terminal_status", "cancelled")]
