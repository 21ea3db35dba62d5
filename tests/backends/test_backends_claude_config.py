"""Claude Code's provider plan from the projection (seed 003's credential boundary), without
the CLI: what is refused before anything is spawned, and that no refusal quotes a secret."""
from __future__ import annotations

import json

import pytest

from caldera.backends import failures as fk
from caldera.backends.base import Policy
from caldera.backends.claude_code import config as cc
from caldera.backends.projection import Projection

KEY = "sk-ant-secret-0123456789abcdef"


@pytest.fixture(autouse=True)
def _no_proxy_from_the_test_run(monkeypatch):
    """The plan reads the process's proxies as requests does; the .deb build's test run has
    http(s)_proxy pointed at a dead port (pybuild), which these plans must not meet."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
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


@pytest.mark.parametrize("value", [KEY + "\nsecond line", KEY + "\rX", "\t" + KEY, KEY + "\x00x", KEY + "é"])
def test_a_key_that_is_not_one_printable_line_is_refused_without_quoting_it(tmp_path, value):
    # It would be a header value: http.client's refusal quotes the value whole (the key).
    message = _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={"ANTHROPIC_API_KEY": value})
    assert "ANTHROPIC_API_KEY" in message and KEY not in message


def test_no_key_is_secret_unavailable_and_the_gateway_is_named(tmp_path):
    assert "ANTHROPIC_API_KEY" in _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={})
    gateway = {"CLAWMANAGER_LLM_BASE_URL": "http://gw/api/v1/gateway/llm", "CLAWMANAGER_LLM_API_KEY": "gw-token-1"}
    message = _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={}, environ=gateway)
    assert "OpenAI-compatible" in message and "gw-token-1" not in message
    assert _refused(tmp_path, fk.SECRET_UNAVAILABLE, env={"ANTHROPIC_API_KEY": ""}).endswith("is empty")


@pytest.mark.parametrize("url,words", [
    ("https://user:s3cr3t-pass@gw.example", "credentials in the URL"),
    ("https://gw.example/?key=s3cr3t-pass", "query"),
    ("http://gw.example", "plain http"),
    ("ftp://gw.example", "http(s) URL"),
])
def test_a_base_url_is_refused_with_a_sentence_that_never_quotes_it(tmp_path, url, words):
    message = _refused(tmp_path, fk.BACKEND_FAILED, env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": url})
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
    merged = cc.policy_settings(Policy(timeout_seconds=60), "/w", ["/secrets"], plan.settings)
    assert merged["permissions"]["allow"] == [] and "Bash(curl:*)" in merged["permissions"]["deny"]
    assert merged["sandbox"]["allowUnsandboxedCommands"] is False and merged["disableAllHooks"] is True
