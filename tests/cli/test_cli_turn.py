"""`caldera turn` and `caldera backends` through the real CLI front, with the mock app-server."""
import json

from backends_helpers import CANARY, mock_binary, write_projection

from caldera import cli
from caldera.backends import base


def _env(monkeypatch, tmp_path, binary):
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("CALDERA_STATE_DIR", str(tmp_path / "none-state"))
    monkeypatch.delenv("CALDERA_AGENT", raising=False)
    monkeypatch.setenv("CALDERA_CODEX_BIN", binary)
    monkeypatch.setenv("CALDERA_CODEX_STREAM_MAX_RETRIES", "0")


def test_turn_json_prints_events_and_exit_code(tmp_path, monkeypatch, capsys):
    script = {"on_turn": [
        {"method": "item/completed", "params": {"item": {"type": "agentMessage", "id": "m", "text": f"k={CANARY}"}}},
        {"method": "turn/completed", "params": {"turn": {"id": "$TURN", "status": "completed"}}}]}
    _env(monkeypatch, tmp_path, mock_binary(tmp_path, script))
    sec = write_projection(tmp_path)
    (tmp_path / "ws").mkdir()
    rc = cli.main(["turn", "--workspace", str(tmp_path / "ws"), "--secrets", str(sec),
                   "--state-dir", str(tmp_path / "st"), "--json", "hello"])
    out = capsys.readouterr()
    events = [json.loads(line) for line in out.out.splitlines()]
    assert rc == 0 and events[-1]["data"]["status"] == "completed"
    assert {"run_id", "seq", "ts", "type", "data"} == set(events[0])
    assert CANARY not in out.out + out.err
    assert list((tmp_path / "st" / "logs").glob("run-turn-*.log"))


def test_turn_failure_exits_1_and_human_output(tmp_path, monkeypatch, capsys):
    _env(monkeypatch, tmp_path, str(tmp_path / "missing-binary"))
    sec = write_projection(tmp_path)
    (tmp_path / "ws").mkdir()
    rc = cli.main(["turn", "--workspace", str(tmp_path / "ws"), "--secrets", str(sec),
                   "--state-dir", str(tmp_path / "st"), "hello"])
    out = capsys.readouterr()
    assert rc == 1 and "[failed] backend-spawn-failed" in out.out and "failed (backend-spawn-failed)" in out.err


def test_turn_bad_secrets_dir_is_usage_error(tmp_path, monkeypatch, capsys):
    _env(monkeypatch, tmp_path, "x")
    assert cli.main(["turn", "--workspace", str(tmp_path), "--secrets", str(tmp_path / "nope"), "p"]) == 2
    assert "--secrets" in capsys.readouterr().err


def test_backends_json(tmp_path, monkeypatch, capsys):
    binary = tmp_path / "codex"
    binary.write_text("#!/bin/sh\necho 'codex-cli 0.169.0'\n")
    binary.chmod(0o755)
    _env(monkeypatch, tmp_path, str(binary))
    monkeypatch.setenv("CLAWMANAGER_LLM_BASE_URL", "http://gw/v1")
    monkeypatch.setenv("CLAWMANAGER_LLM_API_KEY", "gw-secret-key-1")
    assert cli.main(["backends", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    codex = info["backends"][0]
    assert codex["name"] == "codex" and codex["available"] and codex["version"] == "codex-cli 0.169.0"
    assert "llm.gateway" in info["capabilities"] and len(info["failure_kinds"]) == 11
    assert "gw-secret-key-1" not in json.dumps(info)


def test_capabilities_name_the_backends_whose_cli_is_installed(tmp_path):
    binary = tmp_path / "codex"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    caps = base.capabilities({"PATH": str(tmp_path), "CALDERA_CODEX_BIN": str(binary)})
    assert caps == ["agent.run", "agent.interrupt", "backend.codex"]
    claude = tmp_path / "claude"  # found on PATH
    claude.write_text("#!/bin/sh\n")
    claude.chmod(0o755)
    caps = base.capabilities({"PATH": str(tmp_path), "CALDERA_CODEX_BIN": str(tmp_path / "gone")})
    assert caps == ["agent.run", "agent.interrupt", "backend.claude-code"]
    opencode = tmp_path / "opencode-native"  # named by its variable
    opencode.write_text("#!/bin/sh\n")
    opencode.chmod(0o755)
    caps = base.capabilities({"PATH": str(tmp_path / "none"), "CALDERA_OPENCODE_BIN": str(opencode)})
    assert caps == ["agent.run", "agent.interrupt", "backend.opencode"]
