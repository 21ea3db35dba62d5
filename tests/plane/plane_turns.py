"""A code-agent turn through a real `caldera run` against a loopback plane, for the live test
(test_plane_runs_live.py) and the follow bench (bench/bench_run_watch.py): the agent's Codex is
the mock app-server (tests/backends/backends_mock_app_server.py) playing a scripted turn."""
from __future__ import annotations

import json
from pathlib import Path

from backends_helpers import write_mock
from core_helpers import install_agent

CODEX_CONFIG = ('model = "gpt-5.5"\nmodel_provider = "fake"\n[model_providers.fake]\nname = "Fake"\n'
                'base_url = "http://127.0.0.1:9/v1"\nenv_key = "FAKE_PROVIDER_API_KEY"\nwire_api = "responses"\n')


def message(n: int, text: str = "") -> dict:
    """An agentMessage item; its text carries the Unix time it left the mock ("sent=T")."""
    return {"method": "item/completed", "params": {"item": {"type": "agentMessage", "id": f"m{n}",
                                                            "text": f"sent=$NOW {text}"}}}


def command(item_id: str, cmd: str, output: str | None = None) -> dict:
    """A commandExecution item: started (output None), else completed with `output`."""
    item = {"type": "commandExecution", "id": item_id, "command": cmd, "cwd": "/w"}
    if output is None:
        return {"method": "item/started", "params": {"item": item}}
    item.update(status="completed", aggregatedOutput=output, exitCode=0, durationMs=1500)
    return {"method": "item/completed", "params": {"item": item}}


def completed() -> dict:
    return {"method": "turn/completed", "params": {"turn": {"id": "$TURN", "status": "completed"}}}


def install(caldera_env: Path, tmp: Path, plane_url: str, instance: int, on_turn: list) -> Path:
    """The agent `demo` with the mock Codex playing `on_turn`; returns its workspace."""
    script = tmp / "codex.script.json"
    script.write_text(json.dumps({"on_turn": on_turn}))
    binary = write_mock(tmp, script)
    workspace = tmp / "workspaces" / "one"
    workspace.mkdir(parents=True)
    config = install_agent(caldera_env, base_url=plane_url, instance_id=instance,
                           extra_env=f"CALDERA_WORKSPACE_ROOTS={tmp / 'workspaces'}\nCALDERA_CODEX_BIN={binary}\n")
    codex = config / "secrets" / "codex"
    (codex / "env").mkdir(parents=True)
    (codex / "config.toml").write_text(CODEX_CONFIG)
    (codex / "env" / "FAKE_PROVIDER_API_KEY").write_text("sk-fake-RUNWATCH-0123456789\n")
    return workspace
