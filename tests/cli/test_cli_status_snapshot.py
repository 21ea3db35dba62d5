"""`caldera status` by a user who may not read the state dir: the daemon's status.json."""
import json

from core_helpers import install_agent

from caldera.cli import main
from caldera.cli import status as status_cli


def test_status_without_access_prints_the_snapshot(caldera_env, monkeypatch, capsys):
    install_agent(caldera_env)
    state = caldera_env / "var" / "demo"
    state.mkdir(parents=True)
    (state / "status.json").write_text(json.dumps({
        "written_at": "2026-01-01T00:00:00Z", "daemon_pid": 2 ** 22 + 7,
        "agent_status": {"state": {"level": "ok", "label": "Ready"}},
        "connection": {"last_heartbeat_ok_at": "2026-01-01T00:00:00Z"}, "outbox": {"items": 3}}))
    monkeypatch.setattr(status_cli.os, "access", lambda path, mode: False)  # as an admin without sudo
    assert main(["status", "--agent", "demo"]) == 0
    out = capsys.readouterr().out
    assert "agent demo: Ready (ok)" in out and "outbox: 3 waiting" in out
    assert "daemon: not running" in out  # that PID does not exist
    assert "the daemon's snapshot of" in out and "sudo caldera status --agent demo" in out


def test_status_without_access_and_without_snapshot_says_what_to_do(caldera_env, monkeypatch, capsys):
    install_agent(caldera_env)
    (caldera_env / "var" / "demo").mkdir(parents=True)
    monkeypatch.setattr(status_cli.os, "access", lambda path, mode: False)
    assert main(["status", "--agent", "demo"]) == 1
    assert "sudo caldera status --agent demo" in capsys.readouterr().err
