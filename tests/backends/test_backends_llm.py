"""What a backend's control-plane runs get to reach a model, as the state report says it
(issue 34; docs/container.md, "What the report says of the LLM configuration"), and the
gateway model rule in Codex's plan."""
import json
import os
import subprocess
import sys

import pytest
from backends_helpers import CANARY, KEY_ENV, write_projection

from caldera.backends import projection, registry
from caldera.backends.codex import config as cc
from caldera.errors import Refused
from caldera.protocol.llm import EXTERNAL, GATEWAY, report_fields

GATEWAY_URL = "http://clawmanager-gateway.demo-system.svc.cluster.local:9001/api/v1/gateway/llm"
GW = {"CLAWMANAGER_LLM_BASE_URL": GATEWAY_URL, "CLAWMANAGER_LLM_API_KEY": CANARY,
      "CLAWMANAGER_LLM_MODEL": '["auto","gpt-4.1"]', "OPENAI_MODEL": "auto",
      "CLAWMANAGER_LLM_PROVIDER": "openai-compatible", "CALDERA_WORKSPACE_ROOTS": "/srv/ws"}


def _none(tmp_path):
    return cc.Projection.locate(tmp_path / "none")


@pytest.mark.parametrize("requested, model", [(None, "auto"), ("gpt-4.1", "gpt-4.1")])
def test_the_gateway_plan_takes_the_model_by_the_gateway_rule(tmp_path, requested, model):
    plan = cc.plan_provider(_none(tmp_path), GW, requested)
    assert plan.source == "gateway" and plan.model == model and plan.config["model"] == model


def test_the_gateway_plan_never_takes_the_catalogue_for_a_model(tmp_path):
    plan = cc.plan_provider(_none(tmp_path), dict(GW, OPENAI_MODEL=""))
    assert plan.model == "auto"  # the catalogue's first, not '["auto","gpt-4.1"]'
    plan = cc.plan_provider(_none(tmp_path), dict(GW, OPENAI_MODEL="", CLAWMANAGER_LLM_MODEL="gpt-4.1"))
    assert plan.model is None and "model" not in plan.config  # not a list: ignored; Codex's own default
    with pytest.raises(Refused, match=r"model 'o3' is not in the AI gateway's catalogue \(CLAWMANAGER_LLM_MODEL: "
                                      r"auto, gpt-4.1\)"):
        cc.plan_provider(_none(tmp_path), GW, "o3")


def test_a_projection_is_not_held_to_the_gateways_catalogue(tmp_path):
    plan = cc.plan_provider(cc.Projection.locate(write_projection(tmp_path)), GW, "o3")
    assert plan.source == "projection" and plan.model == "o3"


# ---------------------------------------------------------------- the description

def test_without_a_projection_codex_runs_get_the_gateway(tmp_path):
    found = cc.llm_config(GW, str(tmp_path / "secrets"), None)
    assert (found.source, found.status, found.base_url, found.provider, found.model) == (
        "backend codex", GATEWAY, GATEWAY_URL, "openai-compatible", "auto")
    assert cc.llm_config({}, str(tmp_path / "secrets"), None) is None  # neither: nothing handed out


def test_a_projection_is_a_provider_of_its_own_its_url_without_credentials(tmp_path):
    leaky = f"https://user:{CANARY}@llm.corp.test:8443/v1/?api_key={CANARY}#{CANARY}"
    secrets = write_projection(tmp_path, base_url=leaky, model="gpt-5.5")
    found = cc.llm_config(GW, str(secrets), None)
    assert (found.status, found.base_url, found.provider, found.model) == (
        EXTERNAL, "https://llm.corp.test:8443/v1", "fake", "gpt-5.5")
    assert CANARY not in json.dumps(found.as_dict())


def test_a_projected_key_in_the_urls_path_is_not_reported(tmp_path):
    """The daemon's redactor does not know a projection's values (a run adds them to its own):
    the description leaves them out itself."""
    secrets = write_projection(tmp_path, base_url=f"https://llm.corp.test/k/{CANARY}/v1")
    found = cc.llm_config(GW, str(secrets), None)
    assert found.status == EXTERNAL and found.base_url == "https://llm.corp.test"


def test_a_projection_pointing_at_the_gateway_is_the_gateway(tmp_path):
    secrets = write_projection(tmp_path, base_url=GATEWAY_URL + "/", model="gpt-4.1")
    found = cc.llm_config(GW, str(secrets), None)
    assert found.status == GATEWAY and found.model == "gpt-4.1" and found.provider == "fake"


