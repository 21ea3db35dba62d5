"""The backend-neutral description of what caldera hands out to reach a model, and the state
report's LLM-governance fields made of it (issue 34, protocol/llm.py)."""
import json
import os
import subprocess
import sys

import pytest

from caldera.config import Gateway
from caldera.protocol.llm import EXTERNAL, GATEWAY, LLMConfig, fingerprint, gateway_config, public_url, report_fields

CANARY = "sk-LLMCANARY-0123456789abcdef"


@pytest.mark.parametrize("url, public", [
    ("http://gw.test/api/v1/gateway/llm", "http://gw.test/api/v1/gateway/llm"),
    (f"HTTPS://user:{CANARY}@Api.OpenAI.com:443/v1/?key={CANARY}#{CANARY}", "https://api.openai.com:443/v1"),
    (f"https://{CANARY}@x.test", "https://x.test"),
    ("http://[::1]:8080/v1", "http://[::1]:8080/v1"),
    ("gw.test/v1", None), ("ftp://x.test/", None), ("http://x.test:99999/", None), ("", None), (None, None), (5, None),
])
def test_a_base_url_keeps_no_userinfo_query_or_fragment(url, public):
    assert public_url(url) == public


def test_a_secret_the_owner_holds_is_never_part_of_the_url():
    """A provider that takes its key in the path (or as a host name) leaves the URL cut to its
    origin, or out altogether."""
    assert public_url(f"https://llm.test/key/{CANARY}/v1", hide=[CANARY]) == "https://llm.test"
    assert public_url(f"https://{CANARY.lower()}.llm.test/v1", hide=[CANARY]) is None
    assert public_url("https://llm.test/v1", hide=[CANARY, "", "v1"]) == "https://llm.test/v1"  # too short to hide
    assert LLMConfig("x", EXTERNAL, f"https://llm.test/{CANARY}/v1", hide=[CANARY]).base_url == "https://llm.test"


def test_the_fingerprint_is_the_same_on_every_host_and_after_a_restart():
    """No salt: another interpreter (another hash seed) computes the same digest."""
    triple = ("http://gw.test/v1", "openai-compatible", "auto")
    code = f"from caldera.protocol.llm import fingerprint; print(fingerprint([{triple!r}]))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.getcwd()}).stdout.strip()
    assert other == fingerprint([triple]) and other.startswith("sha256:") and len(other) == 7 + 64


def test_the_fingerprint_changes_with_base_url_provider_and_model_and_only_with_them():
    base = LLMConfig("backend codex", GATEWAY, "http://gw.test/v1", "openai-compatible", "auto")
    variants = [LLMConfig("backend codex", GATEWAY, "http://gw2.test/v1", "openai-compatible", "auto"),
                LLMConfig("backend codex", GATEWAY, "http://gw.test/v1", "openai", "auto"),
                LLMConfig("backend codex", GATEWAY, "http://gw.test/v1", "openai-compatible", "gpt-4.1")]
    assert len({base.fingerprint} | {v.fingerprint for v in variants}) == 4
    # the same configuration, given another way: credentials and a trailing slash are not part of it
    same = LLMConfig("process agent", GATEWAY, f"http://u:{CANARY}@gw.test/v1/?k={CANARY}", "openai-compatible", "auto")
    assert same.fingerprint == base.fingerprint


def test_report_fields_absent_when_nothing_is_handed_out():
    assert report_fields([]) == {}


def test_one_external_consumer_decides_the_status_and_is_never_hidden():
    gateway = LLMConfig("process agent", GATEWAY, "http://gw.test/api/v1/gateway/llm", "openai-compatible", "auto")
    external = LLMConfig("backend codex", EXTERNAL, "https://api.openai.com/v1", "openai", "gpt-5.5")
    fields = report_fields([gateway, external])
    assert fields["llm_config_status"] == EXTERNAL and fields["llm_provider_base_url"] == "https://api.openai.com/v1"
    assert [c["source"] for c in fields["llm_configs"]] == ["backend codex", "process agent"]
    assert report_fields([external, gateway]) == fields  # order does not matter
    only_gateway = report_fields([gateway])
    assert only_gateway["llm_config_status"] == GATEWAY
    assert only_gateway["llm_config_fingerprint"] == gateway.fingerprint
    # the fingerprint covers every consumer: the gateway's model changing changes it, external or not
    moved = LLMConfig("process agent", GATEWAY, "http://gw.test/api/v1/gateway/llm", "openai-compatible", "gpt-4.1")
    assert report_fields([moved, external])["llm_config_fingerprint"] != fields["llm_config_fingerprint"]


def test_an_external_consumer_without_a_known_url_sends_no_url():
    fields = report_fields([LLMConfig("backend codex", EXTERNAL)])
    assert fields["llm_config_status"] == EXTERNAL and "llm_provider_base_url" not in fields


def test_the_gateway_described_with_its_default_model_and_no_key():
    gateway = Gateway({"CLAWMANAGER_LLM_BASE_URL": f"http://u:{CANARY}@gw.test/v1", "CLAWMANAGER_LLM_API_KEY": CANARY,
                       "CLAWMANAGER_LLM_MODEL": '["auto"]', "CLAWMANAGER_LLM_PROVIDER": "openai-compatible"})
    found = gateway_config(gateway, "backend codex")
    assert (found.status, found.base_url, found.provider, found.model) == (GATEWAY, "http://gw.test/v1",
                                                                          "openai-compatible", "auto")
    assert CANARY not in json.dumps(report_fields([found])) + repr(found) + repr(gateway)


def test_an_llm_config_is_read_only_and_checks_its_status():
    found = LLMConfig("x", GATEWAY)
    with pytest.raises(AttributeError):
        found.status = EXTERNAL  # type: ignore[misc]
    with pytest.raises(ValueError):
        LLMConfig("x", "unknown")
