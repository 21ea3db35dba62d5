"""Shared pieces of the OpenCode-only tests (the contract suite, test_backends_contract.py,
runs the scenarios every backend shares): the real binary, projections, environments."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from backends_helpers import everything_text

from caldera.backends import base
from caldera.backends.opencode.owner import ServerOwner
from caldera.backends.registry import BackendServers
from caldera.redact import Redactor

OPENCODE_BIN = os.environ.get("CALDERA_OPENCODE_BIN")
CANARY = "sk-fake-OCCANARY-0123456789abcdef"
KEY_ENV = "FAKE_PROVIDER_API_KEY"


def require_opencode() -> str:
    if OPENCODE_BIN and os.access(OPENCODE_BIN, os.X_OK):
        return OPENCODE_BIN
    reason = (f"the real OpenCode binary is not available (CALDERA_OPENCODE_BIN={OPENCODE_BIN!r}); "
              "run .ci/install-opencode.sh")
    if os.environ.get("CALDERA_REQUIRE_OPENCODE") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def opencode_json(base_url: str, model: str = "fake-model", key_ref: str = f"{{env:{KEY_ENV}}}",
                  provider: str = "fake", **extra: Any) -> dict[str, Any]:
    return dict({"provider": {provider: {"npm": "@ai-sdk/openai-compatible", "name": "Fake",
                                         "options": {"baseURL": base_url, "apiKey": key_ref},
                                         "models": {model: {}}}},
                 "model": f"{provider}/{model}"}, **extra)


def write_projection(root: Path, base_url: str, key: str | None = CANARY, config: dict[str, Any] | None = None) -> Path:
    """secrets/opencode/ with an opencode.json reading its key from env/FAKE_PROVIDER_API_KEY."""
    home = root / "secrets" / "opencode"
    (home / "env").mkdir(parents=True, exist_ok=True)
    (home / "opencode.json").write_text(json.dumps(config or opencode_json(base_url)))
    if key is not None:
        (home / "env" / KEY_ENV).write_text(key + "\n")
    return root / "secrets"


def held(owner: ServerOwner) -> BackendServers:
    """The daemon's holder with `owner` in it, as the agent's first OpenCode run makes it."""
    servers = BackendServers(owner.runs_dir)
    servers.get("opencode", lambda runs_dir: owner)
    return servers


def environment(tmp: Path, secrets: Path | None, owner: ServerOwner | None = None, binary: str | None = None,
                **env: str) -> base.Environment:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if binary or OPENCODE_BIN:
        full["CALDERA_OPENCODE_BIN"] = binary or str(OPENCODE_BIN)
    full.update(env)
    return base.Environment(redactor=Redactor(), logs_dir=str(tmp / "state" / "logs"),
                            runs_dir=str(tmp / "state" / "runs"), secrets_dir=str(secrets) if secrets else None,
                            env=full, servers=held(owner) if owner is not None else None)


def request(ws: Path, run_id: str = "run-1", prompt: str = "Say hello", **policy: Any) -> dict[str, Any]:
    return {"run_id": run_id, "prompt": prompt, "workspace": str(ws), "backend_profile": "opencode",
            "execution_policy": dict({"timeout_seconds": 60}, **policy)}


def terminal(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert [e["type"] for e in events].count("terminal_status") == 1 and events[-1]["type"] == "terminal_status"
    return events[-1]["data"]


def phases(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["phase"] for e in events if e["type"] == "backend_status"]


def assert_no_leak(result: dict[str, Any], events: list[dict[str, Any]], env: base.Environment,
                   provider: Any = None, secret: str = CANARY) -> None:
    assert secret not in everything_text(result, events, env)
    if provider is not None:
        for req in provider.requests:
            assert secret not in req["body"]  # the agent's commands never saw it
