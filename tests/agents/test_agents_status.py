"""The status body: forwarded keys only, cut not rejected; wrong types break the contract."""
import pytest

from caldera.agents import status
from caldera.agents.adapter.answer import ContractError


def test_only_forwarded_keys_survive():
    raw = {"state": {"level": "warn", "label": "Paused", "color": "red"}, "settings": {"x": 1},
           "controls": ["pause"], "secret": "nope", "held": ["paused"],
           "gauges": [{"name": "Week", "used": 0.5, "extra": 1}]}
    body = status.filter_status(raw)
    assert body == {"state": {"level": "warn", "label": "Paused"}, "held": ["paused"],
                    "gauges": [{"name": "Week", "used": 0.5}]}


def test_strings_and_lists_are_cut():
    raw = {"detail": "d" * 5000, "runs": [{"id": i, "title": "t" * 2000} for i in range(70)],
           "held": ["h"] * 60}
    body = status.filter_status(raw)
    assert len(body["detail"]) == 1000
    assert len(body["runs"]) == 50 and len(body["runs"][0]["title"]) == 1000
    assert len(body["held"]) == 50


@pytest.mark.parametrize("raw", [
    {"state": {"level": "great"}},
    {"gauges": [{"used": 1.5}]},
    {"gauges": {"used": 0.5}},
    {"held": "paused"},
    {"detail": 5},
    {"agent": "1.0"},
    [],
])
def test_wrong_types_break_the_contract(raw):
    with pytest.raises(ContractError):
        status.filter_status(raw)


def test_not_answering_body_and_levels():
    body = status.not_answering("status: timed out after 20.0 s")
    assert body["state"] == {"level": "bad", "label": "Adapter not answering"}
    assert body["health"] == [{"name": "Adapter", "level": "bad", "reason": "status: timed out after 20.0 s"}]
    assert status.openclaw_status(body) == "error"
    assert status.openclaw_status({"state": {"level": "off"}}) == "stopped"
    assert status.openclaw_status({}) == "unknown"
