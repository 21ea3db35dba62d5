"""Claude Code's provider plan from the projection (seed 003's credential boundary), without
the CLI: what is refused before anything is spawned, and that no refusal quotes a secret."""
from __future__ import annotations

import json

import pytest

from caldera.backends import failures as fk
from caldera.backends.base import Policy
from caldera.backends.claude_code import config as cc
from caldera.backends.forwarder import process_secret
from caldera.backends.projection import Projection
from caldera.redact import Redactor

KEY = "sk-ant-secret-0123456789abcdef"
PROXIES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY")


@pytest.fixture(autouse=True)
def no_proxy_in_the_environment(monkeypatch):
    """The plan reads the proxy of the runtime's own environment (forwarder.upstream_proxy):
    these plans are made as on a host without one (the .deb's build points https_proxy at a
    dead https:// port, which the plan rightly refuses)."""
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)


def _plan(tmp_path, env=None, settings=None, environ=None):
    root = tmp_path / "secrets" / "claude-code"
    (root / "env").mkdir(parents=True, exist_ok=True)
    for name, value in (env if env is not None else {"ANTHROPIC_API_KEY": KEY}).items():
        (root / "env" / name).write_text(value)
    if settings is not None:
        (root / "settings.json").write_text(json.dumps(settings))
    return cc.plan_provider(Projection.locate(tmp_path / "secrets", backend="claude-code"), environ or {})


def _refused(tmp_path, kind, **kw):
    with pytest.raises(fk.BackendFailure) as caught:
        _plan(tmp_path, **kw)
    assert caught.value.kind == kind, caught.value.message
    return caught.value.message


def test_the_key_goes_to_the_plan_and_the_cli_gets_names_only(tmp_path):
    plan = _plan(tmp_path, env={"ANTHROPIC_AUTH_TOKEN": KEY + "\n", "ANTHROPIC_MODEL": "claude-x",
                                "ANTHROPIC_BASE_URL": "https://gw.example/anthropic/"})
    assert (plan.key_var, plan.key, plan.upstream, plan.model) == (
        "ANTHROPIC_AUTH_TOKEN", KEY, "https://gw.example/anthropic", "claude-x")
    assert plan.env == {"ANTHROPIC_MODEL": "claude-x"} and KEY in plan.secret_values
    assert plan.run_token.startswith("caldera-run-") and plan.run_token != _plan(tmp_path).run_token


def test_run_tokens_are_masked_whole_by_one_prefix_not_one_redactor_value_per_run(tmp_path):
    # Each run's token added to the daemon's one Redactor grew its memory 11 MiB per 100 turns
    # and its regex with every run (docs/performance.md, section 10): the process's prefix masks all.
    redactor = Redactor()
    redactor.add(process_secret(), prefix=True)
    tokens = {_plan(tmp_path).run_token for _ in range(3)}
    assert len(tokens) == 3
    for token in tokens:
        assert token.startswith("caldera-run-" + process_secret())
        assert redactor.text(f"sent {token} here") == "sent caldera-run-[REDACTED] here"


@pytest.mark.parametrize("value", [KEY + "\nsecond line", KEY + "\rX", "\t" + KEY, KEY + "\x00x", KEY + "é"])
def test_a_key_that_is_not_one_printable_line_is_refused_without_quoting_it(tmp_path, value):
    # It would be a header value: http.client's refusal quotes the value whole (the key).
    message = _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={"ANTHROPIC_API_KEY": value})
    assert "ANTHROPIC_API_KEY" in message and KEY not in message


def test_no_key_is_secret_unavailable(tmp_path):
    assert "ANTHROPIC_API_KEY" in _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={})
    gateway = {"CLAWMANAGER_LLM_BASE_URL": "http://gw/api/v1/gateway/llm", "CLAWMANAGER_LLM_API_KEY": "gw-token-1"}
    # A projection of its own without its key: refused, the gateway does not stand in for it.
    message = _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={"ANTHROPIC_MODEL": "claude-x"}, environ=gateway)
    assert "ANTHROPIC_API_KEY" in message and "gw-token-1" not in message and "OpenAI" not in message
    assert _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={"ANTHROPIC_API_KEY": ""}).endswith("is empty")
    nothing = tmp_path / "nothing"
    with pytest.raises(fk.BackendFailure) as caught:
        cc.plan_provider(Projection.locate(nothing, backend="claude-code"), {})
    assert caught.value.message.endswith("and no AI gateway (CLAWMANAGER_LLM_BASE_URL/CLAWMANAGER_LLM_API_KEY) "
                                         "is configured")


GATEWAY = {"CLAWMANAGER_LLM_BASE_URL": "http://gw.cluster:9001/api/v1/gateway/llm/", "CLAWMANAGER_LLM_API_KEY": KEY,
           "CLAWMANAGER_LLM_MODEL": '["auto", "glm-5"]', "OPENAI_MODEL": "auto",
           "CLAWMANAGER_LLM_PROVIDER_MODELS": '["auto/auto", "zhipu/glm-5"]'}


