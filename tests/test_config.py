import json
import os

import pytest
from core_helpers import BOOT, Args, install_agent

from caldera.config import agent_from_args, load_settings
from caldera.errors import ConfigError, Refused


def test_settings_merge_env_then_agent_env_then_secrets(caldera_env, monkeypatch):
    install_agent(caldera_env, extra_env="CALDERA_RUNTIME_TYPE=fromfile\n")
    monkeypatch.setenv("CALDERA_RUNTIME_TYPE", "fromenv")
    monkeypatch.setenv("CALDERA_TOKEN", "from-process-env")
    settings = load_settings(agent_from_args(Args(agent="demo")))
    assert settings.runtime_type == "fromfile"  # agent.env beats the process environment
    assert settings.bootstrap_token == BOOT  # secrets.env beats both
    assert settings.instance_id == 7 and settings.enabled
    assert settings.agent_id == "fromfile-7-main"
    assert BOOT in settings.secret_values


def test_clawmanager_aliases_are_read(caldera_env, monkeypatch):
    config = install_agent(caldera_env)
    (config / "agent.env").write_text("")
    (config / "secrets.env").write_text("")
    monkeypatch.setenv("CLAWMANAGER_AGENT_ENABLED", "true")
    monkeypatch.setenv("CLAWMANAGER_AGENT_BASE_URL", "https://cm.example.test/")
    monkeypatch.setenv("CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN", "cm-boot-token")
    monkeypatch.setenv("CLAWMANAGER_AGENT_INSTANCE_ID", "42")
    monkeypatch.setenv("CLAWMANAGER_AGENT_DISK_LIMIT_BYTES", "1000")
    settings = load_settings(agent_from_args(Args(agent="demo")))
    assert settings.base_url == "https://cm.example.test"
    assert settings.bootstrap_token == "cm-boot-token"
    assert settings.instance_id == 42 and settings.disk_limit_bytes == 1000


@pytest.mark.parametrize("line, variable", [
    ("CALDERA_INSTANCE_ID=abc", "CALDERA_INSTANCE_ID"),
    ("CALDERA_AGENT_ENABLED=maybe", "CALDERA_AGENT_ENABLED"),
    ("CALDERA_BASE_URL=http://cm.example.test", "CALDERA_ALLOW_PLAIN_HTTP=true"),
    ("CALDERA_ALLOW_PLAIN_HTTP=perhaps", "CALDERA_ALLOW_PLAIN_HTTP"),
    ("CALDERA_BASE_URL=https://cm.example.test/api/v1/agent", "without /api/v1/agent"),
    ("CALDERA_PROTOCOL_VERSION=v2", "CALDERA_PROTOCOL_VERSION"),
    ("CALDERA_LOG_LEVEL=loud", "CALDERA_LOG_LEVEL"),
    ("CALDERA_REPORT_INTERVAL_SECONDS=1", "CALDERA_REPORT_INTERVAL_SECONDS"),
])
def test_bad_values_name_the_variable(caldera_env, line, variable):
    config = install_agent(caldera_env)
    with open(config / "agent.env", "a") as fh:
        fh.write(line + "\n")
    with pytest.raises(ConfigError) as err:
        load_settings(agent_from_args(Args(agent="demo")))
    assert variable in str(err.value)


def _instance_env(monkeypatch, config, url="http://clawmanager-gateway.demo-system.svc.cluster.local:9001"):
    """Exactly what ClawManager injects (clawmanager-notes 1.5), no agent.env or secrets.env values."""
    (config / "agent.env").write_text("")
    (config / "secrets.env").write_text("")
    for name, value in (("ENABLED", "true"), ("BASE_URL", url), ("BOOTSTRAP_TOKEN", "agt_boot_" + "ab" * 24),
                        ("INSTANCE_ID", "12"), ("PERSISTENT_DIR", "/config/.hermes"), ("PROTOCOL_VERSION", "v1")):
        monkeypatch.setenv("CLAWMANAGER_AGENT_" + name, value)


def test_the_injected_plain_http_gateway_is_taken_as_it_is(caldera_env, monkeypatch):
    """Issue 22: a stock instance's URL is the in-cluster gateway over plain http (SPEC section 3)."""
    config = install_agent(caldera_env)
    _instance_env(monkeypatch, config)
    monkeypatch.setenv("CLAWMANAGER_AGENT_RUNTIME_TYPE", "hermes")  # what a current server injects
    monkeypatch.setenv("CLAWMANAGER_RUNTIME_TYPE", "desktop")
    settings = load_settings(agent_from_args(Args(agent="demo")))
    assert settings.base_url == "http://clawmanager-gateway.demo-system.svc.cluster.local:9001"
    assert settings.plain_http_host == "clawmanager-gateway.demo-system.svc.cluster.local"
    assert settings.agent_id == "hermes-12-main" and settings.runtime_type == "hermes"


