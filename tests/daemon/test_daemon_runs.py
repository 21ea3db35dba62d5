"""A code-agent turn through the whole daemon: agent_run in the runs lane, and an
agent_interrupt fetched and run while the turn is going (the main lane is free)."""
import json
from pathlib import Path

import pytest
from backends_helpers import write_mock
from core_helpers import BOOT, install_agent
from daemon_helpers import Daemon, wait_for
from plane_helpers import heartbeats, run_events

PlaneServer = pytest.importorskip("caldera.plane.server").PlaneServer
CANARY = "sk-fake-RUNLANECANARY-0123456789"


def mock_codex(tmp: Path) -> str:
    script = tmp / "codex.script.json"
    script.write_text(json.dumps({"on_turn": [{"wait_interrupt": True}]}))
    return write_mock(tmp, script)


def test_interrupt_reaches_a_running_turn_through_the_daemon(caldera_env, tmp_path):
    plane = PlaneServer(str(tmp_path / "p.db"), tokens={BOOT: 7}, heartbeat_interval=1, poll_interval=1).start()
    ws = tmp_path / "workspaces" / "one"
    ws.mkdir(parents=True)
    config = install_agent(caldera_env, base_url=plane.url, instance_id=7,
                           extra_env=f"CALDERA_WORKSPACE_ROOTS={tmp_path / 'workspaces'}\n"
                                     f"CALDERA_CODEX_BIN={mock_codex(tmp_path)}\n")
    codex = config / "secrets" / "codex"
    (codex / "env").mkdir(parents=True)
    (codex / "config.toml").write_text('model = "gpt-5.5"\nmodel_provider = "fake"\n[model_providers.fake]\n'
                                       'name = "Fake"\nbase_url = "http://127.0.0.1:9/v1"\n'
                                       'env_key = "FAKE_PROVIDER_API_KEY"\nwire_api = "responses"\n')
    (codex / "env" / "FAKE_PROVIDER_API_KEY").write_text(CANARY + "\n")
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, 7), what="heartbeat")
        run = plane.store.enqueue(7, "agent_run", {"run_id": "r-lane", "prompt": "wait", "workspace": str(ws)})
        wait_for(lambda: _cmd(plane, run)["status"] == "running", what="turn running")
        stop = plane.store.enqueue(7, "agent_interrupt", {"run_id": "r-lane"})
        wait_for(lambda: _cmd(plane, stop)["status"] == "succeeded", timeout=15, what="interrupt done")
        wait_for(lambda: _cmd(plane, run)["status"] == "failed", timeout=15, what="turn finished")
        result = _cmd(plane, run)["result"]
        assert result["run_id"] == "r-lane" and result["status"] == "cancelled"
        assert result["failure_kind"] == "cancelled"
        assert CANARY not in json.dumps(plane.store.commands(7))
        events = wait_for(lambda: run_events(plane.store, "r-lane"), what="run events posted to the plane")
        assert {e.get("type") for e in (x.get("event", x) for x in events)} >= {"backend_status"}
        assert CANARY not in json.dumps(events)
    finally:
        daemon.stop()
        plane.stop()
    assert CANARY not in daemon.log()


def _cmd(plane, cid):
    return {c["id"]: c for c in plane.store.commands(7)}[cid]