def test_the_builtin_openai_provider_is_openais(tmp_path):
    codex = tmp_path / "secrets" / "codex"
    (codex / "env").mkdir(parents=True)
    (codex / "config.toml").write_text('model = "gpt-5.5"\n')
    (codex / "env" / "OPENAI_API_KEY").write_text(CANARY)
    found = cc.llm_config(GW, str(tmp_path / "secrets"), None)
    assert (found.status, found.base_url, found.provider) == (EXTERNAL, "https://api.openai.com/v1", "openai")


def test_the_builtin_openai_provider_goes_where_openai_base_url_points(tmp_path):
    """Codex's built-in provider takes `openai_base_url` (and refuses a [model_providers.openai]
    table; an OPENAI_BASE_URL in its environment it ignores): tried with Codex 0.169."""
    codex = tmp_path / "secrets" / "codex"
    (codex / "env").mkdir(parents=True)
    (codex / "config.toml").write_text('model_provider = "openai"\nmodel = "gpt-5.5"\n'
                                       'openai_base_url = "https://llm.corp.test/openai/v1"\n')
    (codex / "env" / "OPENAI_API_KEY").write_text(CANARY)
    (codex / "env" / "OPENAI_BASE_URL").write_text("https://ignored.test/v1")
    found = cc.llm_config(GW, str(tmp_path / "secrets"), None)
    assert (found.status, found.base_url, found.provider) == (EXTERNAL, "https://llm.corp.test/openai/v1", "openai")
    (codex / "config.toml").write_text(f'model_provider = "openai"\nopenai_base_url = "{GATEWAY_URL}"\n')
    assert cc.llm_config(GW, str(tmp_path / "secrets"), None).status == GATEWAY  # the gateway, as the URL says


@pytest.mark.parametrize("breakage", ["missing key", "bad toml", "unreadable"])
def test_a_projection_that_cannot_be_used_is_still_external(tmp_path, breakage):
    """A provider of its own is configured; the report must not turn that into `gateway` or
    nothing because a file is broken (the run itself fails with secret-unavailable)."""
    secrets = write_projection(tmp_path, key=None if breakage == "missing key" else CANARY)
    config = secrets / "codex" / "config.toml"
    if breakage == "bad toml":
        config.write_text("model = [unclosed\n")
    if breakage == "unreadable":
        config.write_bytes(b"x" * (projection.MAX_SECRET_FILE_BYTES + 1))
    found = cc.llm_config(GW, str(secrets), None)
    assert (found.source, found.status, found.base_url) == ("backend codex", EXTERNAL, None)


def test_systemd_credentials_are_a_projection_too(tmp_path):
    cred = tmp_path / "cred"
    cred.mkdir()
    (cred / "codex_config.toml").write_text(
        'model_provider = "p"\nmodel = "m"\n[model_providers.p]\nbase_url = "https://x.test/v1"\n'
        f'env_key = "{KEY_ENV}"\n')
    (cred / f"codex_env_{KEY_ENV}").write_text(CANARY)
    [found] = _codex(registry.llm_configs(GW, str(tmp_path / "secrets"), str(cred)))
    assert (found.status, found.base_url, found.model) == (EXTERNAL, "https://x.test/v1", "m")


def _codex(configs):
    return [c for c in configs if c.source == "backend codex"]


# ---------------------------------------------------------------- the registry

def test_no_workspace_roots_no_run_nothing_handed_out(tmp_path):
    secrets = write_projection(tmp_path)
    assert registry.llm_configs(dict(GW, CALDERA_WORKSPACE_ROOTS=""), str(secrets), None) == []
    [found] = _codex(registry.llm_configs(GW, str(secrets), None))
    assert found.status == EXTERNAL


def test_a_backends_description_that_fails_counts_as_external(tmp_path, monkeypatch):
    secrets = write_projection(tmp_path)
    monkeypatch.setitem(registry.LLM_SOURCES, "codex", registry.LLMSource("caldera.backends.codex.config:nothing",
                                                                          projection="codex"))
    assert [(c.source, c.status) for c in _codex(registry.llm_configs(GW, str(secrets), None))] == [
        ("backend codex", EXTERNAL)]


