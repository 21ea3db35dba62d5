"""The skill dirs (issue 34): ClawManager's CLAWMANAGER_AGENT_SKILL_DIRS, the runtime's own dirs
inside an instance, and category folders recursed (Hermes layout), as ClawManager's own agent
scans them."""
import os

import pytest
from skills_helpers import write_tree

from caldera import config
from caldera.skills import inventory

SKILL = {"SKILL.md": "---\nname: x\n---\n"}


def _identifiers(state_dir, env):
    scan = inventory.Inventory(state_dir, env, "hermes", persist=False).scan()
    return scan, sorted(r["identifier"] for r in scan.records)


def test_category_folders_are_recursed(tmp_path):
    root = tmp_path / "hermes-skills"
    write_tree(root / "productivity" / "notes", SKILL)  # a category
    write_tree(root / "research" / "papers" / "arxiv", SKILL)  # a category in a category
    write_tree(root / "research" / "papers" / "scratch", {"readme.txt": "no marker"})  # inside one: not a skill
    write_tree(root / "research" / "summarise", {"skill.json": '{"id": "sum"}'})
    write_tree(root / "loose", {"tool.py": "print()\n"})  # no marker, no skill under it: a skill itself
    write_tree(root / "weather", SKILL)
    write_tree(root / "weather" / "examples" / "demo", SKILL)  # inside a skill: part of it, never its own
    scan, found = _identifiers(tmp_path / "state", {"CLAWMANAGER_AGENT_SKILL_DIRS": str(root)})
    assert scan.complete and found == ["arxiv", "loose", "notes", "summarise", "weather"]
    weather = next(r for r in scan.records if r["identifier"] == "weather")
    assert weather["file_count"] == 2  # its examples are its own files


def test_categories_are_recursed_four_deep_at_most(tmp_path):
    root = tmp_path / "skills"
    write_tree(root / "a" / "b" / "c" / "d" / "four", SKILL)
    write_tree(root / "e" / "f" / "g" / "h" / "i" / "five", SKILL)
    _, found = _identifiers(tmp_path / "state", {"CALDERA_SKILL_DIRS": str(root)})
    assert found == ["e", "four"]  # past the depth the top folder is taken as it is, as before categories


def test_a_category_that_cannot_be_read_makes_the_scan_incomplete(tmp_path, monkeypatch):
    root = tmp_path / "skills"
    write_tree(root / "ok", SKILL)
    write_tree(root / "locked" / "inner", SKILL)
    real = os.scandir

    def scandir(path):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(inventory.os, "scandir", scandir)
    scan = inventory.Inventory(tmp_path / "state", {"CALDERA_SKILL_DIRS": str(root)}, persist=False).scan()
    assert not scan.complete  # never a full inventory after it (a full one removes what it leaves out)
    assert any("cannot read skill category: Permission denied" in p for p in scan.problems), scan.problems


def test_the_platforms_variable_is_read_as_calderas(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    write_tree(one / "alpha", SKILL)
    write_tree(two / "beta", SKILL)
    _, found = _identifiers(tmp_path / "state", {"CLAWMANAGER_AGENT_SKILL_DIRS": f"{one}:{two}"})
    assert found == ["alpha", "beta"]
    _, found = _identifiers(tmp_path / "state", {"CLAWMANAGER_AGENT_SKILL_DIRS": f"{one}:{two}",
                                                 "CALDERA_SKILL_DIRS": str(two)})
    assert found == ["beta"]  # caldera's own name wins, as for every alias
    _, problems = inventory.roots(tmp_path / "state", {"CLAWMANAGER_AGENT_SKILL_DIRS": "rel/dir"})
    assert problems == ["CLAWMANAGER_AGENT_SKILL_DIRS: 'rel/dir' is not an absolute path; left out"]


@pytest.fixture
def hermes_volume(tmp_path, monkeypatch):
    """The hermes image's dirs under a temporary /config (the table is config's; only its root moves)."""
    volume = tmp_path / "config"
    monkeypatch.setitem(config.RUNTIME_SKILL_DIRS, "hermes",
                        (str(volume / "hermes" / "skills"), str(volume / ".hermes" / "skills")))
    return volume


INSTANCE = {"CLAWMANAGER_AGENT_PERSISTENT_DIR": "/config/.hermes", "CLAWMANAGER_AGENT_RUNTIME_TYPE": "hermes",
            "CLAWMANAGER_RUNTIME_TYPE": "desktop"}


def test_inside_an_instance_the_runtimes_own_dirs_are_scanned_where_they_exist(tmp_path, hermes_volume):
    write_tree(hermes_volume / ".hermes" / "skills" / "devops" / "deploy", SKILL)
    scan, found = _identifiers(tmp_path / "state", INSTANCE)  # /config/hermes/skills is not there
    assert scan.complete and found == ["deploy"] and scan.problems == []
    write_tree(hermes_volume / "hermes" / "skills" / "notes", SKILL)
    _, found = _identifiers(tmp_path / "state", INSTANCE)
    assert found == ["deploy", "notes"]
    # the platform's variable replaces them; an old server (the marker only) has none
    _, found = _identifiers(tmp_path / "state", dict(INSTANCE, CLAWMANAGER_AGENT_SKILL_DIRS=str(tmp_path / "x")))
    assert found == []
    marker_only = {k: v for k, v in INSTANCE.items() if k != "CLAWMANAGER_AGENT_RUNTIME_TYPE"}
    assert _identifiers(tmp_path / "state", marker_only)[1] == []