@pytest.mark.parametrize("injected, agent_env, runtime", [
    # an older server: only the placement marker; it is never the runtime's name
    ({"CLAWMANAGER_RUNTIME_TYPE": "desktop"}, "", "caldera"),
    ({"CLAWMANAGER_RUNTIME_TYPE": "gateway"}, "", "caldera"),
    ({"CLAWMANAGER_RUNTIME_TYPE": "shell"}, "CALDERA_RUNTIME_TYPE=openclaw\n", "openclaw"),
    ({"CLAWMANAGER_RUNTIME_TYPE": "hermes"}, "", "caldera"),  # not read at all, whatever it holds
    # the platform's runtime name beats the image's CALDERA_RUNTIME_TYPE; trimmed, lower case
    ({"CLAWMANAGER_AGENT_RUNTIME_TYPE": " Claude-Code ", "CLAWMANAGER_RUNTIME_TYPE": "desktop"},
     "CALDERA_RUNTIME_TYPE=openclaw\n", "claude-code"),
    # a marker there is passed over, as ClawManager's own agent does
    ({"CLAWMANAGER_AGENT_RUNTIME_TYPE": "desktop"}, "CALDERA_RUNTIME_TYPE=opencode\n", "opencode"),
])
def test_runtime_type_comes_from_the_platforms_name_then_calderas_never_the_marker(
        caldera_env, monkeypatch, injected, agent_env, runtime):
    config = install_agent(caldera_env)
    _instance_env(monkeypatch, config)
    (config / "agent.env").write_text(agent_env)
    for name, value in injected.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(agent_from_args(Args(agent="demo")))
    assert settings.runtime_type == runtime and settings.agent_id == f"{runtime}-12-main"
    assert all(marker not in settings.agent_id for marker in ("desktop", "gateway", "shell"))


@pytest.mark.parametrize("env, words", [
    ({"CALDERA_RUNTIME_TYPE": "desktop"}, "CALDERA_RUNTIME_TYPE='desktop': desktop, gateway, shell are"),
    ({"CLAWMANAGER_AGENT_RUNTIME_TYPE": "her mes"}, "CLAWMANAGER_AGENT_RUNTIME_TYPE='her mes': lowercase"),
    ({"CLAWMANAGER_AGENT_ID": "hermes 12"}, "CLAWMANAGER_AGENT_ID='hermes 12': use letters"),
    ({"CLAWMANAGER_AGENT_ID": "-x"}, "starting with a letter or digit (it starts with '-')"),
    ({"CLAWMANAGER_AGENT_ID": "hermes-12-main\n"}, "CLAWMANAGER_AGENT_ID='hermes-12-main\\n': use letters"),
    # what is wrong is named: a blank at an end (which the server trims), a character not allowed
    ({"CLAWMANAGER_AGENT_ID": "hermes-12-main\n"}, "('\\n' at its end: the server trims it at register and then "
                                                   "refuses every command)"),
    ({"CLAWMANAGER_AGENT_ID": "team/hermes"}, "('/' is not one of them)"),
    ({"CLAWMANAGER_AGENT_ID": "café-12"}, "('é' (U+00E9) is not one of them: ASCII only)"),
    ({"CLAWMANAGER_AGENT_ID": "hermes 12"}, "(' ' inside it: no spaces)"),
    ({"CALDERA_AGENT_ID": "a\tb", "CLAWMANAGER_AGENT_ID": "fine"}, "CALDERA_AGENT_ID="),
    ({"CLAWMANAGER_AGENT_ID": "a" * 256}, "CLAWMANAGER_AGENT_ID: 256 characters, the control plane keeps at most 255"),
])
def test_a_bad_runtime_type_or_agent_id_is_refused_with_a_sentence(caldera_env, monkeypatch, env, words):
    config = install_agent(caldera_env)
    _instance_env(monkeypatch, config)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        load_settings(agent_from_args(Args(agent="demo")))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_agent_id_is_given_by_calderas_name_then_clawmanagers(caldera_env, monkeypatch):
    config = install_agent(caldera_env)
    _instance_env(monkeypatch, config)
    monkeypatch.setenv("CLAWMANAGER_AGENT_RUNTIME_TYPE", "hermes")
    monkeypatch.setenv("CLAWMANAGER_AGENT_ID", "team-a.hermes:12@main")
    assert load_settings(agent_from_args(Args(agent="demo"))).agent_id == "team-a.hermes:12@main"
    monkeypatch.setenv("CLAWMANAGER_AGENT_ID", "a" * 255)  # the server's column, exactly
    assert load_settings(agent_from_args(Args(agent="demo"))).agent_id == "a" * 255
    (config / "agent.env").write_text("CALDERA_AGENT_ID=mine-1\n")
    settings = load_settings(agent_from_args(Args(agent="demo")))
    assert settings.agent_id == "mine-1" and settings.runtime_type == "hermes"


