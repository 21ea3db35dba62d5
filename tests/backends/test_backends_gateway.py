"""ClawManager's AI gateway, route by route, with the real CLIs (issue 45): each backend
completes a turn with a command through a fake gateway with the server's route layout
(backends_fake_gateway) on the injected variables alone, no projection: Codex on
`<BASE>/v1/responses`, Claude Code on `<BASE>/v1/messages` with the bearer (auth-token) form,
OpenCode on `<BASE>/chat/completions` from OPENCODE_CONFIG_CONTENT and, without it, from the
variables. The gateway's token is the canary: it reaches the gateway, and nothing else — no
event, log, request body, nor the environment, command line or files of any process of the
CLI while it runs (the run's loopback forwarder holds it). Each test skips without its CLI.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from backends_drivers import DRIVERS
from backends_fake_gateway import PREFIX, FakeGateway
from backends_helpers import CANARY

from caldera.backends import base, service
from caldera.backends.codex import config as codex_config
from caldera.backends.codex import gateway as codex_gateway
from caldera.backends.projection import Projection
from caldera.backends.registry import BackendServers, llm_configs
from caldera.redact import Redactor

CATALOGUE = ["auto", "gpt-4.1", "kimi-k2.6"]


def _binary(profile: str) -> str:
    driver = DRIVERS[profile]
    found = driver.binary()
    if found is None:
        if os.environ.get(driver.require_var) == "1":
            pytest.fail(f"the real CLI of {profile} is not available ({driver.bin_var})")
        pytest.skip(f"the real CLI of {profile} is not available ({driver.bin_var})")
    return found


def _ours(pid: str) -> bool:
    """Whether `pid` descends from this test process (other runs of the same CLI on the host,
    other tests' with their own canaries, are not this test's)."""
    for _ in range(32):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = stat.rsplit(")", 1)[1].split()[1]  # the parent, after the command's name
        if int(pid) == os.getpid():
            return True
        if int(pid) <= 1:
            return False
    return False


@contextmanager
def watched(binary: str, dirs: list[Path]) -> Iterator[list[tuple[str, bytes]]]:
    """While the block runs: the environment and command line of every process of this test
    running `binary`, and every file under `dirs`, read every 20 ms (the CLI's whole life:
    what it holds can be looked at)."""
    seen: list[tuple[str, bytes]] = []  # (what was read: environ, cmdline, file; its bytes)
    stop = threading.Event()

    def look() -> None:
        while not stop.wait(0.02):
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    if os.readlink(f"/proc/{pid}/exe") != binary or not _ours(pid):
                        continue
                    for part in ("environ", "cmdline"):
                        seen.append((part, Path(f"/proc/{pid}/{part}").read_bytes()))
                except OSError:
                    continue
            for root in dirs:
                for top, _, files in os.walk(root):  # a directory gone meanwhile is passed over
                    for name in files:
                        try:
                            seen.append(("file", Path(top, name).read_bytes()))
                        except OSError:
                            continue

    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5)


class GatewayTurn:
    """One run of `profile` with no projection, on `gateway`'s injected variables."""

    def __init__(self, profile: str, tmp: Path, gateway: FakeGateway, model: str | None = None, **variables):
        binary = _binary(profile)
        driver = DRIVERS[profile]
        self.workspace = tmp / "ws"
        self.workspace.mkdir(exist_ok=True)
        # the workspace: not tmp, the agent's config dir (secrets/'s parent), which no box binds whole
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CALDERA_WORKSPACE_ROOTS": str(self.workspace)}
        env.update(driver.env(binary))
        env["CALDERA_WORKSPACE_ROOTS"] = str(self.workspace)
        env.update(gateway.injected(**variables))
        self.env = env
        runs = tmp / "state" / "runs"
        servers = BackendServers(tmp / "state" / "servers") if profile == "opencode" else None
        environment = base.Environment(redactor=Redactor(), logs_dir=str(tmp / "state" / "logs"),
                                       runs_dir=str(runs), secrets_dir=str(tmp / "secrets"), env=env, servers=servers)
        request = {"run_id": "run-1", "prompt": "Run the command", "workspace": str(self.workspace),
                   "backend_profile": profile, "execution_policy": {"timeout_seconds": 60}}
        if model is not None:
            request["model"] = model
        self.events: list[dict] = []
        try:
            with watched(os.path.realpath(binary), [tmp / "state"]) as self.seen:
                self.result = service.execute(request, environment, roots=None, listeners=[self.events.append])
        finally:
            if servers is not None:
                servers.close()
        self.gateway = gateway

    @property
    def terminal(self) -> dict:
        assert [e["type"] for e in self.events].count("terminal_status") == 1
        return self.events[-1]["data"]

    def of(self, kind: str) -> list[dict]:
        return [e["data"] for e in self.events if e["type"] == kind]

    def models_asked(self) -> set[str | None]:
        return {r["model"] for r in self.gateway.requests if r["method"] == "POST"}

    def assert_token_held_by_the_forwarder_alone(self) -> None:
        assert self.gateway.requests, "nothing reached the gateway"
        assert all(r["headers"].get("authorization") == f"Bearer {CANARY}" for r in self.gateway.requests)
        assert self.gateway.refused == []  # no other path, no other credential
        assert any(kind == "environ" and b"PATH=" in chunk for kind, chunk in self.seen), "no process looked at"
        assert not [(kind, chunk) for kind, chunk in self.seen if CANARY.encode() in chunk]
        text = json.dumps([self.events, self.result]) + Path(self.result["log"]).read_text()
        assert CANARY not in text
        assert not [r for r in self.gateway.requests if CANARY in r["body"]]


