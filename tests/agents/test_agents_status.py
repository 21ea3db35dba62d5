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


# The daemon checks status answers with the plain filter only (docs/performance.md, section
# 2); it gives adapter-status.schema.json's verdict on this corpus. (verdict, lenient):
# `lenient` marks the two places where the filter accepts what the schema refuses, on
# purpose: a forwarded key that is null counts as absent, and items past the 50th of a list
# are cut unread (they are never forwarded). `caldera check` runs the schema and names them.
STATUS_CORPUS = [
    ({}, True, False),
    ({"state": {"level": "ok", "label": "Idle", "since": "2026-10-03T12:41:01Z"}, "detail": "d"}, True, False),
    ({"gauges": [{"name": "q", "used": 0.5, "label": "half", "resets_at": "t"}, {"used": 0}, {"used": 1}]},
     True, False),
    ({"active": [{"id": 7, "title": "t", "started_at": "s", "log": "l"}, {"id": "r-1"}]}, True, False),
    ({"runs": [{"id": 1.5, "outcome": "ok", "finished_at": "f"}]}, True, False),
    ({"health": [{"name": "n", "level": "warn", "reason": "r"}], "agent": {"version": "1", "commit": "c"}},
     True, False),
    ({"next_run": {"at": "a", "reason": "r"}, "held": ["x", "y"], "unknown": {"any": ["thing"]}}, True, False),
    ({"state": {"level": "ok", "extra": 5}}, True, False),
    ({"detail": "x" * 5000, "held": ["h"] * 80}, True, False),
    ({"state": {"level": "great"}}, False, False),
    ({"state": "ok"}, False, False),
    ({"detail": 5}, False, False),
    ({"detail": True}, False, False),
    ({"gauges": [{"used": 1.5}]}, False, False),
    ({"gauges": [{"used": -0.1}]}, False, False),
    ({"gauges": [{"used": "0.5"}]}, False, False),
    ({"gauges": [{"used": True}]}, False, False),
    ({"gauges": {"used": 0.5}}, False, False),
    ({"gauges": ["x"]}, False, False),
    ({"active": [{"id": True}]}, False, False),
    ({"active": [{"id": [1]}]}, False, False),
    ({"runs": [{"title": 3}]}, False, False),
    ({"health": [{"level": "fine"}]}, False, False),
    ({"agent": "1.0"}, False, False),
    ({"agent": {"version": 1}}, False, False),
    ({"next_run": {"at": 5}}, False, False),
    ({"held": "paused"}, False, False),
    ({"held": [1]}, False, False),
    ([], False, False),
    ("ok", False, False),
    ({"detail": None}, False, True),
    ({"state": {"level": None}}, False, True),
    ({"held": ["h"] * 50 + [5]}, False, True),
]


@pytest.mark.parametrize("raw, valid, lenient", STATUS_CORPUS)
def test_the_filter_gives_the_schemas_verdict(raw, valid, lenient):
    from caldera.protocol import schemas

    try:
        schemas.validate("adapter-status.schema.json", raw)
        schema_says = True
    except schemas.SchemaError:
        schema_says = False
    try:
        status.filter_status(raw)
        filter_says = True
    except ContractError:
        filter_says = False
    assert schema_says is valid
    assert filter_says is (valid or lenient)
