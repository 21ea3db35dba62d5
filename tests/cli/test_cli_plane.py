"""`caldera plane` verbs: serve as a real process, the operator verbs on its database."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from plane_helpers import Agent

from caldera.cli import main
from caldera.plane.store import Store


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "plane.db"
    store = Store(path)
    store.add_instance(1, "tok-1")
    store.close()
    return path


def _run(capsys, *argv):
    code = main(["plane", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_enqueue_prints_the_id_and_commands_shows_it(db, capsys):
    code, out, _ = _run(capsys, "enqueue", "--db", str(db), "--instance", "1", "settings_set",
                        "--payload", '{"values": {"limit": 3}}', "--no-check", "--timeout", "30")
    assert code == 0 and out.strip().isdigit()
    printed = int(out)
    code, out, _ = _run(capsys, "commands", "--db", str(db), "--instance", "1", "--json")
    doc = json.loads(out)
    [cmd] = doc["commands"]
    assert cmd["id"] == printed and cmd["command_type"] == "settings_set"
    assert cmd["payload"] == {"values": {"limit": 3}} and cmd["timeout_seconds"] == 30
    assert cmd["status"] == "pending" and cmd["issued_at"].endswith("Z")
    code, out, _ = _run(capsys, "commands", "--db", str(db), "--instance", "1")
    assert "settings_set" in out and "pending" in out


def test_enqueue_refuses_bad_input(db, capsys):
    assert _run(capsys, "enqueue", "--db", str(db), "--instance", "1", "pause", "--payload", "{")[0] == 2
    assert _run(capsys, "enqueue", "--db", str(db), "--instance", "1", "pause", "--payload", "[]")[0] == 2
    code, _, err = _run(capsys, "enqueue", "--db", str(db), "--instance", "7", "pause")
    assert code == 1 and "no instance 7" in err
    code, _, err = _run(capsys, "agents", "--db", str(db.parent / "missing.db"))
    assert code == 2 and "no plane database" in err


def test_agents_and_reports_read_what_the_plane_stored(db, capsys):
    store = Store(db)
    store.register(1, {"agent_id": "caldera-1-main", "agent_version": "caldera-0.1.0", "protocol_version": "v1"},
                   "127.0.0.1")
    store.state_report(1, {"agent_id": "caldera-1-main", "runtime": {"openclaw_status": "running"},
                           "system_info": {"cpu": {"cores": 2, "load": {"1m": 1.0}}}}, None)
    store.close()
    code, out, _ = _run(capsys, "agents", "--db", str(db), "--json")
    [agent] = json.loads(out)["agents"]
    assert code == 0 and agent["presence"] == "online" and agent["agent_id"] == "caldera-1-main"
    code, out, _ = _run(capsys, "agents", "--db", str(db))
    assert "caldera-1-main" in out and "online" in out
    code, out, _ = _run(capsys, "reports", "--db", str(db), "--instance", "1", "--last", "--json")
    assert json.loads(out)["report"]["body"]["runtime"]["openclaw_status"] == "running"
    code, out, _ = _run(capsys, "reports", "--db", str(db), "--instance", "1")
    assert "cpu 50%" in out


def test_serve_runs_until_sigterm(tmp_path):
    url_file = tmp_path / "url"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALDERA_")}
    proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "plane", "serve", "--db", str(tmp_path / "p.db"),
                             "--port", "0", "--url-file", str(url_file), "--bootstrap-token", "tok",
                             "--instance-id", "4", "--heartbeat-interval", "2", "--poll-interval", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        deadline = time.monotonic() + 20
        while not url_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert url_file.exists(), proc.stderr.read() if proc.poll() is not None else "no URL file"
        agent = Agent(url_file.read_text().strip(), instance_id=4, bootstrap="tok")
        data = agent.register().json()["data"]
        assert (data["heartbeat_interval_seconds"], data["command_poll_interval_seconds"]) == (2, 1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "listening on http://127.0.0.1:" in out and "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_serve_rejects_unpaired_tokens(tmp_path, capsys):
    code, _, err = _run(capsys, "serve", "--db", str(tmp_path / "p.db"), "--bootstrap-token", "t")
    assert code == 2 and "pairs" in err