@pytest.mark.parametrize("where, allow, taken", [
    ("CALDERA_BASE_URL", None, False),  # the operator's own name: not the platform's injection
    ("CALDERA_BASE_URL", "true", True),  # the operator's explicit consent
    ("CALDERA_BASE_URL", "false", False),
    ("agent.env", None, False),  # CALDERA_BASE_URL in agent.env wins over the injected one
    ("agent.env", "yes", True),
])
def test_any_other_plain_http_url_needs_the_operators_consent(caldera_env, monkeypatch, where, allow, taken):
    config = install_agent(caldera_env)
    _instance_env(monkeypatch, config, url="https://cm.example.test")
    if where == "CALDERA_BASE_URL":
        monkeypatch.setenv("CALDERA_BASE_URL", "http://cm.example.test:8080")
    else:
        (config / "agent.env").write_text("CALDERA_BASE_URL=http://cm.example.test:8080\n")
    if allow is not None:
        monkeypatch.setenv("CALDERA_ALLOW_PLAIN_HTTP", allow)
    paths = agent_from_args(Args(agent="demo"))
    if taken:
        assert load_settings(paths).plain_http_host == "cm.example.test"
        return
    with pytest.raises(ConfigError) as err:
        load_settings(paths)
    sentence = str(err.value)
    assert sentence.startswith("CALDERA_BASE_URL (or CLAWMANAGER_AGENT_BASE_URL): plain http:// to cm.example.test")
    assert "CALDERA_ALLOW_PLAIN_HTTP=true" in sentence and "loopback" in sentence


@pytest.mark.parametrize("injected", [None, "https://cm.example.test", "http://clawmanager-gateway.demo-system:9001"])
def test_the_plain_http_exemption_is_for_the_process_environment_only(caldera_env, monkeypatch, injected):
    """SPEC section 3 exempts the URL the platform injects, i.e. the process environment's
    CLAWMANAGER_AGENT_BASE_URL: the same name written in agent.env (with or without an injected
    one beside it) is the operator's, and plain http there is refused."""
    config = install_agent(caldera_env)
    _instance_env(monkeypatch, config)
    if injected is None:
        monkeypatch.delenv("CLAWMANAGER_AGENT_BASE_URL")
    else:
        monkeypatch.setenv("CLAWMANAGER_AGENT_BASE_URL", injected)
    (config / "agent.env").write_text("CLAWMANAGER_AGENT_BASE_URL=http://evil.example.com\n")
    with pytest.raises(ConfigError) as err:
        load_settings(agent_from_args(Args(agent="demo")))
    assert "plain http:// to evil.example.com is refused" in str(err.value)


def test_the_injected_url_is_judged_on_the_environ_passed_in(caldera_env, monkeypatch):
    config = install_agent(caldera_env)
    _instance_env(monkeypatch, config)
    environ = dict(os.environ)
    monkeypatch.delenv("CLAWMANAGER_AGENT_BASE_URL")  # not in os.environ: only in the mapping given
    paths = agent_from_args(Args(agent="demo"))
    settings = load_settings(paths, environ)
    assert settings.plain_http_host == "clawmanager-gateway.demo-system.svc.cluster.local"
    # the same URL from agent.env, the process environment without it: refused
    (config / "agent.env").write_text(f"CLAWMANAGER_AGENT_BASE_URL={environ['CLAWMANAGER_AGENT_BASE_URL']}\n")
    del environ["CLAWMANAGER_AGENT_BASE_URL"]
    with pytest.raises(ConfigError):
        load_settings(paths, environ)


def test_what_the_platform_injected_is_the_process_environments_no_env_file_replaced(caldera_env, monkeypatch):
    """The LLM-governance status trusts the gateway's URL only as the platform injected it."""
    config = install_agent(caldera_env)
    _instance_env(monkeypatch, config)
    monkeypatch.setenv("CLAWMANAGER_LLM_BASE_URL", "http://gw.test/api/v1/gateway/llm")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gw.test/api/v1/gateway/llm")
    (config / "agent.env").write_text("OPENAI_BASE_URL=https://api.openai.com/v1\nOPENAI_API_BASE=https://x.test/v1\n")
    settings = load_settings(agent_from_args(Args(agent="demo")))
    assert settings.injected == {"CLAWMANAGER_LLM_BASE_URL": "http://gw.test/api/v1/gateway/llm",
                                 "CLAWMANAGER_AGENT_BASE_URL": "http://clawmanager-gateway.demo-system.svc.cluster.local:9001"}
    assert settings.env["OPENAI_BASE_URL"] == "https://api.openai.com/v1"  # in use, but the operator's


def test_loopback_and_https_are_not_named_as_plain_http(caldera_env, monkeypatch):
    config = install_agent(caldera_env, base_url="http://127.0.0.1:8930")
    assert load_settings(agent_from_args(Args(agent="demo"))).plain_http_host is None
    (config / "agent.env").write_text("CALDERA_AGENT_ENABLED=true\nCALDERA_INSTANCE_ID=7\n"
                                      "CALDERA_BASE_URL=http://localhost:8930\n")
    assert load_settings(agent_from_args(Args(agent="demo"))).plain_http_host is None
    (config / "agent.env").write_text("CALDERA_AGENT_ENABLED=true\nCALDERA_INSTANCE_ID=7\n"
                                      "CALDERA_BASE_URL=https://cm.example.test\n")
    assert load_settings(agent_from_args(Args(agent="demo"))).plain_http_host is None