def _fresh_process(code: str) -> str:
    """What `code` prints in a new interpreter: which modules it imported is its own."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout


def test_without_a_projection_the_daemon_never_imports_the_backends_modules(tmp_path):
    """The description of a gateway-only backend is the registry's: codex_config (tomllib and
    all) and OpenCode's provider stay out of a daemon that runs no turn (docs/performance.md,
    section 2)."""
    code = ("import json, sys; from caldera.backends import registry; "
            f"found = registry.llm_configs({GW!r}, {str(tmp_path / 'secrets')!r}, None); "
            "print(json.dumps([[c.status, c.model] for c in found]), "
            "sorted(m for m in sys.modules if m.startswith('caldera.backends.') or m == 'tomllib'))")
    out = _fresh_process(code)
    assert out.strip() == ("[[\"gateway\", \"auto\"], [\"gateway\", \"auto\"], [\"gateway\", \"auto\"]] "
                           "['caldera.backends.registry']")


# ---------------------------------------------------------------- Claude Code

def _claude_projection(tmp_path, **env):
    root = tmp_path / "secrets" / "claude-code" / "env"
    root.mkdir(parents=True, exist_ok=True)
    for name, value in env.items():
        (root / name).write_text(value + "\n")
    return str(tmp_path / "secrets")


def test_claude_code_runs_get_the_projections_provider_never_the_gateway(tmp_path):
    from caldera.backends.claude_code import config as claude

    secrets = _claude_projection(tmp_path, ANTHROPIC_API_KEY=CANARY, ANTHROPIC_MODEL="claude-opus-5-5",
                                 ANTHROPIC_BASE_URL=f"https://llm.corp.test:8443/anthropic/{CANARY}")
    found = {c.source: c for c in registry.llm_configs(GW, secrets, None)}
    claude_code = found["backend claude-code"]
    assert (claude_code.status, claude_code.base_url, claude_code.provider, claude_code.model) == (
        EXTERNAL, "https://llm.corp.test:8443", "anthropic", "claude-opus-5-5")  # the key in the path: cut
    assert found["backend codex"].status == GATEWAY  # Codex without a projection of its own
    report = report_fields(found.values())
    assert CANARY not in json.dumps(report) and report["llm_config_status"] == EXTERNAL
    default = claude.llm_config(GW, _claude_projection(tmp_path / "b", ANTHROPIC_AUTH_TOKEN=CANARY), None)
    assert (default.status, default.base_url, default.provider, default.model) == (
        EXTERNAL, "https://api.anthropic.com", "anthropic", None)


def test_without_a_projection_claude_code_gets_the_gateway_and_is_not_imported(tmp_path):
    """No projection: a Claude Code run gets the gateway (its Messages route, issue 45), as the
    registry describes it without importing the backend; without the gateway, nothing."""
    code = ("import json, sys; from caldera.backends import registry; "
            f"found = registry.llm_configs({GW!r}, {str(tmp_path / 'secrets')!r}, None); "
            "none = registry.llm_configs({'CALDERA_WORKSPACE_ROOTS': '/srv/ws'}, "
            f"{str(tmp_path / 'secrets')!r}, None); "
            "print(json.dumps([[[c.source, c.status] for c in found], len(none), "
            "sorted(m for m in sys.modules if m.startswith('caldera.backends.claude_code'))]))")
    out = _fresh_process(code)
    sources, others, modules = json.loads(out)
    assert ["backend claude-code", GATEWAY] in sources and others == 0 and modules == []


def test_a_claude_code_projection_that_cannot_be_used_is_still_external(tmp_path):
    secrets = _claude_projection(tmp_path, ANTHROPIC_BASE_URL="https://llm.corp.test")  # no key
    found = {c.source: c for c in registry.llm_configs({"CALDERA_WORKSPACE_ROOTS": "/srv/ws"}, secrets, None)}
    assert (found["backend claude-code"].status, found["backend claude-code"].base_url) == (EXTERNAL, None)


def test_a_claude_code_projection_on_the_gateways_url_is_the_gateway(tmp_path):
    from caldera.backends.claude_code import config as claude

    gateway = dict(GW, CLAWMANAGER_LLM_BASE_URL="https://cm.example/api/v1/gateway/llm")
    secrets = _claude_projection(tmp_path, ANTHROPIC_AUTH_TOKEN=CANARY, ANTHROPIC_MODEL="auto",
                                 ANTHROPIC_BASE_URL=gateway["CLAWMANAGER_LLM_BASE_URL"])
    found = claude.llm_config(gateway, secrets, None)
    assert (found.status, found.provider, found.model) == (GATEWAY, "anthropic", "auto")
