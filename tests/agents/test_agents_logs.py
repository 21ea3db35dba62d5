"""Log names are refused by the runtime without calling the adapter."""
import pytest
from adapter_helpers import calls, make_agent

from caldera.agents.adapter import logs, verbs
from caldera.agents.manifest import load_manifest

BAD = ["../../etc/passwd", "-x", "", "a" * 191, "a\0b", "a/b", "a\\b", ".", "..", "a\nb"]


@pytest.mark.parametrize("name", BAD)
def test_refused_without_calling(tmp_path, name):
    paths = make_agent(tmp_path, "recorder.py")
    answer = verbs.log_get(load_manifest(paths.manifest_path), name)
    assert not answer.ok
    assert answer.message and "no such log" not in answer.message.lower()
    assert calls(paths) == []


def test_190_characters_are_fine():
    assert logs.name_problem("a" * 190) is None
    assert logs.name_problem("run-20261003-124101.log") is None


def test_unknown_name_and_a_tail(tmp_path):
    paths = make_agent(tmp_path, "recorder.py")
    manifest = load_manifest(paths.manifest_path)
    missing = verbs.log_get(manifest, "run-20990101-000000.log")
    assert not missing.ok and missing.message == "There is no such log."
    found = verbs.log_get(manifest, "run-20261003-124101.log")
    assert found.ok and found.text == "line\n" * 3


def test_list_drops_names_the_runtime_would_refuse(tmp_path):
    paths = make_agent(tmp_path, "recorder.py")
    answer = verbs.log_list(load_manifest(paths.manifest_path))
    assert answer.ok and answer.data == {"logs": ["run-20261003-124101.log"]}


def test_list_uses_at_most_50():
    names = logs.check_log_list({"logs": [{"name": f"l{i}.log"} for i in range(80)]})
    assert names == [f"l{i}.log" for i in range(50)]
