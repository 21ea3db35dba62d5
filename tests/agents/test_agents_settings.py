"""Settings: the manifest allows 0.1-1.0, the adapter says 0.1-0.95: 0.95 is offered,
0.97 is refused without calling the adapter, 0.9 reaches it."""
import pytest
from adapter_helpers import calls, make_agent, setting, workdir

from caldera.agents import settings
from caldera.agents.adapter import verbs
from caldera.agents.manifest import load_manifest


@pytest.fixture
def agent(tmp_path):
    paths = make_agent(tmp_path, "recorder.py")
    return paths, load_manifest(paths.manifest_path)


def _set_calls(paths):
    return [c for c in calls(paths) if c[:2] == ["settings", "set"]]


def test_offered_schema_is_narrowed(agent):
    paths, manifest = agent
    answer = verbs.settings_get(manifest)
    assert answer.ok
    (item,) = answer.data["schema"]
    assert (item["min"], item["max"]) == (0.1, 0.95)
    assert setting(manifest, "max_7d")["max"] == 1.0  # the manifest itself is untouched
    assert answer.data["values"] == {"max_7d": 0.75}


def test_set_above_the_narrowed_bound_never_reaches_the_adapter(agent):
    paths, manifest = agent
    answer = verbs.settings_set(manifest, {"max_7d": 0.97})
    assert not answer.ok
    assert answer.message == "Nothing changed: max_7d: 0.97 is above the maximum 0.95"
    assert _set_calls(paths) == []
    assert not (workdir(paths) / "settings.json").exists()


def test_set_above_the_manifest_bound_is_refused_before_any_call(agent):
    paths, manifest = agent
    answer = verbs.settings_set(manifest, {"max_7d": 1.5})
    assert "Nothing changed: max_7d: 1.5 is not a fraction" in answer.message
    assert calls(paths) == []  # not even settings get


def test_set_inside_reaches_the_adapter(agent):
    paths, manifest = agent
    answer = verbs.settings_set(manifest, {"max_7d": 0.9})
    assert answer.ok and answer.message == "Saved."
    assert _set_calls(paths) == [["settings", "set", '{"max_7d":0.9}']]
    assert verbs.settings_get(manifest).data["values"] == {"max_7d": 0.9}


def test_all_or_nothing_on_an_unknown_key(agent):
    paths, manifest = agent
    answer = verbs.settings_set(manifest, {"max_7d": 0.5, "nope": 1})
    assert "nope: not a setting of this agent" in answer.message
    assert calls(paths) == []


def test_narrow_never_widens():
    schema = ({"key": "a", "type": "number", "min": 0, "max": 10},)
    assert settings.narrow(schema, {"a": {"min": -5, "max": 20}})[0] == schema[0]
    assert settings.narrow(schema, {"a": {"min": 2}})[0]["min"] == 2
    assert settings.narrow(schema, {"a": {"max": 3}})[0]["max"] == 3
    only_adapter = settings.narrow(({"key": "b", "type": "integer"},), {"b": {"max": 7}})
    assert only_adapter[0]["max"] == 7


def test_disjoint_bounds_refuse_every_value():
    item = settings.narrow(({"key": "a", "type": "number", "min": 0, "max": 1},), {"a": {"min": 2}})[0]
    assert "no value is allowed" in settings.value_problem(item, 0.5)


@pytest.mark.parametrize("item,value,problem", [
    ({"key": "k", "type": "integer", "min": 1}, 1.5, "not a whole number"),
    ({"key": "k", "type": "integer"}, True, "not a whole number"),
    ({"key": "k", "type": "number", "step": 0.5}, 0.7, "not a multiple of the step"),
    ({"key": "k", "type": "boolean"}, "yes", "not true or false"),
    ({"key": "k", "type": "string", "max_length": 3}, "abcd", "over the maximum length 3"),
    ({"key": "k", "type": "enum", "options": ["a", "b"]}, "c", "not one of a, b"),
    ({"key": "k", "type": "number"}, float("nan"), "not a number"),
])
def test_value_problems(item, value, problem):
    assert problem in settings.value_problem(item, value)


def test_null_unsets_and_steps_from_min_pass():
    assert settings.value_problem({"key": "k", "type": "percent", "min": 0.1, "max": 1}, None) is None
    assert settings.value_problem({"key": "k", "type": "number", "min": 0.1, "step": 0.05}, 0.85) is None


def test_set_argument_over_8_kib_is_refused(agent):
    paths, manifest = agent
    schema = ({"key": "note", "type": "string"},)
    assert "over the 8192-byte limit" in settings.check_values({"note": "x" * 9000}, schema)


def test_parse_pairs_types_by_manifest():
    schema = ({"key": "p", "type": "percent"}, {"key": "i", "type": "integer"}, {"key": "b", "type": "boolean"},
              {"key": "s", "type": "string"})
    assert settings.parse_pairs(["p=95%", "i=3", "b=off", "s=hello world"], schema) == {
        "p": 0.95, "i": 3, "b": False, "s": "hello world"}
    assert settings.parse_pairs(["s="], schema) == {"s": None}
    assert settings.parse_pairs(['{"s": ""}'], schema) == {"s": ""}
    for bad in (["p"], ["i=x"], ["zz=1"], ["b=maybe"]):
        with pytest.raises(ValueError):
            settings.parse_pairs(bad, schema)


def test_settings_get_contract():
    from caldera.agents.adapter.answer import ContractError

    schema = ({"key": "a", "type": "number"},)
    values, bounds = settings.check_settings_get({"values": {"a": 1, "zz": 2}, "bounds": {"zz": {"max": 1}}}, schema)
    assert values == {"a": 1} and bounds == {}
    for bad in ({}, {"values": []}, {"values": {}, "bounds": {"a": {"max": "9"}}},
                {"values": {}, "bounds": {"a": {"maximum": 9}}}):
        with pytest.raises(ContractError):
            settings.check_settings_get(bad, schema)
