"""What the Claude Code backend adds to the contract suite, with the real CLI: the
execution policy enforced by its sandbox and permission modes (no write outside the
workspace, none at all read-only, no network; what would ask is denied, or declined when
asked of the runtime), the workspace diff, and the refusal of a policy the host cannot
honour, and the provider reached through HTTPS_PROXY. Skips like the contract suite
(CALDERA_REQUIRE_CLAUDE_CODE=1 makes it fail)."""
from __future__ import annotations

import contextlib
import json
import os
import ssl
import uuid
from pathlib import Path

import pytest
from backends_drivers import CANARY, DRIVERS
from backends_fake_anthropic import FakeAnthropic
from backends_proxy import ConnectProxy, tls_certificate
from test_backends_contract import Turn

DRIVER = DRIVERS["claude-code"]


@pytest.fixture(autouse=True)
def _cli():
    if DRIVER.binary() is None:
        if os.environ.get(DRIVER.require_var) == "1":
            pytest.fail(f"the real Claude Code CLI is not available ({DRIVER.bin_var})")
        pytest.skip("the real Claude Code CLI is not available")


def _probe(outside: str) -> str:
    # Writes in the workspace and outside it, and connects to the provider itself (loopback).
    return (f"echo inside > inside.txt; echo outside > {outside}; "
            "python3 -c 'import os,socket,urllib.parse as u; p=u.urlsplit(os.environ[\"ANTHROPIC_BASE_URL\"]); "
            "socket.create_connection((p.hostname, p.port), timeout=3); print(\"CONNECTED\")' 2>&1 | tail -1")


def _write(path: str) -> dict:
    return {"tool": "Write", "input": {"file_path": path, "content": "written\n"}}


def test_workspace_write_writes_only_in_the_workspace_and_reaches_no_network(tmp_path):
    outside, outside_tool = (f"/tmp/caldera-outside-{uuid.uuid4().hex}" for _ in range(2))
    script = [DRIVER.command(_probe(outside)), _write(outside_tool), _write(str(tmp_path / "ws" / "w.txt")),
              DRIVER.text("done")]
    turn = Turn(DRIVER, tmp_path, script, sandbox="workspace-write")  # approval: never
    assert turn.terminal["status"] == "completed", turn.events
    [output] = turn.of("command_output")
    assert "Read-only file system" in output["output"] and "CONNECTED" not in output["output"], output
    assert not os.path.exists(outside) and not os.path.exists(outside_tool)
    # The Write outside would ask: with approval never it is denied; the one inside goes through.
    assert [(t["name"], t["status"]) for t in turn.of("tool_call") if t["status"] != "started"] == [
        ("Write", "denied"), ("Write", "completed")]
    assert (turn.workspace / "inside.txt").read_text() == "inside\n"
    assert (turn.workspace / "w.txt").read_text() == "written\n"
    assert sorted(os.listdir(turn.workspace)) == ["inside.txt", "w.txt"]  # nothing of the CLI's (.claude/.cc-writes)
    [diff] = turn.of("diff")  # from the workspace after the turn
    assert "+++ b/inside.txt" in diff["diff"] and "+inside" in diff["diff"] and "+++ b/w.txt" in diff["diff"]
    turn.assert_no_leak()


def test_approval_on_request_is_asked_of_the_runtime_and_declined(tmp_path):
    outside = f"/tmp/caldera-outside-{uuid.uuid4().hex}"
    turn = Turn(DRIVER, tmp_path, [_write(outside), DRIVER.text("done")], approval="on-request",
                extra_env={"CALDERA_RUN_ALLOW_APPROVAL": "true"})
    assert turn.terminal["status"] == "completed", turn.events
    assert [(t["tool"], t["status"]) for t in turn.of("tool_call")] == [
        ("file_change", "started"), ("approval", "declined"), ("file_change", "failed")]
    assert not os.path.exists(outside)


