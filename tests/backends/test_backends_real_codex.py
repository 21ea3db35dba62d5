"""T3: what the real Codex CLI (`codex app-server`, 0.169.0) does beyond the contract suite
(test_backends_contract.py runs the shared scenarios: provider failures, missing key,
bad binary, timeout, interrupt, `caldera turn`), against the fake Responses provider on
127.0.0.1: Codex's phases, apply_patch and its diff, stream retries, connection refused,
a declined approval. `.ci/run` installs Codex and sets CALDERA_CODEX_BIN; without it
these tests skip, unless CALDERA_REQUIRE_CODEX=1 makes that a failure.

A canary key is planted in the projection; it must appear nowhere: events, run log,
finish result, CLI stdout/stderr, requests the model received (so the agent's own
commands never saw it), and nothing may be left in the run directory.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from backends_fake_provider import FakeProvider
from backends_helpers import (
    CANARY,
    KEY_ENV,
    environment,
    everything_text,
    execute,
    of_type,
    request,
    types,
    workspace,
    write_projection,
)

from caldera.backends import failures as fk

CODEX_BIN = os.environ.get("CALDERA_CODEX_BIN")


def _require():
    if CODEX_BIN and os.access(CODEX_BIN, os.X_OK):
        return
    reason = f"the real Codex binary is not available (CALDERA_CODEX_BIN={CODEX_BIN!r}); run .ci/install-codex.sh"
    if os.environ.get("CALDERA_REQUIRE_CODEX") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _codex_present():
    _require()


def real_run(tmp_path, script, secrets_kw=None, **policy):
    with FakeProvider(script) as provider:
        sec = write_projection(tmp_path, base_url=provider.url, **(secrets_kw or {}))
        env = environment(tmp_path, CODEX_BIN, sec)
        result, events = execute(request(workspace(tmp_path), **policy), env)
    return result, events, env, provider


def assert_no_leak(result, events, env, provider=None):
    text = everything_text(result, events, env)
    assert CANARY not in text
    assert not Path(env.runs_dir, result["run_id"]).exists()  # CODEX_HOME removed after the run
    if provider is not None:
        for req in provider.requests:
            assert CANARY not in req["body"]


def terminal(events):
    assert types(events).count("terminal_status") == 1 and events[-1]["type"] == "terminal_status"
    return events[-1]["data"]


def test_text_turn(tmp_path):
    result, events, env, provider = real_run(tmp_path, [{"text": "Hello from the fake model."}])
    assert terminal(events)["status"] == "completed", events
    assert [m["text"] for m in of_type(events, "assistant_message")] == ["Hello from the fake model."]
    status = of_type(events, "backend_status")
    assert {"starting", "ready", "thread_started", "turn_started"} <= {s["phase"] for s in status}
    assert next(s for s in status if s["phase"] == "thread_started")["model"] == "gpt-5.5"
    # The key was really used (as a bearer token to the provider) and still leaked nowhere.
    assert provider.posts[0]["headers"].get("authorization") == f"Bearer {CANARY}"
    assert result["status"] == "completed" and result["events_total"] == len(events)
    assert_no_leak(result, events, env, provider)


def test_tool_turn_command_output_diff_and_no_key_for_the_agents_commands(tmp_path):
    (workspace(tmp_path) / "README.md").write_text("hello\n")
    script = [
        {"call": "exec_command", "args": {"cmd": f"echo key=${KEY_ENV}; env; echo hello; echo oops >&2"}},
        {"custom": "apply_patch", "input": "*** Begin Patch\n*** Update File: README.md\n@@\n-hello\n+hello world\n"
                                           "*** Add File: NEW.txt\n+new file\n*** End Patch\n"},
        {"text": "done"}]
    result, events, env, provider = real_run(tmp_path, script)
    assert terminal(events)["status"] == "completed", events
    output = of_type(events, "command_output")
    assert len(output) == 1 and output[0]["exit_code"] == 0
    assert "key=\n" in output[0]["output"] and "hello" in output[0]["output"]  # the variable was empty
    assert KEY_ENV not in output[0]["output"]  # not even its name is in the agent's environment
    diff = of_type(events, "diff")
    assert len(diff) == 1 and "+hello world" in diff[0]["diff"] and "NEW.txt" in diff[0]["diff"]
    assert (workspace(tmp_path) / "README.md").read_text() == "hello world\n"
    tools = [t["tool"] for t in of_type(events, "tool_call")]
    assert "command" in tools and "file_change" in tools
    assert len(provider.posts) == 3
    assert_no_leak(result, events, env, provider)


def test_503_with_stream_retries_is_progress_then_provider_unavailable(tmp_path):
    with FakeProvider([{"status": 503}]) as provider:
        sec = write_projection(tmp_path, base_url=provider.url)
        env = environment(tmp_path, CODEX_BIN, sec, CALDERA_CODEX_STREAM_MAX_RETRIES="1")
        result, events = execute(request(workspace(tmp_path)), env)
    data = terminal(events)
    assert data["failure_kind"] == fk.PROVIDER_UNAVAILABLE, events
    retries = [s for s in of_type(events, "backend_status") if s["phase"] == "retrying"]
    assert retries and retries[0]["cause"] == fk.PROVIDER_UNAVAILABLE and retries[0]["max_attempts"] == 1
    assert len(provider.posts) == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_fails_fast_without_endless_reconnect(tmp_path):
    sec = write_projection(tmp_path, base_url=f"http://127.0.0.1:{_closed_port()}/v1")
    env = environment(tmp_path, CODEX_BIN, sec)
    result, events = execute(request(workspace(tmp_path), timeout_seconds=60), env)
    data = terminal(events)
    # Not backend-timeout: Codex gave up by itself (unbounded_connection_retries = false).
    assert data["failure_kind"] == fk.PROVIDER_UNAVAILABLE, events
    assert data["duration_ms"] < 60000
    assert_no_leak(result, events, env)


def test_approval_request_is_declined_and_the_turn_goes_on(tmp_path):
    # on-request + read-only: Codex asks before apply_patch; the runtime declines, nothing is written.
    (workspace(tmp_path) / "README.md").write_text("hello\n")
    script = [{"custom": "apply_patch", "input": "*** Begin Patch\n*** Update File: README.md\n@@\n-hello\n+changed\n"
                                                 "*** End Patch\n"},
              {"text": "ok"}]
    with FakeProvider(script) as provider:
        sec = write_projection(tmp_path, base_url=provider.url)
        env = environment(tmp_path, CODEX_BIN, sec, CALDERA_RUN_ALLOW_APPROVAL="true")
        result, events = execute(request(workspace(tmp_path), approval="on-request", sandbox="read-only"), env)
    assert terminal(events)["status"] == "completed", events
    approvals = [t for t in of_type(events, "tool_call") if t["tool"] == "approval"]
    assert [a["request"] for a in approvals] == ["item/fileChange/requestApproval"]
    assert (workspace(tmp_path) / "README.md").read_text() == "hello\n"
    assert_no_leak(result, events, env, provider)


# ------------------------------------------------------------------ ClawManager's AI gateway

CATALOGUE = ["auto", "gpt-4.1", "kimi-k2.6"]


def gateway_run(tmp_path, model=None, catalogue=CATALOGUE, **variables):
    """A run with no projection, on the AI gateway as ClawManager injects it (SPEC section 10),
    against a fake gateway that refuses any model its catalogue does not list."""
    with FakeProvider([{"text": "Hello from the gateway."}], models=catalogue) as provider:
        injected = {"CLAWMANAGER_LLM_BASE_URL": provider.url, "CLAWMANAGER_LLM_API_KEY": CANARY,
                    "CLAWMANAGER_LLM_MODEL": json.dumps(catalogue), "CLAWMANAGER_LLM_PROVIDER": "openai-compatible",
                    "OPENAI_BASE_URL": provider.url, "OPENAI_API_KEY": CANARY, "OPENAI_MODEL": "auto"}
        injected.update(variables)
        env = environment(tmp_path, CODEX_BIN, None, **{k: v for k, v in injected.items() if v is not None})
        req = request(workspace(tmp_path))
        if model is not None:
            req["model"] = model
        result, events = execute(req, env)
    return result, events, env, provider


def _models_asked(provider):
    return [json.loads(post["body"])["model"] for post in provider.posts]


@pytest.mark.parametrize("model, variables, asked", [
    (None, {}, "auto"),  # OPENAI_MODEL, the default model (0.1.0 sent the catalogue itself: refused)
    ("gpt-4.1", {}, "gpt-4.1"),  # the payload's, the catalogue lists it
    (None, {"OPENAI_MODEL": None, "CLAWMANAGER_LLM_MODEL": '["kimi-k2.6", "auto"]'}, "kimi-k2.6"),  # its first
])
def test_a_turn_on_the_gateway_asks_for_a_model_of_its_catalogue(tmp_path, model, variables, asked):
    result, events, env, provider = gateway_run(tmp_path, model, **variables)
    assert terminal(events)["status"] == "completed", events
    assert _models_asked(provider) and set(_models_asked(provider)) == {asked}
    assert provider.posts[0]["headers"].get("authorization") == f"Bearer {CANARY}"
    assert_no_leak(result, events, env, provider)


def test_a_model_the_catalogue_does_not_list_is_refused_before_codex_starts(tmp_path):
    result, events, env, provider = gateway_run(tmp_path, "gpt-9")
    assert result["status"] == "blocked" and provider.requests == []  # nothing reached the gateway
    assert result["message"] == ("model 'gpt-9' is not in the AI gateway's catalogue "
                                 "(CLAWMANAGER_LLM_MODEL: auto, gpt-4.1, kimi-k2.6)")
    assert_no_leak(result, events, env, provider)


def test_a_catalogue_that_is_not_a_json_list_is_ignored(tmp_path):
    result, events, env, provider = gateway_run(tmp_path, "gpt-4.1", CLAWMANAGER_LLM_MODEL="gpt-4.1,auto")
    assert terminal(events)["status"] == "completed", events
    assert set(_models_asked(provider)) == {"gpt-4.1"}  # not refused: there is no catalogue to refuse it
