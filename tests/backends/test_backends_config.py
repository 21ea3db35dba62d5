"""Projection reading, provider plans, enforced settings and the TOML writer."""
import json
import os
import stat
import time
import tomllib

import pytest
from backends_helpers import CANARY, KEY_ENV, write_projection

from caldera.backends import failures as fk
from caldera.backends.codex import catalogue
from caldera.backends.codex import config as cc
from caldera.backends.forwarder import process_secret


def plan_for(tmp_path, environ=None, **kw):
    sec = write_projection(tmp_path, **kw)
    return cc.plan_provider(cc.Projection.locate(sec), environ or {})


def test_plan_reads_config_env_files_and_secret_values(tmp_path):
    plan = plan_for(tmp_path, provider_extra='experimental_bearer_token = "tok-abcdefgh"\n'
                                             '[model_providers.fake.http_headers]\nX-Key = "hdr-secret-1"\n')
    # the bearer token and the headers' values go to Codex's environment, not to CODEX_HOME
    assert plan.provider == "fake" and plan.model == "gpt-5.5" and plan.env == {
        KEY_ENV: CANARY, cc.BEARER_ENV: "tok-abcdefgh", "CODEX_PROVIDER_HEADER_0": "hdr-secret-1"}
    provider = plan.config["model_providers"]["fake"]
    assert provider["env_key"] == cc.BEARER_ENV and provider["env_http_headers"] == {"X-Key": "CODEX_PROVIDER_HEADER_0"}
    assert "experimental_bearer_token" not in provider and "http_headers" not in provider
    assert plan.base_url == "http://127.0.0.1:9/v1"
    assert {CANARY, "tok-abcdefgh", "hdr-secret-1"} <= set(plan.secret_values)
    assert "gpt-5.5" not in plan.secret_values  # model and URL may be shown


def test_missing_env_key_file_is_secret_unavailable(tmp_path):
    with pytest.raises(fk.BackendFailure) as exc:
        plan_for(tmp_path, key=None)
    assert exc.value.kind == fk.SECRET_UNAVAILABLE and KEY_ENV in exc.value.message


def test_empty_env_key_file_is_secret_unavailable(tmp_path):
    with pytest.raises(fk.BackendFailure) as exc:
        plan_for(tmp_path, key="")
    assert exc.value.kind == fk.SECRET_UNAVAILABLE and "empty" in exc.value.message


def test_unreadable_file_is_secret_unavailable(tmp_path):
    sec = write_projection(tmp_path)
    (sec / "codex" / "env" / KEY_ENV).unlink()
    (sec / "codex" / "env" / KEY_ENV).mkdir()  # a directory cannot be read as a file, even by root
    with pytest.raises(fk.BackendFailure) as exc:
        cc.plan_provider(cc.Projection.locate(sec), {})
    assert exc.value.kind == fk.SECRET_UNAVAILABLE and "cannot read" in exc.value.message


def test_auth_command_file_is_checked_before_spawn(tmp_path):
    extra = f'[model_providers.fake.auth]\ncommand = "cat"\nargs = ["{tmp_path}/gone"]\n'
    with pytest.raises(fk.BackendFailure) as exc:
        plan_for(tmp_path, provider_extra=extra)
    assert exc.value.kind == fk.SECRET_UNAVAILABLE and "not readable" in exc.value.message


def test_invalid_toml_is_backend_failed_without_content(tmp_path):
    sec = write_projection(tmp_path)
    (sec / "codex" / "config.toml").write_text(f'model = gpt-5.5 {CANARY}\n')
    with pytest.raises(fk.BackendFailure) as exc:
        cc.plan_provider(cc.Projection.locate(sec), {})
    assert exc.value.kind == fk.BACKEND_FAILED and "line 1" in exc.value.message
    assert CANARY not in exc.value.message


def test_openai_provider_needs_auth_json_or_key(tmp_path):
    codex = tmp_path / "secrets" / "codex"
    codex.mkdir(parents=True)
    (codex / "config.toml").write_text('model = "gpt-5.5"\n')
    with pytest.raises(fk.BackendFailure) as exc:
        cc.plan_provider(cc.Projection.locate(tmp_path / "secrets"), {})
    assert exc.value.kind == fk.SECRET_UNAVAILABLE
    (codex / "auth.json").write_text('{"auth_mode":"apikey","OPENAI_API_KEY":"sk-authjson-secret-123"}')
    plan = cc.plan_provider(cc.Projection.locate(tmp_path / "secrets"), {})
    # the built-in provider takes no key from its environment: auth.json stays (backend_status says so)
    assert "sk-authjson-secret-123" in plan.secret_values and plan.auth_json
    # a custom provider's: the key goes to Codex's environment, no auth.json in CODEX_HOME
    (codex / "config.toml").write_text('model_provider = "p"\n[model_providers.p]\nbase_url = "http://x/v1"\n'
                                       'requires_openai_auth = true\n')
    plan = cc.plan_provider(cc.Projection.locate(tmp_path / "secrets"), {})
    assert plan.auth_json is None and plan.env == {"OPENAI_API_KEY": "sk-authjson-secret-123"}
    assert plan.config["model_providers"]["p"] == {"base_url": "http://x/v1", "env_key": "OPENAI_API_KEY"}
    login = {"OPENAI_API_KEY": None, "tokens": {"access_token": "at-secret-123", "refresh_token": "rt"}}
    (codex / "auth.json").write_text(json.dumps(login))
    plan = cc.plan_provider(cc.Projection.locate(tmp_path / "secrets"), {})
    assert plan.auth_json is not None and plan.env == {}  # a ChatGPT login's: Codex refreshes it in the file


