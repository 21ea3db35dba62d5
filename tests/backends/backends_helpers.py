"""Shared pieces of the backend tests: projections, the mock app-server binary, runs."""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

from caldera.backends import base, service
from caldera.redact import Redactor

HERE = Path(__file__).resolve().parent
MOCK = HERE / "backends_mock_app_server.py"
CANARY = "sk-fake-LEAKCANARY-0123456789abcdef"
KEY_ENV = "FAKE_PROVIDER_API_KEY"


def write_projection(root: Path, base_url: str = "http://127.0.0.1:9/v1", key: str | None = CANARY,
                     extra_toml: str = "", provider_extra: str = "", model: str = "gpt-5.5") -> Path:
    """secrets/codex/ with a custom provider reading its key from env/FAKE_PROVIDER_API_KEY."""
    codex = root / "secrets" / "codex"
    (codex / "env").mkdir(parents=True, exist_ok=True)
    (codex / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "fake"\n{extra_toml}\n'
        f'[model_providers.fake]\nname = "Fake"\nbase_url = "{base_url}"\n'
        f'env_key = "{KEY_ENV}"\nwire_api = "responses"\n{provider_extra}\n')
    if key is not None:
        (codex / "env" / KEY_ENV).write_text(key + "\n")
    return root / "secrets"


def mock_binary(tmp: Path, script: dict, name: str = "codex") -> str:
    """An executable that runs the mock app-server with `script`."""
    tmp = tmp / "bin"  # not the agent's config dir itself (secrets/'s parent): no box binds that
    tmp.mkdir(exist_ok=True)
    script_path = tmp / f"{name}.script.json"
    script_path.write_text(json.dumps(script))
    return write_mock(tmp, script_path, name)


def write_mock(directory: Path, script_path: Path, name: str = "codex") -> str:
    """`directory/name`: runs a copy of the mock app-server beside it on the real interpreter
    (stdlib only). Copies, not the checkout's files: caldera's box around the app-server binds
    back the binary's dir and hides /tmp, where a build tree or a CI checkout and its venv may
    lie (the .deb's build runs the suite from /tmp)."""
    mock = directory / MOCK.name
    shutil.copyfile(MOCK, mock)
    binary = directory / name
    binary.write_text(f'#!/bin/sh\nexec "{os.path.realpath(sys.executable)}" "{mock}" --script "{script_path}" "$@"\n')
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(binary)


def environment(tmp: Path, binary: str | None, secrets: Path | None, **env) -> base.Environment:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CALDERA_CODEX_REQUEST_MAX_RETRIES": "0",
            "CALDERA_CODEX_STREAM_MAX_RETRIES": "0"}
    if binary:
        full["CALDERA_CODEX_BIN"] = binary
    full.update(env)
    return base.Environment(redactor=Redactor(), logs_dir=str(tmp / "state" / "logs"),
                            runs_dir=str(tmp / "state" / "runs"),
                            secrets_dir=str(secrets) if secrets else None, env=full)


def workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    return ws


def request(ws: Path, run_id: str = "run-1", prompt: str = "Say hello", **policy) -> dict:
    return {"run_id": run_id, "prompt": prompt, "workspace": str(ws),
            "execution_policy": dict({"timeout_seconds": 60}, **policy)}


def execute(req: dict, env: base.Environment, roots=None, cancel=None, registry=None, deadline=None):
    """(result, every event) of one run."""
    seen = []
    result = service.execute(req, env, roots=roots, listeners=[seen.append], cancel=cancel,
                             registry=registry, deadline=deadline)
    return result, seen


def types(events) -> list[str]:
    return [e["type"] for e in events]


def of_type(events, kind: str) -> list[dict]:
    return [e["data"] for e in events if e["type"] == kind]


def everything_text(result, events, env: base.Environment) -> str:
    """Every byte a run put out: events, finish result, run log, whatever is left in runs/."""
    parts = [json.dumps(events), json.dumps(result), Path(result["log"]).read_text()]
    runs = Path(env.runs_dir)
    if runs.exists():
        for path in runs.rglob("*"):
            if path.is_file():
                parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def fake_runtime(tmp: Path, env: dict, client=None):
    """The parts agent_run needs, without the daemon (a real ActiveRuns registry)."""
    from caldera.backends.registry import ActiveRuns, BackendServers

    config_dir = tmp / "config"
    paths = SimpleNamespace(state_dir=tmp / "state", config_dir=config_dir, secrets_dir=config_dir / "secrets")
    settings = SimpleNamespace(env=env)
    return SimpleNamespace(paths=paths, settings=settings, redactor=Redactor(), client=client,
                           agent_id="caldera-7-main", runs=ActiveRuns(), servers=BackendServers(tmp / "state" / "runs"))


def fake_ctx(runtime, cancel=None, deadline=0.0, command=None):
    from core_helpers import command_context

    from caldera.backends.commands import RunCall

    return command_context(RunCall, "agent_run", command=command, cancel=cancel or threading.Event(),
                           deadline=deadline, agent_id=runtime.agent_id, paths=runtime.paths,
                           env=runtime.settings.env,
                           redactor=runtime.redactor, client=runtime.client, runs=runtime.runs,
                           servers=runtime.servers)