def test_state_in_the_persistent_dir_unless_a_state_dir_is_named(monkeypatch):
    from caldera.config import state_in_persistent_dir

    assert state_in_persistent_dir({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config/.hermes"})
    assert state_in_persistent_dir({"CALDERA_PERSISTENT_DIR": "/config"})
    assert not state_in_persistent_dir({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config", "CALDERA_STATE_DIR": "/s"})
    assert not state_in_persistent_dir({})


def test_url_with_credentials_is_refused_without_echoing_them(caldera_env):
    config = install_agent(caldera_env)
    with open(config / "agent.env", "a") as fh:
        fh.write("CALDERA_BASE_URL=https://user:hunter22@cm.example.test\n")
    with pytest.raises(ConfigError) as err:
        load_settings(agent_from_args(Args(agent="demo")))
    assert "credentials" in str(err.value) and "hunter22" not in str(err.value)


def test_readable_secrets_env_is_refused(caldera_env):
    config = install_agent(caldera_env)
    os.chmod(config / "secrets.env", 0o640)
    with pytest.raises(ConfigError) as err:
        load_settings(agent_from_args(Args(agent="demo")))
    assert "secrets.env" in str(err.value) and "chmod 600" in str(err.value)


def test_enabled_requires_token_and_names_both_spellings(caldera_env):
    config = install_agent(caldera_env)
    (config / "secrets.env").write_text("")
    with pytest.raises(ConfigError) as err:
        load_settings(agent_from_args(Args(agent="demo")))
    assert "CALDERA_TOKEN (or CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN)" in str(err.value)


def test_a_bootstrap_token_with_a_line_break_is_refused_unquoted(caldera_env, monkeypatch):
    """A Kubernetes secret's trailing newline in the environment: refused at load, as the
    backends refuse such a key, never sent (http.client's error would quote it whole)."""
    config = install_agent(caldera_env)
    (config / "secrets.env").write_text("")
    monkeypatch.setenv("CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN", "cm-boot-secret\n")
    with pytest.raises(ConfigError, match="not one line of printable characters") as err:
        load_settings(agent_from_args(Args(agent="demo")))
    assert "cm-boot-secret" not in str(err.value)


def test_the_ca_bundle_may_be_a_directory_of_hashed_certificates(caldera_env, monkeypatch, tmp_path):
    install_agent(caldera_env)
    monkeypatch.setenv("CALDERA_CA_BUNDLE", str(tmp_path))
    assert load_settings(agent_from_args(Args(agent="demo"))).ca_bundle == str(tmp_path)
    monkeypatch.setenv("CALDERA_CA_BUNDLE", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="no such file or directory"):
        load_settings(agent_from_args(Args(agent="demo")))


def test_agent_selection(caldera_env, monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="none"):
        agent_from_args(Args())
    install_agent(caldera_env, name="one")
    assert agent_from_args(Args()).name == "one"  # the only one installed
    install_agent(caldera_env, name="two")
    with pytest.raises(ConfigError, match="one, two"):
        agent_from_args(Args())
    monkeypatch.setenv("CALDERA_AGENT", "two")
    paths = agent_from_args(Args())
    assert paths.name == "two" and paths.state_dir == tmp_path / "var" / "two"
    with pytest.raises(ConfigError, match="no agent 'three'"):
        agent_from_args(Args(agent="three"))


def test_manifest_flag_and_clawmanager_persistent_dir(caldera_env, monkeypatch, tmp_path):
    manifest = tmp_path / "elsewhere" / "caldera.agent.yaml"
    manifest.parent.mkdir()
    manifest.write_text("name: roaming\nruntime:\n  type: adapter\n")
    monkeypatch.chdir(tmp_path)
    paths = agent_from_args(Args(manifest=str(manifest)))
    # Beside the manifest, wherever the command is typed (docs/runtime.md, "A --manifest agent's state").
    assert paths.name == "roaming" and paths.state_dir == manifest.parent / ".caldera-state" / "roaming"
    monkeypatch.chdir(manifest.parent)
    assert agent_from_args(Args(manifest=".")).state_dir == paths.state_dir
    assert paths.agent_env == manifest.parent / "agent.env"
    install_agent(caldera_env, name="inst")
    monkeypatch.delenv("CALDERA_STATE_DIR")
    monkeypatch.setenv("CLAWMANAGER_AGENT_PERSISTENT_DIR", str(tmp_path / "config"))
    assert agent_from_args(Args(agent="inst")).state_dir == tmp_path / "config" / "caldera-agent"


def test_env_file_syntax_error_names_file_and_line(caldera_env):
    config = install_agent(caldera_env)
    with open(config / "agent.env", "a") as fh:
        fh.write("this is not an assignment\n")
    with pytest.raises(ConfigError, match=r"agent.env:4: not a KEY=VALUE line"):
        load_settings(agent_from_args(Args(agent="demo")))


# ---------------------------------------------------------------- single variables

from pathlib import Path  # noqa: E402

from caldera import config  # noqa: E402


def test_selected_agent_and_persistent_dir_with_alias():
    assert config.selected_agent({"CALDERA_AGENT": "web"}) == "web"
    assert config.selected_agent({"CALDERA_AGENT": ""}) is None
    assert config.persistent_dir({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/cm"}) == "/cm"
    assert config.persistent_dir({"CALDERA_PERSISTENT_DIR": "/c", "CLAWMANAGER_AGENT_PERSISTENT_DIR": "/cm"}) == "/c"
    assert config.persistent_dir({}) is None


def test_runtime_type_name_and_schema_dir_override():
    assert config.runtime_type_name({}) == "caldera"
    assert config.runtime_type_name({"CALDERA_RUNTIME_TYPE": "openclaw"}) == "openclaw"
    assert config.schema_dir_override({}) is None
    assert config.schema_dir_override({"CALDERA_SCHEMA_DIR": "/s"}) == Path("/s")


def test_plane_db_path_order():
    home = Path("/home/u")
    assert config.plane_db_path({"CALDERA_PLANE_DB": "/x.db", "CALDERA_STATE_DIR": "/st"}) == Path("/x.db")
    assert config.plane_db_path({"CALDERA_STATE_DIR": "/st"}) == Path("/st/plane/plane.db")
    assert config.plane_db_path({}, euid=0) == Path("/var/lib/caldera/plane/plane.db")
    assert config.plane_db_path({}, euid=1000, home=home) == home / ".local/state/caldera/plane/plane.db"


def test_codex_binary_and_retries():
    assert config.codex_binary({"CALDERA_CODEX_BIN": "/opt/codex"}) == "/opt/codex"
    assert config.codex_binary({}) is None
    assert config.codex_retries({}, 4, 5) == (4, 5)
    env = {"CALDERA_CODEX_REQUEST_MAX_RETRIES": "0", "CALDERA_CODEX_STREAM_MAX_RETRIES": "9"}
    assert config.codex_retries(env, 4, 5) == (0, 9)


@pytest.mark.parametrize("raw, words", [("x", "not an integer"), ("-1", "0 or more")])
def test_codex_retries_refused_with_the_variable_named(raw, words):
    with pytest.raises(ConfigError, match=f"CALDERA_CODEX_STREAM_MAX_RETRIES={raw!r}: .*{words}"):
        config.codex_retries({"CALDERA_CODEX_STREAM_MAX_RETRIES": raw}, 4, 5)


def test_the_gateway_prefers_clawmanager_names_and_needs_a_url_and_a_key():
    env = {"CLAWMANAGER_LLM_BASE_URL": "https://gw.test/v1", "OPENAI_BASE_URL": "https://other.test",
           "OPENAI_API_KEY": "sk-x"}
    gateway = config.gateway_from_env(env)
    assert gateway is not None and (gateway.base_url, gateway.api_key) == ("https://gw.test/v1", "sk-x")
    assert config.gateway_from_env({"OPENAI_API_BASE": "https://gw.test/v1", "OPENAI_API_KEY": "k"}).base_url \
        == "https://gw.test/v1"
    assert config.gateway_from_env({"CLAWMANAGER_LLM_BASE_URL": "https://gw.test/v1"}) is None
    assert config.gateway_from_env({}) is None
    leaky = config.Gateway({"CLAWMANAGER_LLM_BASE_URL": "https://u:pw-secret@gw.test/v1?key=k-secret",
                            "CLAWMANAGER_LLM_API_KEY": "sk-secret"})
    assert "secret" not in repr(leaky)


GATEWAY_ENV = {"CLAWMANAGER_LLM_BASE_URL": "http://gw.test/api/v1/gateway/llm", "CLAWMANAGER_LLM_API_KEY": "k",
               "CLAWMANAGER_LLM_MODEL": '["auto", "gpt-4.1", "kimi-k2.6"]', "OPENAI_MODEL": "auto"}


@pytest.mark.parametrize("env, requested, model", [
    (GATEWAY_ENV, "gpt-4.1", "gpt-4.1"),  # the payload's, the catalogue lists it
    (GATEWAY_ENV, None, "auto"),  # OPENAI_MODEL, the default model
    (dict(GATEWAY_ENV, OPENAI_MODEL=""), None, "auto"),  # the catalogue's first
    ({**GATEWAY_ENV, "OPENAI_MODEL": "", "CLAWMANAGER_LLM_MODEL": '["kimi-k2.6","auto"]'}, None, "kimi-k2.6"),
    ({"CLAWMANAGER_LLM_BASE_URL": "u", "CLAWMANAGER_LLM_API_KEY": "k"}, "any-model", "any-model"),  # no catalogue
    ({"CLAWMANAGER_LLM_BASE_URL": "u", "CLAWMANAGER_LLM_API_KEY": "k"}, None, None),
    (dict(GATEWAY_ENV, CLAWMANAGER_LLM_MODEL="gpt-4.1"), "o3", "o3"),  # not a list: ignored, nothing refused
    (dict(GATEWAY_ENV, CLAWMANAGER_LLM_MODEL="gpt-4.1"), None, "auto"),
    ({**GATEWAY_ENV, "CLAWMANAGER_LLM_MODEL": "gpt-4.1", "OPENAI_MODEL": ""}, None, None),  # never the raw value
])
def test_the_gateway_model_rule(env, requested, model):
    assert config.Gateway(env).model_for(requested) == model


def test_a_model_the_catalogue_does_not_list_is_refused_naming_the_catalogue():
    with pytest.raises(Refused) as err:
        config.Gateway(GATEWAY_ENV).model_for("gpt-9")
    assert str(err.value) == ("model 'gpt-9' is not in the AI gateway's catalogue "
                              "(CLAWMANAGER_LLM_MODEL: auto, gpt-4.1, kimi-k2.6)")
    big = dict(GATEWAY_ENV, CLAWMANAGER_LLM_MODEL=json.dumps([f"m{i}" for i in range(500)]))
    with pytest.raises(Refused) as err:
        config.Gateway(big).model_for("x" * 5000)
    assert str(err.value).endswith("m18, m19 and 480 more)") and len(str(err.value)) < 500  # one sentence
    # long model ids: each named cut, so twenty of them still make one sentence
    long_ids = dict(GATEWAY_ENV, CLAWMANAGER_LLM_MODEL=json.dumps([f"{i}-" + "x" * 1000 for i in range(30)]))
    with pytest.raises(Refused) as err:
        config.Gateway(long_ids).model_for("y" * 3000)
    assert len(str(err.value)) < 1600 and str(err.value).endswith("… and 10 more)")
    assert f"0-{'x' * 61}…, 1-" in str(err.value)


# CLAWMANAGER_LLM_PROVIDER_MODELS as the server writes it (resolveGatewayModelInjection, PR #193):
# the catalogue's ids qualified by their provider, "auto/auto" first.
QUALIFIED_ENV = dict(GATEWAY_ENV, CLAWMANAGER_LLM_PROVIDER_MODELS=json.dumps(
    ["auto/auto", "openai/gpt-4.1", "moonshot/kimi-k2.6", "moonshot/kimi-k2.6", " bare "]))


@pytest.mark.parametrize("requested, ref", [
    ("moonshot/kimi-k2.6", ("moonshot", "kimi-k2.6")),  # listed: the gateway is asked for the model id
    ("kimi-k2.6", ("moonshot", "kimi-k2.6")),  # a model id of the catalogue: its provider found
    (None, ("auto", "auto")),  # OPENAI_MODEL
    ("auto/bare", ("auto", "bare")),  # an entry without "/" is the server's "auto/<it>"
])
def test_a_payloads_provider_model_is_checked_against_the_provider_models(requested, ref):
    assert config.Gateway(QUALIFIED_ENV).model_ref(requested) == ref
    assert config.Gateway(QUALIFIED_ENV).model_for(requested) == ref[1]


@pytest.mark.parametrize("models, ref", [
    (["auto/auto", "openai/gpt-4.1"], ("auto", "auto")),  # the catalogue's first, as the server writes it
    (["moonshot/kimi-k2.6", "auto/auto"], ("moonshot", "kimi-k2.6")),
])
def test_with_only_the_provider_models_the_default_is_their_first(models, ref):
    env = {"CLAWMANAGER_LLM_BASE_URL": "http://gw.test/llm", "CLAWMANAGER_LLM_API_KEY": "k",
           "CLAWMANAGER_LLM_PROVIDER_MODELS": json.dumps(models)}  # no OPENAI_MODEL, no CLAWMANAGER_LLM_MODEL
    assert config.Gateway(env).model_ref() == ref
    assert config.Gateway(dict(env, OPENAI_MODEL="other")).model_for() == "other"  # OPENAI_MODEL still first


def test_a_provider_model_the_lists_do_not_name_is_refused_naming_both():
    with pytest.raises(Refused) as err:
        config.Gateway(QUALIFIED_ENV).model_for("openai/kimi-k2.6")  # the model is there, not from that provider
    assert str(err.value) == ("model 'openai/kimi-k2.6' is not in the AI gateway's catalogue (CLAWMANAGER_LLM_MODEL: "
                              "auto, gpt-4.1, kimi-k2.6; CLAWMANAGER_LLM_PROVIDER_MODELS: auto/auto, openai/gpt-4.1, "
                              "moonshot/kimi-k2.6, auto/bare)")
    only = {k: v for k, v in QUALIFIED_ENV.items() if k != "CLAWMANAGER_LLM_MODEL"}
    assert config.Gateway(only).model_for("gpt-4.1") == "gpt-4.1"  # without the catalogue, its ids still count
    with pytest.raises(Refused):
        config.Gateway(only).model_for("gpt-9")
    bad = dict(QUALIFIED_ENV, CLAWMANAGER_LLM_PROVIDER_MODELS="auto/auto")
    assert config.Gateway(bad).warnings() == [
        "CLAWMANAGER_LLM_PROVIDER_MODELS is not JSON (the platform sends a JSON list of model ids): it is ignored "
        "(a run's \"provider/model\" is checked against CLAWMANAGER_LLM_MODEL as it is)"]
    with pytest.raises(Refused):
        config.Gateway(bad).model_for("moonshot/kimi-k2.6")


@pytest.mark.parametrize("env, said", [
    (GATEWAY_ENV, []),
    (dict(GATEWAY_ENV, OPENAI_MODEL="gpt-5"), ["OPENAI_MODEL='gpt-5' is not in the AI gateway's catalogue "
                                               "(CLAWMANAGER_LLM_MODEL: auto, gpt-4.1, kimi-k2.6): a run that names "
                                               "no model asks for it, and the gateway may refuse it"]),
    (dict(GATEWAY_ENV, CLAWMANAGER_LLM_MODEL="gpt-4.1"),
     ["CLAWMANAGER_LLM_MODEL is not JSON (the platform sends a JSON list of model ids): the AI gateway's model "
      "catalogue is ignored (a run's model is the one it asks for, else OPENAI_MODEL)"]),
    (dict(GATEWAY_ENV, OPENAI_MODEL=""), []),  # the catalogue's first, listed by definition
])
def test_what_is_said_at_start_of_the_gateway_as_injected(env, said):
    assert config.Gateway(env).warnings() == said


@pytest.mark.parametrize("raw, words", [
    ("gpt-4.1", "CLAWMANAGER_LLM_MODEL is not JSON"),
    ('{"auto": 1}', "CLAWMANAGER_LLM_MODEL is a JSON object, not a JSON list of model ids"),
    ('"auto"', "a JSON string, not a JSON list"),
    ("[]", "an empty list"),
    ('["auto", 5]', "CLAWMANAGER_LLM_MODEL: item 2 is not a model id"),
    ('["auto", " "]', "item 2 is not a model id"),
    ("[" * 100_000, "is over 64 KiB"),
    # Too deep for Python 3.11's decoder (RecursionError), parsed by 3.13's: a sentence either way, not a crash.
    ("[" * 5_000 + "]" * 5_000, ("is not JSON", "item 1 is not a model id")),
])
def test_a_catalogue_that_is_not_a_json_list_of_model_ids_is_named_and_ignored(raw, words):
    catalogue, problem = config.gateway_catalogue(raw)
    assert catalogue is None and problem is not None
    assert any(w in problem for w in ((words,) if isinstance(words, str) else words)), problem
    assert config.gateway_catalogue(None) == (None, None) == config.gateway_catalogue(" ")
    assert config.gateway_catalogue(' ["auto", " gpt-4.1"] ') == (("auto", "gpt-4.1"), None)


def test_run_caps_defaults_and_values():
    sandboxes = ("read-only", "workspace-write")
    assert config.run_caps({}, sandboxes=sandboxes, default_max_timeout=3600) == {
        "max_timeout_seconds": 3600, "max_sandbox": "workspace-write", "allow_network": False,
        "allow_approval": False}
    env = {"CALDERA_RUN_MAX_TIMEOUT_SECONDS": "60", "CALDERA_RUN_MAX_SANDBOX": "read-only",
           "CALDERA_RUN_ALLOW_NETWORK": "Yes", "CALDERA_RUN_ALLOW_APPROVAL": "0"}
    assert config.run_caps(env, sandboxes=sandboxes, default_max_timeout=3600) == {
        "max_timeout_seconds": 60, "max_sandbox": "read-only", "allow_network": True, "allow_approval": False}


@pytest.mark.parametrize("env, words", [
    ({"CALDERA_RUN_MAX_TIMEOUT_SECONDS": "soon"}, "CALDERA_RUN_MAX_TIMEOUT_SECONDS in agent.env is not an integer"),
    ({"CALDERA_RUN_MAX_SANDBOX": "danger-full-access"}, "CALDERA_RUN_MAX_SANDBOX='danger-full-access': one of"),
    ({"CALDERA_RUN_ALLOW_NETWORK": "maybe"}, "CALDERA_RUN_ALLOW_NETWORK='maybe' in agent.env is not a boolean"),
])
def test_run_caps_refuses_bad_values(env, words):
    with pytest.raises(ConfigError) as info:
        config.run_caps(env, sandboxes=("read-only", "workspace-write"), default_max_timeout=3600)
    assert words in str(info.value)


def test_workspace_roots_and_skill_dirs_split_on_colons():
    assert config.workspace_roots({"CALDERA_WORKSPACE_ROOTS": "/a::/b: "}) == ["/a", "/b"]
    assert config.workspace_roots({}) == []
    # In an instance without CALDERA_WORKSPACE_ROOTS: the directory every coding image opens its CLI in.
    instance = {"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config", "CLAWMANAGER_PROJECT_PATH": "/config/workspace"}
    assert config.workspace_roots(instance) == ["/config/workspace"]
    assert config.workspace_roots(dict(instance, CALDERA_WORKSPACE_ROOTS="/srv/a")) == ["/srv/a"]
    assert config.workspace_roots(dict(instance, CALDERA_WORKSPACE_ROOTS="")) == []  # set empty: none
    assert config.workspace_roots({"CLAWMANAGER_PROJECT_PATH": "/config/workspace"}) == []  # not an instance
    assert config.workspace_roots(dict(instance, CLAWMANAGER_PROJECT_PATH="workspace")) == []  # not absolute
    assert config.skill_dirs({"CALDERA_SKILL_DIRS": " /s1 :rel:"}) == ["/s1", "rel"]
    assert config.skill_dirs(None) == []


@pytest.mark.parametrize("project, why", [
    ("/", "it is /"),
    ("/config", "it holds /config/.hermes, the runtime's own state"),  # the persistent dir's parent
    ("/config/.hermes", "it holds /config/.hermes, the runtime's own state"),
    ("/srv/", "it holds /srv/state, the runtime's own state"),  # CALDERA_STATE_DIR's parent
])
def test_an_implicit_workspace_root_holding_the_runtimes_state_is_not_used(project, why):
    instance = {"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config/.hermes", "CALDERA_STATE_DIR": "/srv/state",
                "CLAWMANAGER_PROJECT_PATH": project}
    assert config.workspace_roots(instance) == []
    assert config.implicit_workspace_root(instance) == (None, (
        f"CLAWMANAGER_PROJECT_PATH={project} is not used as the workspace root ({why}): control-plane runs are "
        "refused until CALDERA_WORKSPACE_ROOTS names the directories they may work in"))
    # roots an operator names are theirs; a project path beside the state is used as it is
    assert config.workspace_roots(dict(instance, CALDERA_WORKSPACE_ROOTS=project)) == [project]
    assert config.implicit_workspace_root(dict(instance, CALDERA_WORKSPACE_ROOTS=project)) == (None, None)
    beside = dict(instance, CLAWMANAGER_PROJECT_PATH="/config/workspace")
    assert config.implicit_workspace_root(beside) == ("/config/workspace", None)
    assert config.workspace_roots(dict(beside, CLAWMANAGER_PROJECT_PATH="/conf")) == ["/conf"]  # a prefix, no parent


@pytest.mark.parametrize("env, dirs, origin", [
    ({"CLAWMANAGER_AGENT_SKILL_DIRS": "/a:/b"}, ["/a", "/b"], "CLAWMANAGER_AGENT_SKILL_DIRS"),
    ({"CLAWMANAGER_AGENT_SKILL_DIRS": "/a", "CALDERA_SKILL_DIRS": "/c"}, ["/c"], "CALDERA_SKILL_DIRS"),
    # inside an instance with neither: the runtime's own
    ({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config/.hermes", "CLAWMANAGER_AGENT_RUNTIME_TYPE": "hermes",
      "CLAWMANAGER_RUNTIME_TYPE": "desktop"}, ["/config/hermes/skills", "/config/.hermes/skills"], "hermes default"),
    ({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config", "CLAWMANAGER_AGENT_RUNTIME_TYPE": "codex"},
     ["/config/.codex/skills"], "codex default"),
    ({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config", "CALDERA_RUNTIME_TYPE": "claude-code"},
     ["/config/.claude/skills"], "claude-code default"),
    ({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config/.opencode", "CLAWMANAGER_AGENT_RUNTIME_TYPE": "opencode"},
     ["/config/.opencode/skills"], "opencode default"),
    ({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config/.hermes", "CLAWMANAGER_AGENT_RUNTIME_TYPE": "hermes",
      "CLAWMANAGER_AGENT_SKILL_DIRS": "/mine"}, ["/mine"], "CLAWMANAGER_AGENT_SKILL_DIRS"),
    ({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config", "CLAWMANAGER_AGENT_RUNTIME_TYPE": "openclaw"}, [], None),
    ({"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config", "CLAWMANAGER_RUNTIME_TYPE": "desktop"}, [], None),
    ({"CALDERA_RUNTIME_TYPE": "hermes"}, [], None),  # a host, not an instance: no defaults
])
def test_skill_dirs_the_platforms_variable_and_the_runtimes_own(env, dirs, origin):
    assert config.skill_dirs_of(env) == (dirs, origin)


def test_every_caldera_variable_the_source_names_is_known():
    """KNOWN_VARS is what `caldera run` warns against (a misspelled agent.env name): it must hold
    every CALDERA_* name caldera's source reads or sets, and nothing it does not."""
    import re

    from caldera import config

    root = Path(config.__file__).parent
    named = set()
    for source in root.rglob("*.py"):
        text = source.read_text()
        if source == Path(config.__file__):
            text = text.split("KNOWN_VARS = (", 1)[0] + text.split("KNOWN_VARS = (", 1)[1].split(")", 1)[1]
        named.update(re.findall(r"CALDERA_[A-Z0-9_]*[A-Z0-9]", text))
    assert named == set(config.KNOWN_VARS)


def test_a_misspelled_variable_is_named_with_the_closest_known_one(caldera_env):
    config_dir = install_agent(caldera_env)
    with open(config_dir / "agent.env", "a") as fh:
        fh.write("CALDERA_HEARTBEAT_INTERVALL=5\nCALDERA_QQQQQQQQQQQQ=1\nOTHER=1\n")
    from caldera.config import unknown_variables

    found = unknown_variables(agent_from_args(Args(agent="demo")))
    assert [(name, close) for _, name, close in found] == [
        ("CALDERA_HEARTBEAT_INTERVALL", "CALDERA_REPORT_INTERVAL_SECONDS"), ("CALDERA_QQQQQQQQQQQQ", None)]