def _command_ran(turn: GatewayTurn, marker: str) -> None:
    assert turn.terminal["status"] == "completed", turn.events
    assert any(marker in o.get("output", "") for o in turn.of("command_output")), turn.of("command_output")


# ------------------------------------------------------------------ the fake and Codex's forwarder, without a CLI

def test_the_fake_gateway_has_the_servers_routes_and_its_token():
    with FakeGateway([{"text": "hi"}], CANARY, CATALOGUE) as gateway:
        auth = {"Authorization": f"Bearer {CANARY}"}
        assert requests.get(gateway.url + "/models", headers=auth, timeout=10).json()["data"][1]["id"] == "gpt-4.1"
        for path in ("/v1/responses", "/chat/completions", "/v1/chat/completions", "/v1/messages"):
            answer = requests.post(gateway.url + path, json={"model": "auto", "stream": True}, headers=auth,
                                   timeout=10)
            assert answer.status_code == 200, path
        statuses = [requests.post(url, json={"model": "auto"}, headers=headers, timeout=10).status_code
                    for url, headers in ((gateway.url + "/responses", auth), (gateway.url + "/v1/models", auth),
                                         (gateway.url.replace("/llm", "") + "/v1/responses", auth),
                                         (gateway.url + "/v1/responses", {"Authorization": "Bearer other"}),
                                         (gateway.url + "/v1/responses", {"x-api-key": CANARY}))]
        assert statuses == [404, 404, 404, 401, 401]
        assert requests.post(gateway.url + "/v1/responses", json={"model": "gpt-9"}, headers=auth,
                             timeout=10).status_code == 404  # not in its catalogue: model_not_found


def test_codexs_forwarder_passes_only_its_route_with_the_runs_token(tmp_path):
    with FakeGateway([{"text": "hi"}], CANARY, CATALOGUE) as gateway:
        plan = codex_config.plan_provider(Projection.locate(tmp_path / "none"), gateway.injected())
        config = codex_config.enforce(plan, network=False, request_retries=0, stream_retries=0)
        forwarder = codex_gateway.open_forwarder(plan, config)
        assert forwarder is not None
        try:
            url = config["model_providers"][plan.provider]["base_url"]
            assert url == forwarder.url and CANARY not in json.dumps(config) + json.dumps(plan.env)
            token = {"Authorization": f"Bearer {plan.run_token}"}
            assert requests.post(url + "/responses", json={"model": "auto"}, headers=token, timeout=10).ok
            assert [r["path"] for r in gateway.requests] == [f"{PREFIX}/v1/responses"]
            assert gateway.requests[0]["headers"]["authorization"] == f"Bearer {CANARY}"
            refused = [requests.post(url + "/responses", json={}, headers={"Authorization": f"Bearer {CANARY}"},
                                     timeout=10).status_code,
                       requests.post(url + "/v1/messages", json={}, headers=token, timeout=10).status_code,
                       requests.get(url + "/models", headers=token, timeout=10).status_code]
            assert refused == [401, 404, 404] and len(gateway.requests) == 1  # no open relay
        finally:
            forwarder.close()