def test_gateway_from_environment_when_no_projection(tmp_path):
    environ = {"CLAWMANAGER_LLM_BASE_URL": "http://gw.local/v1", "CLAWMANAGER_LLM_API_KEY": "gw-key-123456",
               "OPENAI_MODEL": "gpt-5.5"}
    plan = cc.plan_provider(cc.Projection.locate(tmp_path / "none"), environ)
    assert plan.source == "gateway" and plan.provider == cc.GATEWAY_PROVIDER and plan.model == "gpt-5.5"
    # Codex's environment holds the run's token; the key is the run's forwarder's alone.
    assert plan.env == {cc.GATEWAY_KEY_ENV: plan.run_token} and plan.run_token.startswith("caldera-run-")
    assert plan.key == "gw-key-123456" and plan.secret_values == ["gw-key-123456"]
    # the run token is masked by its prefix, one Redactor value for every run (not one more per run)
    assert plan.run_token.startswith("caldera-run-" + process_secret())
    provider = plan.config["model_providers"][cc.GATEWAY_PROVIDER]
    assert provider["wire_api"] == "responses" and provider["env_key"] == cc.GATEWAY_KEY_ENV
    assert "gw-key-123456" not in cc.dump_toml(plan.config)
    assert provider["base_url"] == plan.upstream == "http://gw.local/v1"  # it ends in /v1 already: kept
    assert [m["slug"] for m in plan.catalogue or []] == ["gpt-5.5"]  # no catalogue: the run's model


@pytest.mark.parametrize("base", ["http://gw/api/v1/gateway/llm", "http://gw/api/v1/gateway/llm/",
                                  "http://gw/api/v1/gateway/llm/v1"])
def test_codex_on_the_gateway_asks_under_base_v1_and_knows_its_models(tmp_path, base):
    environ = {"CLAWMANAGER_LLM_BASE_URL": base, "CLAWMANAGER_LLM_API_KEY": "gw-key-123456",
               "CLAWMANAGER_LLM_MODEL": '["auto", "glm-5"]', "OPENAI_MODEL": "auto"}
    plan = cc.plan_provider(cc.Projection.locate(tmp_path / "none"), environ)
    assert plan.upstream == plan.base_url == "http://gw/api/v1/gateway/llm/v1"  # Codex appends /responses
    catalogue = plan.catalogue or []
    assert [m["slug"] for m in catalogue] == ["auto", "glm-5"]
    assert {(m["shell_type"], m["apply_patch_tool_type"], m["context_window"]) for m in catalogue} == {
        ("shell_command", "freeform", 128000)}
    home = tmp_path / "home"
    cc.write_codex_home(home, plan, cc.enforce(plan, network=False, request_retries=1, stream_retries=1))
    written = (home / "config.toml").read_text()
    assert f'model_catalog_json = "{home / "models.json"}"' in written and "gw-key-123456" not in written
    assert [m["slug"] for m in json.loads((home / "models.json").read_text())["models"]] == ["auto", "glm-5"]


def test_credentials_directory_flat_names(tmp_path):
    cred = tmp_path / "cred"
    cred.mkdir()
    (cred / "codex_config.toml").write_text(
        'model_provider = "p"\n[model_providers.p]\nbase_url = "http://x/v1"\nenv_key = "K"\n')
    (cred / "codex_env_K").write_text("flat-secret-value\n")
    plan = cc.plan_provider(cc.Projection.locate(None, str(cred)), {})
    assert plan.env == {"K": "flat-secret-value"}


def test_enforce_adds_runtime_settings_and_bounds_retries(tmp_path):
    plan = plan_for(tmp_path, extra_toml='profile = "other"\n[shell_environment_policy]\nexclude = ["AWS_*"]\n'
                                         'set = { LEAK = "x" }\n',
                    provider_extra="request_max_retries = 9\nstream_max_retries = 0\n")
    config = cc.enforce(plan, network=False, request_retries=1, stream_retries=2)
    back = tomllib.loads(cc.dump_toml(config))
    assert back["shell_environment_policy"] == {"exclude": ["AWS_*", KEY_ENV]}
    assert back["features"] == {"plugins": False, "remote_plugin": False, "apps": False, "tool_suggest": False,
                                "unbounded_connection_retries": False}
    assert back["analytics"] == {"enabled": False}
    assert back["sandbox_workspace_write"] == {"network_access": False}
    assert back["model_providers"]["fake"]["request_max_retries"] == 1  # 9 bounded to 1
    assert back["model_providers"]["fake"]["stream_max_retries"] == 0  # lower stays lower
    assert "stream_idle_timeout_ms" not in back["model_providers"]["fake"]  # no stall bound: Codex's own
    assert "profile" not in back
    stalled = cc.enforce(plan, network=False, request_retries=1, stream_retries=2, stall_seconds=60)
    assert stalled["model_providers"]["fake"]["stream_idle_timeout_ms"] == 60_000  # the stall bound


