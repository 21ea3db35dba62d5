"""The backend-neutral description of what caldera hands out to reach a model, and the state
report's LLM-governance fields made of it (issue 34, protocol/llm.py)."""
import json
import os
import subprocess
import sys

import pytest

from caldera.config import Gateway
from caldera.protocol.llm import (
    EXTERNAL,
    GATEWAY,
    LLMConfig,
    confirmed,
    fingerprint,
    gateway_config,
    platform_gateways,
    public_url,
    report_fields,
)

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


# ---------------------------------------------------------------- keys in a URL's path, encoded

def test_a_key_percent_encoded_in_the_path_is_found_all_the_same():
    """env/CORP_KEY = `tenant+q7Zx/PRIVATEKEY99`, written in the URL as `tenant%2Bq7Zx%2FPRIVATEKEY99`."""
    key = "tenant+q7Zx/PRIVATEKEY99"
    for path in ("tenant%2Bq7Zx%2FPRIVATEKEY99", "tenant%2bq7zx%2fprivatekey99", "tenant%252Bq7Zx%252FPRIVATEKEY99"):
        assert public_url(f"https://llm.corp/v1/{path}", hide=[key]) == "https://llm.corp", path
    assert public_url("https://llm.corp/v1/tenant%2Bother", hide=[key]) == "https://llm.corp/v1/tenant%2Bother"


def test_the_gateways_own_key_in_its_path_is_never_reported_and_never_changes_the_fingerprint():
    def described(key):
        return gateway_config(Gateway({"CLAWMANAGER_LLM_BASE_URL": f"http://gw.test/api/v1/gateway/llm/{key}",
                                       "CLAWMANAGER_LLM_API_KEY": key, "OPENAI_MODEL": "auto"}), "process agent")

    first, second = described(CANARY), described("sk-ANOTHERKEY-9876543210")
    assert first.base_url == "http://gw.test" and CANARY not in json.dumps(first.as_dict())
    assert first.fingerprint == second.fingerprint  # a new key alone leaves it as it was


# ---------------------------------------------------------------- gateway only for the platform's gateway

PLANE = "http://clawmanager-gateway.demo-system.svc.cluster.local:9001"


@pytest.mark.parametrize("injected, url, status", [
    # the platform's: injected, and its gateway by ClawManager's rule
    ({"CLAWMANAGER_LLM_BASE_URL": "http://gw.test/api/v1/gateway/llm"}, "http://gw.test/api/v1/gateway/llm", GATEWAY),
    ({"OPENAI_BASE_URL": "http://llm.clawmanager.example/v1"}, "http://llm.clawmanager.example/v1", GATEWAY),
    # on the host of the control plane the platform injected
    ({"CLAWMANAGER_LLM_BASE_URL": PLANE + "/llm", "CLAWMANAGER_AGENT_BASE_URL": PLANE}, PLANE + "/llm", GATEWAY),
    # injected, but a vendor's URL: no gateway of the platform's
    ({"CLAWMANAGER_LLM_BASE_URL": "https://api.anthropic.com"}, "https://api.anthropic.com", EXTERNAL),
    # a URL under the gateway's variable names that the platform did not inject (agent.env's)
    ({}, "https://api.openai.com/v1", EXTERNAL),
    ({}, "http://gw.test/api/v1/gateway/llm", EXTERNAL),
    # injected, but the consumer was handed another URL
    ({"CLAWMANAGER_LLM_BASE_URL": "http://gw.test/api/v1/gateway/llm"}, "http://gw2.test/api/v1/gateway/llm", EXTERNAL),
])
def test_gateway_is_said_only_of_the_gateway_the_platform_injected(injected, url, status):
    consumer = LLMConfig("backend codex", GATEWAY, url, "openai-compatible", "auto")
    [found] = confirmed([consumer], platform_gateways(injected))
    assert (found.status, found.base_url, found.provider, found.model) == (status, url, "openai-compatible", "auto")
    assert confirmed([LLMConfig("x", EXTERNAL, url)], platform_gateways(injected))[0].status == EXTERNAL  # never up


def test_the_platforms_gateway_with_its_key_in_the_path_is_still_the_platforms():
    url = f"http://gw.test/api/v1/gateway/llm/{CANARY}"
    gateway = Gateway({"CLAWMANAGER_LLM_BASE_URL": url, "CLAWMANAGER_LLM_API_KEY": CANARY})
    [found] = confirmed([gateway_config(gateway, "process agent")],
                        platform_gateways({"CLAWMANAGER_LLM_BASE_URL": url}, [CANARY]))
    assert (found.status, found.base_url) == (GATEWAY, "http://gw.test")