def test_read_only_writes_nowhere_and_offers_no_write_tool(tmp_path):
    outside = f"/tmp/caldera-outside-{uuid.uuid4().hex}"
    script = [DRIVER.command(_probe(outside)), _write(str(tmp_path / "ws" / "w.txt")), DRIVER.text("done")]
    turn = Turn(DRIVER, tmp_path, script, sandbox="read-only")
    assert turn.terminal["status"] == "completed", turn.events
    assert not (turn.workspace / "inside.txt").exists() and not (turn.workspace / "w.txt").exists()
    assert not os.path.exists(outside) and turn.of("diff") == []
    session = next(s for s in turn.of("backend_status") if s["phase"] == "session_started")
    assert "Write" not in session["tools"] and "Edit" not in session["tools"]


def test_network_true_is_refused_unless_the_caps_allow_it_and_missing_sandbox_refuses(tmp_path):
    turn = Turn(DRIVER, tmp_path, [DRIVER.text("never")], network=True)
    assert turn.terminal["status"] == "blocked" and "network" in turn.terminal["message"]
    # No bubblewrap/socat on PATH: the policy cannot be honoured, so the run is refused (never widened).
    empty = tmp_path / "empty-path"
    empty.mkdir()
    (tmp_path / "b").mkdir()
    turn = Turn(DRIVER, tmp_path / "b", [DRIVER.text("never")], extra_env={"PATH": str(empty)})
    assert turn.terminal["status"] == "blocked" and "bubblewrap" in turn.terminal["message"], turn.events
    assert turn.requests == []


class _Proxied(type(DRIVER)):
    """The Claude Code driver with its provider on HTTPS as `provider.test` (reached only
    through the proxy's tunnel) instead of plain http on loopback."""

    def __init__(self, provider):
        self.running = provider

    def provider(self, script):
        return contextlib.nullcontext(self.running)

    def projection(self, root, provider_url, key):
        return super().projection(root, "https://provider.test", key)


def test_the_forwarder_reaches_the_provider_through_https_proxy(tmp_path, monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    cert, key = tls_certificate(tmp_path, "provider.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    with FakeAnthropic([DRIVER.text("through the proxy")], tls=server) as provider, \
            ConnectProxy(provider.httpd.server_address[1]) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://squid:proxy-Passw0rd@"))
        turn = Turn(_Proxied(provider), tmp_path, [])
    assert turn.terminal["status"] == "completed", turn.events
    assert [m["text"] for m in turn.of("assistant_message")] == ["through the proxy"]
    assert [target for target, _ in proxy.connects] == ["provider.test:443"]
    assert turn.of("backend_status")[0]["proxy"] == f"127.0.0.1:{proxy.httpd.server_address[1]}"
    assert provider.posts[0]["headers"]["x-api-key"] == CANARY
    turn.assert_no_leak()
    assert "proxy-Passw0rd" not in json.dumps(turn.events) + Path(turn.result["log"]).read_text()


def test_the_agent_cannot_read_the_runtimes_credentials(tmp_path):
    """The projection (the key), secrets.env beside it and the state dir's session.json:
    neither the agent's commands (the sandbox) nor its Read tool (the permission rules)."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "session.json").write_text('{"token": "agt_sess_SESSIONMARK1"}')
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets.env").write_text("CALDERA_TOKEN=BOOTMARK2\n")
    key = tmp_path / "secrets" / "claude-code" / "env" / "ANTHROPIC_API_KEY"
    command = f"cat {tmp_path}/state/session.json {tmp_path}/secrets.env {key}; echo rc=$?"
    script = [DRIVER.command(command), {"tool": "Read", "input": {"file_path": str(tmp_path / "secrets.env")}},
              DRIVER.text("done")]
    turn = Turn(DRIVER, tmp_path, script)
    assert turn.terminal["status"] == "completed", turn.events
    [output] = turn.of("command_output")
    # The files read as /dev/null (Permission denied), the projection as an empty directory.
    assert output["output"].count("Permission denied") == 2 and "rc=1" in output["output"], output
    assert [t["status"] for t in turn.of("tool_call") if t["name"] == "Read"] == ["started", "failed"]
    sent = json.dumps([post["body"] for post in turn.posts])
    assert "denied by your permission settings" in turn.posts[2]["body"]  # the Read tool's answer
    assert "SESSIONMARK1" not in sent and "BOOTMARK2" not in sent  # the model never got them
    turn.assert_no_leak()
