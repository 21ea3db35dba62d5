"""The plane's LLM governance is ClawManager's (CM-aug, instance_runtime_status_service.go and
ai_observability_service.go): the report's runtime.llm_* merged into the stored system_info,
the instance classified from it."""
import pytest
from plane_helpers import agent, clock, plane, runtime  # noqa: F401

from caldera.plane.governance import llm_config_status, merge_llm


@pytest.mark.parametrize("system_info, status", [
    ({"llm_config_status": " external "}, "external"),
    ({"llm_config_status": "gateway", "llm_provider_base_url": "https://api.openai.com/v1"}, "gateway"),
    ({"llm_provider_base_url": "http://x/api/v1/gateway/llm"}, "gateway"),
    ({"llm_provider_base_url": "http://clawmanager-gateway.ns-system.svc:9001/v1"}, "gateway"),
    ({"llm_provider_base_url": "https://api.anthropic.com"}, "external"),
    ({"llm_provider_base_url": "https://llm.corp.test/v1"}, "unknown"),
    ({"cpu": {"cores": 2}}, "unknown"),  # what every caldera 0.1.0 instance showed
    ({}, "unknown"), (None, "unknown"),
])
def test_classified_as_clawmanager_does(system_info, status):
    assert llm_config_status(system_info) == status


def test_only_non_blank_strings_are_merged_trimmed():
    runtime_ = {"llm_config_status": " gateway ", "llm_provider_base_url": "", "llm_config_fingerprint": 5}
    assert merge_llm({"cpu": 1}, runtime_) == {"cpu": 1, "llm_config_status": "gateway"}
    assert merge_llm(None, {}) is None


def test_a_report_with_the_fields_is_stored_and_shown_classified(plane, agent):
    agent.report(runtime={"openclaw_status": "running", "openclaw_pid": None, "current_config_revision_id": None,
                          "llm_config_status": "external", "llm_provider_base_url": "https://api.openai.com/v1",
                          "llm_config_fingerprint": "sha256:ab"}, system_info={"cpu": {"cores": 2}})
    stored = runtime(plane.store, 1)["system_info"]
    assert stored == {"cpu": {"cores": 2}, "llm_config_status": "external",
                      "llm_provider_base_url": "https://api.openai.com/v1", "llm_config_fingerprint": "sha256:ab"}
    [row] = [a for a in plane.store.agents() if a["instance_id"] == 1]
    assert row["llm"]["status"] == "external" and row["llm"]["llm_config_fingerprint"] == "sha256:ab"
    # a later report without them: system_info is replaced whole, the instance is unknown again
    agent.report(system_info={"cpu": {"cores": 2}})
    [row] = [a for a in plane.store.agents() if a["instance_id"] == 1]
    assert row["llm"]["status"] == "unknown" and "llm_config_status" not in runtime(plane.store, 1)["system_info"]
