"""`caldera status`: local, cheap, and it says how the connection is."""
import json
import subprocess
import sys

import pytest

from core_helpers import BOOT, SECRET, install_agent
from daemon_helpers import Daemon, wait_for

PlaneServer = pytest.importorskip("caldera.plane.server").PlaneServer


def status(*extra):
    return subprocess.run([sys.executable, "-m", "caldera.cli", "status", "--agent", "demo", *extra],
                          capture_output=True, text=True, timeout=60)


def test_status_without_plane_or_daemon(caldera_env):
    install_agent(caldera_env)
    done = status("--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["agent_status"]["state"] == {"level": "ok", "label": "Ready"}
    assert doc["agent_status"]["gauges"][0]["used"] == 0.25
    assert doc["connection"]["last_successful"] == "never" and doc["outbox"] == {"items": 0, "dropped": {}}
    human = status()
    assert "Ready (ok)" in human.stdout and "[#####...............]  25%" in human.stdout
    assert "daemon: not running" in human.stdout


def test_status_shows_the_drop_counters(caldera_env):
    install_agent(caldera_env)
    state_dir = caldera_env / "var" / "demo"
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(json.dumps({"drops": {"outbox": 3, "events": 0, "lanes": 1}}))
    doc = json.loads(status("--json").stdout)
    assert doc["outbox"]["dropped"] == {"outbox": 3, "events": 0, "lanes": 1}
    assert "dropped since the daemon started: events 0, lanes 1, outbox 3" in status().stdout


def test_status_imports_neither_requests_nor_jsonschema(caldera_env):
    install_agent(caldera_env)
    status()  # warms the manifest cache
    probe = ("import sys, runpy; sys.argv=['caldera','status','--agent','demo'];"
             "from caldera.cli import main; main(sys.argv[1:]);"
             "print('HEAVY', sorted(m for m in ('requests','jsonschema','yaml') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr


def test_status_shows_daemon_connection_and_no_secrets(caldera_env, tmp_path):
    plane = PlaneServer(str(tmp_path / "p.db"), tokens={BOOT: 7}, heartbeat_interval=1, poll_interval=1).start()
    install_agent(caldera_env, base_url=plane.url, instance_id=7)
    daemon = Daemon()
    try:
        wait_for(lambda: plane.store.heartbeats(7), what="heartbeat")
        wait_for(lambda: json.loads(status("--json").stdout)["connection"].get("last_heartbeat_ok_at"),
                 what="connection recorded")
        done = status()
        assert "daemon: " in done.stdout and " daemon" in done.stdout.split("daemon: ", 1)[1]
        assert "last heartbeat ok" in done.stdout and "never" not in done.stdout.split("last heartbeat ok")[1].split("\n")[0]
        for text in (done.stdout, done.stderr):
            assert BOOT not in text and SECRET not in text
    finally:
        daemon.stop()
        plane.stop()


def test_status_masks_secrets_the_adapter_prints(caldera_env):
    config = install_agent(caldera_env)
    (config / "adapter.py").write_text(
        "import json\nprint(json.dumps({'state': {'level': 'ok', 'label': 'Ready'}, "
        f"'detail': 'using {SECRET} and Authorization: Bearer abcdefghijklmnop'}}))\n")
    for extra in ((), ("--json",)):
        done = status(*extra)
        assert done.returncode == 0, done.stderr
        assert SECRET not in done.stdout and "abcdefghijklmnop" not in done.stdout
        assert "[REDACTED]" in done.stdout