@pytest.mark.parametrize("requested, model", [(None, "auto"), ("glm-5", "glm-5"), ("zhipu/glm-5", "glm-5")])
def test_without_a_projection_the_gateway_as_clawmanagers_image_configures_the_cli(tmp_path, requested, model):
    plan = cc.plan_provider(Projection.locate(tmp_path / "none", backend="claude-code"), GATEWAY, requested)
    # <BASE> as injected (plain http in the cluster is the platform's), the bearer form, the model
    assert (plan.source, plan.key_var, plan.key, plan.upstream, plan.model) == (
        "gateway", "ANTHROPIC_AUTH_TOKEN", KEY, "http://gw.cluster:9001/api/v1/gateway/llm", model)
    assert plan.env == {"ANTHROPIC_MODEL": model, "CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT": "1"}
    assert KEY in plan.secret_values and KEY not in json.dumps(plan.env)


@pytest.mark.parametrize("base", ["http://gw.cluster:9001/api/v1/gateway/llm/v1",
                                  "http://gw.cluster:9001/api/v1/gateway/llm/v1/"])
def test_a_gateway_base_ending_in_v1_is_asked_v1_messages_once(tmp_path, base):
    # OPENAI_BASE_URL and OPENAI_API_BASE, fallbacks of CLAWMANAGER_LLM_BASE_URL, end in /v1 by convention.
    plan = cc.plan_provider(Projection.locate(tmp_path / "none", backend="claude-code"),
                            dict(GATEWAY, CLAWMANAGER_LLM_BASE_URL=base))
    assert plan.upstream == "http://gw.cluster:9001/api/v1/gateway/llm"  # the CLI appends /v1/messages


def _gateway_refusal(tmp_path, backend: str, **injected) -> str:
    """The sentence `backend` refuses the gateway with, as `injected` changes it (secret-unavailable)."""
    from caldera.backends.codex import config as codex_config

    plan_provider = cc.plan_provider if backend == "claude-code" else codex_config.plan_provider
    with pytest.raises(fk.BackendFailure) as caught:
        plan_provider(Projection.locate(tmp_path / "none", backend=backend), dict(GATEWAY, **injected))
    assert caught.value.kind == fk.SECRET_UNAVAILABLE
    return caught.value.message


@pytest.mark.parametrize("base", ["http://gw/llm?tenant=s3cr3t-pass", "http://gw/llm/?x=s3cr3t-pass",
                                  "https://gw/llm#s3cr3t-pass", "http://gw/llm?"])
@pytest.mark.parametrize("backend", ["claude-code", "codex"])
def test_a_gateway_base_with_a_query_or_fragment_is_refused_without_quoting_it(tmp_path, base, backend):
    assert _gateway_refusal(tmp_path, backend, CLAWMANAGER_LLM_BASE_URL=base) == (
        "CLAWMANAGER_LLM_BASE_URL: a query or fragment is not accepted")


@pytest.mark.parametrize("key", [KEY + "\n", KEY + "\r\nX-Other: 1", " " + KEY, KEY + "\x7f", KEY + "é"])
@pytest.mark.parametrize("backend", ["claude-code", "codex"])
def test_a_gateway_key_that_is_not_one_printable_line_is_refused_alike_by_each_backend(tmp_path, key, backend):
    assert _gateway_refusal(tmp_path, backend, CLAWMANAGER_LLM_API_KEY=key) == (
        "CLAWMANAGER_LLM_API_KEY is not one line of printable characters")  # never the key


def test_a_model_the_gateway_does_not_offer_is_refused(tmp_path):
    from caldera.errors import Refused

    with pytest.raises(Refused) as caught:
        cc.plan_provider(Projection.locate(tmp_path / "none", backend="claude-code"), GATEWAY, "other/glm-5")
    assert str(caught.value) == ("model 'other/glm-5' is not in the AI gateway's catalogue (CLAWMANAGER_LLM_MODEL: "
                                 "auto, glm-5; CLAWMANAGER_LLM_PROVIDER_MODELS: auto/auto, zhipu/glm-5)")


@pytest.mark.parametrize("url,words", [
    ("https://user:s3cr3t-pass@gw.example", "credentials in the URL"),
    ("https://gw.example/?key=s3cr3t-pass", "query"),
    ("http://gw.example", "plain http"),
    ("ftp://gw.example", "http(s) URL"),
    ("http://gw.example:99999", "the port of the host is not a number from 1 to 65535"),  # the review's L2
    ("https://gw.example:0/v1", "the port of the host is not a number from 1 to 65535"),
    ("https://gw.example:port", "the port of the host is not a number from 1 to 65535"),
])
def test_a_base_url_no_run_can_use_is_secret_unavailable_in_a_sentence_that_never_quotes_it(tmp_path, url, words):
    message = _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": url})
    assert words in message and "s3cr3t-pass" not in message and "gw.example" not in message