def test_toml_writer_round_trips_awkward_values():
    doc = {"a": 'quote " back \\ nl \n tab \t é del \x7f nul \x00 esc \x1b', "n": 3, "f": 1.5, "b": True,
           "list": [1, "x", {"k": "v"}],
           "t": {"dotted.key": {"deep": []}, "x y": "z"}}
    assert tomllib.loads(cc.dump_toml(doc)) == doc


def test_write_codex_home_is_private(tmp_path):
    plan = plan_for(tmp_path)
    home = tmp_path / "home"
    cc.write_codex_home(home, plan, cc.enforce(plan, network=True, request_retries=0, stream_retries=0))
    st = os.stat(home)  # a directory nobody but the owner may read, write or enter
    assert stat.S_ISDIR(st.st_mode) and not st.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    assert oct(os.stat(home / "config.toml").st_mode & 0o777) == "0o600"
    assert CANARY not in (home / "config.toml").read_text()


# ------------------------------------------------------------------ the gateway's catalogue beside Codex's own

def _codex_printing(tmp_path, body: str, name: str = "codex") -> str:
    """A stand-in binary for `codex debug models --bundled` that counts its calls in `calls`."""
    binary = tmp_path / name
    binary.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/calls"\n{body}\n')
    binary.chmod(0o755)
    return str(binary)


BUNDLED = {"models": [{"slug": "gpt-5.5", "base_instructions": "long", "priority": 13}, {"slug": "o9"}]}


def test_the_run_catalogue_is_codexs_own_plus_the_gateway_models_it_lacks(tmp_path):
    binary = _codex_printing(tmp_path, f"echo '{json.dumps(BUNDLED)}'")
    entries = [cc.gateway_model_entry(m, i) for i, m in enumerate(["gpt-5.5", "kimi-k2.6"])]
    merged = catalogue.run_catalogue(binary, entries) or []
    assert merged[:2] == BUNDLED["models"]  # gpt-5.5 as Codex knows it, not the gateway's entry
    assert [m["slug"] for m in merged] == ["gpt-5.5", "o9", "kimi-k2.6"] and merged[2] == entries[1]
    assert catalogue.run_catalogue(binary, entries[:1]) is None  # every one known: Codex's own, no file
    assert (tmp_path / "calls").read_text() == "debug models --bundled\n"  # read once for the binary
    os.utime(binary, ns=(0, 0))  # another binary at that path: read again
    catalogue.run_catalogue(binary, entries)
    assert (tmp_path / "calls").read_text().count("\n") == 2


@pytest.mark.parametrize("body", ["exit 1", "echo not-json", "echo '{\"models\": [{\"name\": \"x\"}]}'",
                                  "head -c 20000000 /dev/zero"])
def test_a_bundled_catalogue_that_cannot_be_read_writes_none(tmp_path, body):
    binary = _codex_printing(tmp_path, body)
    said: list[str] = []
    assert catalogue.run_catalogue(binary, [cc.gateway_model_entry("kimi", 0)], said.append) is None
    assert len(said) == 1 and "Codex's own" in said[0]


def test_a_bundled_catalogue_that_takes_too_long_is_none_and_asked_again(tmp_path, monkeypatch):
    monkeypatch.setattr(catalogue, "BUNDLED_TIMEOUT", 0.3)
    binary = _codex_printing(tmp_path, "exec sleep 30")
    started = time.monotonic()
    assert catalogue.run_catalogue(binary, [cc.gateway_model_entry("kimi", 0)]) is None
    assert time.monotonic() - started < 5
    assert catalogue.run_catalogue(binary, [cc.gateway_model_entry("kimi", 0)]) is None
    assert (tmp_path / "calls").read_text().count("\n") == 2  # a timeout is not kept


def test_the_real_codexs_bundled_catalogue_is_read(tmp_path):
    binary = os.environ.get("CALDERA_CODEX_BIN")
    if not binary:
        pytest.skip("the real Codex CLI is not available (CALDERA_CODEX_BIN)")
    bundled = catalogue.bundled_models(binary) or []
    known = {m["slug"]: m for m in bundled}
    assert len(known["gpt-5.5"]["base_instructions"]) > 20000
    merged = catalogue.run_catalogue(binary, [cc.gateway_model_entry(m, i) for i, m in enumerate(["gpt-5.5", "k"])])
    assert [m["slug"] for m in merged or []] == [*known, "k"]