def test_codex_whose_run_directory_cannot_be_made_leaves_no_forwarder(tmp_path):
    (tmp_path / "afile").write_text("x")  # runs_dir below a file: the run directory cannot be made
    with FakeGateway([{"text": "hi"}], CANARY, CATALOGUE) as gateway:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CALDERA_CODEX_BIN": "/bin/true", **gateway.injected()}
        environment = base.Environment(redactor=Redactor(), logs_dir=str(tmp_path / "logs"),
                                       runs_dir=str(tmp_path / "afile" / "runs"), secrets_dir=str(tmp_path / "s"),
                                       env=env)
        (tmp_path / "ws").mkdir()
        events: list[dict] = []
        result = service.execute({"run_id": "run-1", "prompt": "x", "workspace": str(tmp_path / "ws"),
                                  "backend_profile": "codex", "execution_policy": {"timeout_seconds": 30}},
                                 environment, roots=None, listeners=[events.append])
    assert result["status"] == "failed" and "cannot prepare the run directory" in result["message"], result
    assert not [t for t in threading.enumerate() if t.name.startswith("codex-forwarder")]
    assert gateway.requests == [] and CANARY not in json.dumps(events)


# ------------------------------------------------------------------ Codex: <BASE>/v1/responses

def test_codex_completes_a_turn_with_a_command_and_a_patch_on_the_gateway_models(tmp_path):
    script = [{"call": "exec_command", "args": {"cmd": "echo from-codex; env"}},
              {"custom": "apply_patch", "input": "*** Begin Patch\n*** Add File: NEW.txt\n+new\n*** End Patch\n"},
              {"text": "done"}]
    with FakeGateway(script, CANARY, CATALOGUE) as gateway:
        turn = GatewayTurn("codex", tmp_path, gateway, model="fake/kimi-k2.6")
    _command_ran(turn, "from-codex")
    assert (turn.workspace / "NEW.txt").read_text() == "new\n"  # apply_patch offered: the run's catalogue
    assert {r["path"] for r in gateway.requests} == {f"{PREFIX}/v1/responses"}
    assert turn.models_asked() == {"kimi-k2.6"}  # "provider/model" listed: the model id is asked
    statuses = turn.of("backend_status")
    assert not [s for s in statuses if "metadata" in str(s.get("message"))]  # Codex knows the model
    starting = statuses[0]
    assert starting["provider_source"] == "gateway" and starting["base_url"] == gateway.url + "/v1"
    turn.assert_token_held_by_the_forwarder_alone()


def test_codex_on_a_gateway_model_it_knows_keeps_its_own_instructions_and_reasoning(tmp_path):
    # The run's catalogue holds Codex's bundled models beside the gateway's others (kimi-k2.6,
    # auto): it replaces the bundled one, and gpt-5.5 would lose its 21 KB of instructions.
    with FakeGateway([{"text": "done"}], CANARY, [*CATALOGUE, "gpt-5.5"]) as gateway:
        turn = GatewayTurn("codex", tmp_path, gateway, model="gpt-5.5")
    assert turn.terminal["status"] == "completed", turn.events
    body = json.loads(gateway.requests[0]["body"])
    developer = [json.dumps(i) for i in body["input"] if i.get("role") == "developer"]
    assert body["model"] == "gpt-5.5" and max(map(len, developer)) > 20000  # its base instructions
    assert body["reasoning"].get("effort") == "medium"  # its default reasoning level
    assert "apply_patch" in {t.get("name") for t in body["tools"]}


def test_codex_with_the_gateway_down_fails_provider_unavailable_at_once(tmp_path):
    with FakeGateway([], CANARY, CATALOGUE) as gateway:
        injected = gateway.injected()
    turn_env = {"CLAWMANAGER_LLM_BASE_URL": injected["CLAWMANAGER_LLM_BASE_URL"]}  # nothing listens there now
    with FakeGateway([], CANARY, CATALOGUE) as other:
        turn = GatewayTurn("codex", tmp_path, other, **turn_env)
    assert turn.terminal["failure_kind"] == "provider-unavailable", turn.events
    assert turn.terminal["duration_ms"] < 20000 and "cannot be reached" in turn.terminal["message"]
    assert other.requests == [] and CANARY not in json.dumps(turn.events)


# ------------------------------------------------------------------ Claude Code: <BASE>/v1/messages

