"""What the Claude Code backend adds to the contract suite, with the real CLI: the
execution policy enforced by its sandbox (no write outside the workspace, none at all
read-only, no network), the workspace diff, and the refusal of a policy the host cannot
honour. Skips like the contract suite (CALDERA_REQUIRE_CLAUDE_CODE=1 makes it fail)."""
from __future__ import annotations

import os
import uuid

import pytest
from backends_drivers import DRIVERS
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


def test_workspace_write_writes_only_in_the_workspace_and_reaches_no_network(tmp_path):
    outside = f"/tmp/caldera-outside-{uuid.uuid4().hex}"
    turn = Turn(DRIVER, tmp_path, [DRIVER.command(_probe(outside)), DRIVER.text("done")], sandbox="workspace-write")
    assert turn.terminal["status"] == "completed", turn.events
    [output] = turn.of("command_output")
    assert "Read-only file system" in output["output"] and "CONNECTED" not in output["output"], output
    assert not os.path.exists(outside)
    assert (turn.workspace / "inside.txt").read_text() == "inside\n"
    [diff] = turn.of("diff")  # from the workspace after the turn
    assert "+++ b/inside.txt" in diff["diff"] and "+inside" in diff["diff"]
    turn.assert_no_leak()


def test_read_only_writes_nowhere_and_offers_no_write_tool(tmp_path):
    outside = f"/tmp/caldera-outside-{uuid.uuid4().hex}"
    script = [DRIVER.command(_probe(outside)),
              {"tool": "Write", "input": {"file_path": str(tmp_path / "ws" / "w.txt"), "content": "x"}},
              DRIVER.text("done")]
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