def test_another_variable_is_refused_it_would_reach_the_agents_commands(tmp_path):
    message = _refused(tmp_path, fk.BACKEND_FAILED, env={"ANTHROPIC_API_KEY": KEY, "GITHUB_TOKEN": "ghp_abcdef123456"})
    assert "GITHUB_TOKEN" in message and "ghp_abcdef123456" not in message


def test_settings_keep_only_narrowing_keys_and_every_other_string_is_a_secret(tmp_path):
    settings = {"model": "claude-y", "apiKeyHelper": "/bin/echo helper-secret-value",
                "env": {"OTHER": "env-secret-value"}, "hooks": {"PreToolUse": []},
                "permissions": {"deny": ["Bash(curl:*)"], "allow": ["Bash(*)"], "defaultMode": "bypassPermissions"}}
    plan = _plan(tmp_path, settings=settings)
    assert plan.settings == {"model": "claude-y", "permissions": {"deny": ["Bash(curl:*)"]}}
    assert plan.dropped == ["apiKeyHelper", "env", "hooks", "permissions.allow", "permissions.defaultMode"]
    assert {"/bin/echo helper-secret-value", "env-secret-value", "Bash(*)"} <= set(plan.secret_values)
    assert "claude-y" not in plan.secret_values  # a model name may appear (SPEC section 10)
    merged = cc.policy_settings(Policy(timeout_seconds=60), "/w", cc.confine(["/secrets"], ["/w"]), plan.settings)
    assert merged["permissions"]["allow"] == [] and "Bash(curl:*)" in merged["permissions"]["deny"]
    assert merged["sandbox"]["allowUnsandboxedCommands"] is False and merged["disableAllHooks"] is True


def test_a_hidden_root_holding_the_workspace_is_denied_around_it_and_the_network_keeps_off_this_host(tmp_path):
    """A permission rule makes no exception (the sandbox's allowRead does): the rules name
    every entry of the root on the way to the workspace but that way."""
    root = tmp_path / "persist"
    for rel in ("workspace/src", ".claude", "caldera-agent", "other/deep"):
        (root / rel).mkdir(parents=True)
    (root / "notes.txt").write_text("x")
    workspace, private = str(root / "workspace"), str(tmp_path / "private")
    confined = cc.confine([str(root), str(root / "caldera-agent"), str(tmp_path / "secrets")], [workspace, private],
                          ["192.0.2.7"])
    assert confined.hidden[0] == str(root) and confined.allowed == (workspace, private)
    assert set(confined.rules) == {str(root / n) for n in (".claude", "caldera-agent", "notes.txt", "other")} | {
        str(tmp_path / "secrets")}
    settings = cc.policy_settings(Policy(timeout_seconds=60, network=True), workspace, confined, {})
    assert settings["sandbox"]["filesystem"]["allowRead"] == ["/" + workspace, "/" + private]
    assert f"Read(/{root}/other/**)" in settings["permissions"]["deny"]
    assert not any("workspace" in rule for rule in settings["permissions"]["deny"])
    denied = settings["sandbox"]["network"]["deniedDomains"]
    assert {"127.0.0.1", "localhost", "10.0.0.0/8", "::1", "192.0.2.7"} <= set(denied)
    assert settings["sandbox"]["network"]["allowedDomains"] == ["*"]
    closed = cc.policy_settings(Policy(timeout_seconds=60), workspace, confined, {})
    assert closed["sandbox"]["network"] == {"allowedDomains": []}


def test_a_prompt_starting_with_a_slash_is_sent_as_text():
    assert cc.prompt_text("/config permissionMode=dontAsk") == " /config permissionMode=dontAsk"
    assert cc.prompt_text("fix /etc/hosts") == "fix /etc/hosts"
    assert "--disable-slash-commands" in cc.argv("claude", Policy(timeout_seconds=60), "/s.json", None)


def test_the_private_root_is_made_again_when_another_runs_end_removed_it(tmp_path, monkeypatch):
    """A run's end removes the private root when it is empty (the runtime's TMPDIR is left as
    it was); a run starting meanwhile makes it again rather than failing."""
    import tempfile

    from caldera.backends import leftovers
    from caldera.backends.claude_code import backend

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    root = leftovers.private_root()
    made = tempfile.mkdtemp
    calls = []

    def racing(dir):  # noqa: A002 -- tempfile's own name
        calls.append(dir)
        if len(calls) == 1:
            root.rmdir()  # another run's end, between the root's mkdir and this run's mkdtemp
        return made(dir=dir)

    monkeypatch.setattr(backend.tempfile, "mkdtemp", racing)
    private = backend._private_dir()
    assert private.parent == root and (private / leftovers.OWNER).exists() and len(calls) == 2
    backend._remove_empty_dirs([root])
    assert root.exists()  # a run is in it: kept
    (private / leftovers.OWNER).unlink()
    private.rmdir()
    backend._remove_empty_dirs([root])
    assert list(tmp_path.iterdir()) == []