@pytest.mark.parametrize("default", ["kimi-k2.6", "auto"])
def test_claude_code_completes_a_turn_with_a_command_on_the_gateway(tmp_path, default):
    script = [{"tool": "Bash", "input": {"command": "echo from-claude; env", "description": "probe"}},
              {"text": "done"}]
    with FakeGateway(script, CANARY, CATALOGUE) as gateway:
        turn = GatewayTurn("claude-code", tmp_path, gateway, OPENAI_MODEL=default)
    _command_ran(turn, "from-claude")
    assert {r["path"].split("?")[0] for r in gateway.requests} == {f"{PREFIX}/v1/messages"}
    assert turn.models_asked() == {default}  # OPENAI_MODEL, the catalogue lists it: no other model asked
    assert turn.of("backend_status")[0]["provider_source"] == "gateway"
    turn.assert_token_held_by_the_forwarder_alone()


def test_claude_code_on_a_base_url_ending_in_v1_asks_v1_messages_once(tmp_path):
    # OPENAI_BASE_URL, CLAWMANAGER_LLM_BASE_URL's fallback, ends in /v1 by convention.
    with FakeGateway([{"text": "done"}], CANARY, CATALOGUE) as gateway:
        turn = GatewayTurn("claude-code", tmp_path, gateway, CLAWMANAGER_LLM_BASE_URL=None,
                           OPENAI_BASE_URL=gateway.url + "/v1", OPENAI_API_BASE=gateway.url + "/v1")
    assert turn.terminal["status"] == "completed", turn.events
    assert {r["path"].split("?")[0] for r in gateway.requests} == {f"{PREFIX}/v1/messages"} and not gateway.refused


# ------------------------------------------------------------------ OpenCode: <BASE>/chat/completions

def _opencode_config_content() -> str:
    """OPENCODE_CONFIG_CONTENT as the server builds it from CLAWMANAGER_LLM_PROVIDER_MODELS
    (buildOpenCodeGatewayConfig): one provider per provider id, on the gateway's variables."""
    options = {"baseURL": "{env:CLAWMANAGER_LLM_BASE_URL}", "apiKey": "{env:CLAWMANAGER_LLM_API_KEY}"}
    providers = {"auto": {"npm": "@ai-sdk/openai-compatible", "name": "auto", "options": options,
                          "models": {"auto": {"name": "auto"}}},
                 "fake": {"npm": "@ai-sdk/openai-compatible", "name": "fake", "options": options,
                          "models": {m: {"name": m} for m in CATALOGUE if m != "auto"}}}
    return json.dumps({"$schema": "https://opencode.ai/config.json", "model": "auto/auto", "provider": providers,
                       "enabled_providers": ["auto", "fake"], "disabled_providers": ["openai", "anthropic"]})


@pytest.mark.parametrize("content", [True, False], ids=["OPENCODE_CONFIG_CONTENT", "variables"])
def test_opencode_completes_a_turn_with_a_command_on_the_gateway(tmp_path, content):
    script = [{"call": "bash", "args": {"command": "echo from-opencode; env", "description": "probe"}},
              {"text": "done"}]
    with FakeGateway(script, CANARY, CATALOGUE, model="kimi-k2.6") as gateway:
        turn = GatewayTurn("opencode", tmp_path, gateway, model="fake/kimi-k2.6",
                           OPENCODE_CONFIG_CONTENT=_opencode_config_content() if content else None)
    _command_ran(turn, "from-opencode")
    assert {r["path"] for r in gateway.requests} == {f"{PREFIX}/chat/completions"}
    assert "kimi-k2.6" in turn.models_asked()
    turn.assert_token_held_by_the_forwarder_alone()


# ------------------------------------------------------------------ what the state report says

def test_the_report_says_what_each_backend_uses_on_the_gateway(tmp_path):
    with FakeGateway([], CANARY, CATALOGUE) as gateway:
        env = gateway.injected(OPENAI_MODEL="gpt-4.1", CALDERA_WORKSPACE_ROOTS=str(tmp_path),
                               OPENCODE_CONFIG_CONTENT=_opencode_config_content())
    configs = {c.source: c for c in llm_configs(env, str(tmp_path / "secrets"), None)}
    assert sorted(configs) == ["backend claude-code", "backend codex", "backend opencode"]
    for config in configs.values():
        assert (config.status, config.base_url, config.model) == ("gateway", gateway.url, "gpt-4.1"), config
    assert configs["backend opencode"].provider == "fake"  # OPENCODE_CONFIG_CONTENT's provider of the model
