"""`caldera skills [--json]`."""
import json
import os

from skills_helpers import write_tree

from caldera import cli


def _agent(tmp):
    config = tmp / "etc" / "agents" / "demo"
    config.mkdir(parents=True)
    (config / "caldera.agent.yaml").write_text("name: demo\nruntime:\n  type: adapter\n  command: [x]\n")
    (config / "agent.env").write_text(f"CALDERA_SKILL_DIRS={tmp / 'extra'}\n")
    return tmp / "var" / "demo"


def test_skills_json(caldera_env, capsys):
    state = _agent(caldera_env)
    write_tree(state / "skills" / "hello", {"SKILL.md": "hello\n"})
    write_tree(caldera_env / "extra" / "other", {"SKILL.md": "x"})
    assert cli.main(["skills", "--agent", "demo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["complete"] is True
    got = {s["identifier"]: s["content_md5"] for s in doc["skills"]}
    assert got["hello"] == "bab02a68eaf254c164cf4d590bdd8693" and set(got) == {"hello", "other"}
    assert [r["kind"] for r in doc["roots"]] == ["managed", "discovered", "disabled"]
    assert not (state / "cache" / "skills-inventory.json").exists()  # the CLI never writes the cache


def test_skills_human(caldera_env, capsys):
    state = _agent(caldera_env)
    write_tree(state / "skills" / "hello", {"SKILL.md": "hello\n"})
    write_tree(state / "skills" / "bad", {"x\\y": "z"})
    assert cli.main(["skills", "--agent", "demo"]) == 0
    out = capsys.readouterr().out
    assert "hello" in out and "bab02a68eaf254c164cf4d590bdd8693" in out
    assert "backslash" in out and os.path.join("skills", "bad") in out
