"""Shared pieces of the OpenCode tests: the real binary, projections, environments and a
`Harness` that runs one turn the way a contract-test scenario does (configure the fake
provider, `service.execute`, the events and the finish result)."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from caldera.backends import base, service
from caldera.backends.opencode.owner import ServerOwner
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


@dataclasses.dataclass(frozen=True)
class OwnedEnvironment(base.Environment):
    """An Environment with the daemon-owned servers (the field the lead adds to base.Environment)."""
    servers: dict[str, Any] = dataclasses.field(default_factory=dict)


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


def environment(tmp: Path, secrets: Path | None, owner: ServerOwner | None = None, binary: str | None = None,
                **env: str) -> base.Environment:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if binary or OPENCODE_BIN:
        full["CALDERA_OPENCODE_BIN"] = binary or str(OPENCODE_BIN)
    full.update(env)
    kwargs: dict[str, Any] = dict(redactor=Redactor(), logs_dir=str(tmp / "state" / "logs"),
                                  runs_dir=str(tmp / "state" / "runs"),
                                  secrets_dir=str(secrets) if secrets else None, env=full)
    if owner is not None:
        return OwnedEnvironment(servers={"opencode": owner}, **kwargs)
    return base.Environment(**kwargs)


def request(ws: Path, run_id: str = "run-1", prompt: str = "Say hello", **policy: Any) -> dict[str, Any]:
    return {"run_id": run_id, "prompt": prompt, "workspace": str(ws), "backend_profile": "opencode",
            "execution_policy": dict({"timeout_seconds": 60}, **policy)}


def execute(req: dict[str, Any], env: base.Environment, **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    result = service.execute(req, env, roots=None, listeners=[seen.append], **kwargs)
    return result, seen


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def terminal(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert [e["type"] for e in events].count("terminal_status") == 1 and events[-1]["type"] == "terminal_status"
    return events[-1]["data"]


def phases(events: list[dict[str, Any]]) -> list[str]:
    return [d["phase"] for d in of_type(events, "backend_status")]


def everything_text(result: dict[str, Any], events: list[dict[str, Any]], env: base.Environment) -> str:
    """Every byte a run put out: events, finish result, run log."""
    return "\n".join([json.dumps(events), json.dumps(result), Path(result["log"]).read_text()])


def assert_no_leak(result: dict[str, Any], events: list[dict[str, Any]], env: base.Environment,
                   provider: Any = None, secret: str = CANARY) -> None:
    assert secret not in everything_text(result, events, env)
    if provider is not None:
        for req in provider.requests:
            assert secret not in req["body"]  # the agent's commands never saw it
