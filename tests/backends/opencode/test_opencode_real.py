"""Real turns of the real OpenCode CLI (`opencode serve`, opencode-ai 1.18.33) against a fake
chat-completions provider on 127.0.0.1. `.ci/install-opencode.sh` installs it; without
CALDERA_OPENCODE_BIN these tests skip, unless CALDERA_REQUIRE_OPENCODE=1 makes that a failure.

Each scenario is written as the contract test of the backends runs them: configure the
fake provider, run one turn through `service.execute`, assert on the normalised events
and the finish result. The turns share one agent's server (a `ServerOwner`, as the
daemon holds it) and one provider; a canary key is planted in the projection and must
appear nowhere (events, run log, finish result, the requests the model received).
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from opencode_fake_provider import FakeChatProvider
from opencode_helpers import (
    CANARY,
    KEY_ENV,
    assert_no_leak,
    environment,
    everything_text,
    execute,
    of_type,
    phases,
    request,
    require_opencode,
    terminal,
    write_projection,
)

from caldera.backends import failures as fk
from caldera.backends import service
from caldera.backends.opencode.owner import ServerOwner


class Harness:
    """One agent: its fake provider, its projection, its server owner, its workspace."""

    def __init__(self, root: Path, provider: FakeChatProvider):
        self.root = root
        self.provider = provider
        self.secrets = write_projection(root, provider.url)
        self.owner = ServerOwner(root / "state" / "runs", idle_seconds=600)
        self.ws = root / "ws"
        self.ws.mkdir(exist_ok=True)
        self.count = 0

    def env(self, **extra: str) -> Any:
        return environment(self.root, self.secrets, owner=self.owner, **extra)

    def run(self, script: list[dict[str, Any]], prompt: str = "Say hello", env: Any = None,
            **policy: Any) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
        self.provider.set_script(script)
        self.count += 1
        env = env or self.env()
        result, events = execute(request(self.ws, run_id=f"run-{self.count}", prompt=prompt, **policy), env)
        return result, events, env


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    require_opencode()
    root = tmp_path_factory.mktemp("opencode-agent")
    with FakeChatProvider([{"text": "unused"}]) as provider:
        harness = Harness(root, provider)
        yield harness
        harness.owner.close()
    assert not list((root / "state" / "runs").iterdir())  # every server dir removed


@pytest.fixture
def agent(shared):
    require_opencode()
    return shared


# ---------------------------------------------------------------- the contract's scenarios

def test_text_turn(agent):
    result, events, env = agent.run([{"text": "Hello from the fake model."}])
    data = terminal(events)
    assert data["status"] == "completed" and result["status"] == "completed", events
    assert [m["text"] for m in of_type(events, "assistant_message")] == ["Hello from the fake model."]
    assert {"starting", "ready", "thread_started", "turn_started"} <= set(phases(events))
    started = of_type(events, "backend_status")[0]
    assert started["backend"] == "opencode" and started["model"] == "fake-model" and started["server"] == "agent"
    assert data["usage"]["totalTokens"] == 15
    last = agent.provider.main[-1]
    assert last["headers"]["authorization"] == f"Bearer {CANARY}"  # the forwarder added the real key
    assert '"stream_options":{"include_usage":true}' in last["body"].replace(" ", "")
    assert result["events_total"] == len(events)
    assert_no_leak(result, events, env, agent.provider)
    # The turn's session left the agent's server with the turn.
    session = next(d["thread_id"] for d in of_type(events, "backend_status") if d["phase"] == "thread_started")
    listed = agent.owner.server.call("GET", "/session", directory=str(agent.ws))
    assert session not in json.dumps(listed)


def test_tool_turn_command_output_diff_and_no_key_for_the_agents_commands(agent):
    (agent.ws / "README.md").write_text("hello\n")
    script = [
        {"call": "bash", "args": {"command": f"echo key=${KEY_ENV}; env", "description": "show the environment"}},
        {"call": "write", "args": {"filePath": str(agent.ws / "NEW.txt"), "content": "new file\n"}},
        {"call": "edit", "args": {"filePath": str(agent.ws / "README.md"), "oldString": "hello",
                                  "newString": "hello world"}},
        {"text": "done"}]
    result, events, env = agent.run(script)
    assert terminal(events)["status"] == "completed", events
    output = of_type(events, "command_output")
    assert len(output) == 1 and output[0]["exit_code"] == 0 and output[0]["status"] == "completed"
    assert "key=\n" in output[0]["output"] and "OPENCODE_CONFIG=" in output[0]["output"]
    assert KEY_ENV not in output[0]["output"] and "apiKey" not in output[0]["output"]
    # The server's password is in the agent's environment (OpenCode reads it there): masked in every event.
    assert "OPENCODE_SERVER_PASSWORD=[REDACTED]" in output[0]["output"]
    assert agent.owner.server.password not in everything_text(result, events, env)
    diff = of_type(events, "diff")
    assert len(diff) == 1 and "+hello world" in diff[0]["diff"] and "NEW.txt" in diff[0]["diff"]
    assert (agent.ws / "README.md").read_text() == "hello world\n" and (agent.ws / "NEW.txt").exists()
    tools = [(t["tool"], t["status"]) for t in of_type(events, "tool_call")]
    assert ("command", "completed") in tools and ("file_change", "completed") in tools
    changes = [t["changes"] for t in of_type(events, "tool_call")
               if t["tool"] == "file_change" and t["status"] == "completed"]
    assert [{"path": str(agent.ws / "NEW.txt"), "kind": "add"}] in changes
    assert of_type(events, "assistant_message")[-1]["text"] == "done"
    # The agent's command output went back to the model: the key was not in it.
    assert_no_leak(result, events, env, agent.provider)


@pytest.mark.parametrize("entry,kind,requests", [
    ({"status": 401, "body": {"error": {"message": f"Incorrect API key provided: {CANARY}"}}},
     fk.PROVIDER_AUTH_FAILED, 1),
    ({"status": 429, "body": {"error": {"message": "Rate limit reached"}}, "headers": {"Retry-After": "1"}},
     fk.PROVIDER_RATE_LIMITED, 3),
    ({"status": 503, "body": {"error": {"message": "Service Unavailable"}}}, fk.PROVIDER_UNAVAILABLE, 3),
], ids=["401", "429", "503"])
def test_provider_failures(agent, entry, kind, requests):
    before = len(agent.provider.main)
    result, events, env = agent.run([entry])
    data = terminal(events)
    assert data["status"] == "failed" and data["failure_kind"] == kind, events
    assert [e["failure_kind"] for e in of_type(events, "error")] == [kind]
    # 401 is not retried; the others are retried twice (CALDERA_OPENCODE_MAX_RETRIES) and aborted.
    assert len(agent.provider.main) - before == requests
    retries = [s for s in of_type(events, "backend_status") if s["phase"] == "retrying"]
    assert len(retries) == requests - 1 + (1 if requests > 1 else 0)
    assert all(r["cause"] == kind for r in retries)
    assert_no_leak(result, events, env, agent.provider)  # the 401 body echoed the key: redacted


@pytest.mark.parametrize("entry,kind,words", [
    ({"raw": "<html>Welcome to the captive portal</html>"}, fk.PROVIDER_UNAVAILABLE, "ended before it was complete"),
    ({"status": 429, "headers": {"Retry-After": "100"}, "body": {"error": {"message": "slow down"}}},
     fk.PROVIDER_RATE_LIMITED, "would wait 100 s"),
    ({"status": 404, "body": {"error": {"message": "no such model"}}}, fk.BACKEND_FAILED, "HTTP 404"),
], ids=["html-200", "retry-after-100", "404"])
def test_a_gateway_that_lies_or_stalls_ends_the_turn_with_a_kind(agent, entry, kind, words):
    result, events, env = agent.run([entry])
    data = terminal(events)
    assert data["status"] == "failed" and data["failure_kind"] == kind and words in data["message"], events


def test_cut_stream_is_provider_unavailable(agent):
    result, events, env = agent.run([{"cut": True}])
    data = terminal(events)
    assert data["status"] == "failed" and data["failure_kind"] == fk.PROVIDER_UNAVAILABLE, events


def test_connection_refused_ends_as_provider_unavailable_within_retries(tmp_path):
    require_opencode()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = environment(tmp_path, write_projection(tmp_path, f"http://127.0.0.1:{port}/v1"))
    (tmp_path / "ws").mkdir()
    result, events = execute(request(tmp_path / "ws"), env)
    data = terminal(events)
    assert data["failure_kind"] == fk.PROVIDER_UNAVAILABLE, events
    assert "cannot reach the provider" in data["message"]
    assert not (tmp_path / "state" / "runs").exists() or not list((tmp_path / "state" / "runs").iterdir())


def test_missing_key_file_is_secret_unavailable_and_nothing_starts(tmp_path):
    with FakeChatProvider([{"text": "never"}]) as provider:
        env = environment(tmp_path, write_projection(tmp_path, provider.url, key=None))
        (tmp_path / "ws").mkdir()
        result, events = execute(request(tmp_path / "ws"), env)
    data = terminal(events)
    assert data["failure_kind"] == fk.SECRET_UNAVAILABLE and KEY_ENV in data["message"]
    assert provider.requests == [] and "ready" not in phases(events)


def test_bad_binary_path_is_spawn_failed(tmp_path):
    env = environment(tmp_path, write_projection(tmp_path, "http://127.0.0.1:9/v1"),
                      binary=str(tmp_path / "no-such-opencode"))
    (tmp_path / "ws").mkdir()
    result, events = execute(request(tmp_path / "ws"), env)
    assert terminal(events)["failure_kind"] == fk.BACKEND_SPAWN_FAILED
    assert not list((tmp_path / "state" / "runs").iterdir())


def test_policy_timeout_on_a_stalled_provider_is_backend_timeout(agent):
    result, events, env = agent.run([{"stall": 60}], timeout_seconds=3)
    data = terminal(events)
    assert data["status"] == "failed" and data["failure_kind"] == fk.BACKEND_TIMEOUT, events
    assert any(s["phase"] == "interrupting" and s["reason"] == "timeout" for s in of_type(events, "backend_status"))
    # The server survives a turn's timeout: the next turn runs on it.
    result, events, env = agent.run([{"text": "still here"}])
    assert terminal(events)["status"] == "completed"
    assert of_type(events, "backend_status")[1]["server"] == "reused"


def test_interrupt_during_a_stalled_stream_is_cancelled(agent):
    agent.provider.set_script([{"stall": 60}])
    registry = service.ActiveRuns()
    before = len(agent.provider.main)
    box: dict[str, Any] = {}
    seen: list[dict[str, Any]] = []
    req = request(agent.ws, run_id="interrupted")
    thread = threading.Thread(target=lambda: box.update(result=service.execute(
        req, agent.env(), roots=None, listeners=[seen.append], registry=registry)))
    thread.start()
    assert agent.provider.wait_main(before + 1, timeout=60)  # the request reached the provider
    assert registry.interrupt("interrupted") == "running"
    thread.join(30)
    assert not thread.is_alive()
    data = terminal(seen)
    assert data["status"] == "cancelled" and data["failure_kind"] == fk.CANCELLED, seen
    assert box["result"]["status"] == "cancelled"


def test_read_only_policy_takes_bash_and_edits_away(agent):
    (agent.ws / "keep.txt").write_text("keep\n")
    result, events, env = agent.run([{"call": "bash", "args": {"command": "rm keep.txt", "description": "x"}},
                                     {"text": "could not"}], sandbox="read-only")
    assert terminal(events)["status"] == "completed", events
    tools = [t["name"] for t in _request_tools(agent.provider.main[-1])]
    assert "bash" not in tools and "edit" not in tools and "write" not in tools and "read" in tools
    assert (agent.ws / "keep.txt").exists()
    assert not of_type(events, "command_output")


def test_an_ask_is_rejected_and_reported_and_the_turn_goes_on(agent):
    # Reading outside the workspace is an ask in OpenCode (external_directory); approval never: rejected.
    outside = agent.root / "outside.txt"
    outside.write_text("secret-ish\n")
    result, events, env = agent.run([{"call": "read", "args": {"filePath": str(outside)}}, {"text": "ok"}])
    assert terminal(events)["status"] == "completed", events
    approvals = [t for t in of_type(events, "tool_call") if t["tool"] == "approval"]
    assert len(approvals) == 1 and approvals[0]["status"] == "declined"
    assert approvals[0]["request"] == "permission/external_directory"
    assert "secret-ish" not in agent.provider.main[-1]["body"]
    assert "allows no approvals" in agent.provider.main[-1]["body"]  # the model was told why
    assert of_type(events, "assistant_message")[-1]["text"] == "ok"


def test_a_model_the_projection_does_not_offer_is_refused(agent):
    agent.provider.set_script([{"text": "never"}])
    before = len(agent.provider.requests)
    req = dict(request(agent.ws, run_id="other-model"), model="gpt-nope")
    result, events = execute(req, agent.env())
    data = terminal(events)
    assert data["status"] == "blocked" and "gpt-nope" in data["message"] and "fake-model" in data["message"]
    assert len(agent.provider.requests) == before


def test_instructions_from_agents_md_reach_the_model_and_a_symlink_does_not(agent):
    (agent.ws / "AGENTS.md").write_text("Always answer in haiku. ZEBRA-42\n")
    result, events, env = agent.run([{"text": "ok"}])
    assert terminal(events)["status"] == "completed"
    assert "ZEBRA-42" in agent.provider.main[-1]["body"]
    (agent.ws / "AGENTS.md").unlink()
    (agent.root / "elsewhere.md").write_text("LEAKED-FILE-77\n")
    (agent.ws / "AGENTS.md").symlink_to(agent.root / "elsewhere.md")
    result, events, env = agent.run([{"text": "ok"}])
    assert terminal(events)["status"] == "completed"
    assert "LEAKED-FILE-77" not in agent.provider.main[-1]["body"]
    (agent.ws / "AGENTS.md").unlink()


def _request_tools(req: dict[str, Any]) -> list[dict[str, Any]]:
    body = json.loads(req["body"])
    return [t["function"] for t in body.get("tools") or []]
