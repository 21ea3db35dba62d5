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
    write_tree(root / "productivity", {"DESCRIPTION.md": "Tools for work.\n"})  # a category's own file
    write_tree(root / "research" / "papers" / "arxiv", SKILL)  # a category in a category
    write_tree(root / "research" / "papers" / "scratch", {"readme.txt": "no marker"})  # inside one: not a skill
    write_tree(root / "research" / "summarise", {"skill.md": "lower case counts\n", "skill.json": '{"id": "sum"}'})
    write_tree(root / "weather", SKILL)
    write_tree(root / "weather" / "examples" / "demo", SKILL)  # inside a skill: part of it, never its own
    scan, found = _identifiers(tmp_path / "state", {"CLAWMANAGER_AGENT_SKILL_DIRS": str(root)})
    assert scan.complete and found == ["arxiv", "notes", "summarise", "weather"]
    weather = next(r for r in scan.records if r["identifier"] == "weather")
    assert weather["file_count"] == 2  # its examples are its own files
    assert next(r for r in scan.records if r["identifier"] == "summarise")["skill_id"] == "sum"


def test_a_folder_without_skill_md_is_no_skill(tmp_path):
    """ClawManager takes a skill's package only with SKILL.md (any case; a 500 otherwise): a folder
    reported without one became a platform skill whose collect_skill_package failed for good,
    shown active for ever. A Hermes category holding only DESCRIPTION.md, an empty folder, loose
    files: none is a skill. One that looks like a skill of another kind is named."""
    root = tmp_path / "skills"
    write_tree(root / "only-description", {"DESCRIPTION.md": "A category with nothing in it yet.\n"})
    (root / "empty").mkdir(parents=True)
    write_tree(root / "loose", {"tool.py": "print()\n"})
    write_tree(root / "json-only", {"skill.json": '{"id": "j"}', "run.py": "x\n"})
    write_tree(root / "real", SKILL)
    scan, found = _identifiers(tmp_path / "state", {"CALDERA_SKILL_DIRS": str(root)})
    assert found == ["real"] and scan.complete
    assert scan.problems == [f"{root / 'json-only'}: skill.json but no SKILL.md, which the control plane requires "
                             "of a skill; not reported"]


def test_categories_are_recursed_four_deep_at_most_and_what_is_deeper_is_named(tmp_path):
    root = tmp_path / "skills"
    write_tree(root / "a" / "b" / "c" / "d" / "four", SKILL)
    write_tree(root / "e" / "f" / "g" / "h" / "i" / "five", SKILL)
    scan, found = _identifiers(tmp_path / "state", {"CALDERA_SKILL_DIRS": str(root)})
    assert found == ["four"]  # `e` is no skill: the one below the limit was never its own
    deep = root / "e" / "f" / "g" / "h" / "i"
    assert scan.problems == [f"{deep}: a category folder deeper than 4 levels; the folders under it are not scanned"]


def test_an_unreadable_category_costs_its_own_skills_only(tmp_path, monkeypatch):
    root = tmp_path / "skills"
    write_tree(root / "ok", SKILL)
    write_tree(root / "locked" / "inner", SKILL)
    write_tree(root / "work" / "open", SKILL)
    real = os.scandir

    def scandir(path):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(inventory.os, "scandir", scandir)
    scan = inventory.Inventory(tmp_path / "state", {"CALDERA_SKILL_DIRS": str(root)}, persist=False).scan()
    assert not scan.complete  # never a full inventory after it (a full one removes what it leaves out)
    assert sorted(r["identifier"] for r in scan.records) == ["ok", "open"]  # the rest of the root is kept
    assert scan.problems == [f"{root / 'locked'}: cannot read skill category: Permission denied; the skills "
                             "under it are not reported"]


def test_a_record_cached_under_another_runtime_name_takes_the_current_one(tmp_path):
    """0.1.0 named the runtime `desktop`; its cache must not keep saying so after the upgrade."""
    root = tmp_path / "skills"
    write_tree(root / "notes", SKILL)
    env = {"CALDERA_SKILL_DIRS": str(root)}
    first = inventory.Inventory(tmp_path / "state", env, "desktop").scan()
    assert first.records[0]["metadata"]["runtime_type"] == "desktop" and first.hashed == 1
    again = inventory.Inventory(tmp_path / "state", env, "hermes").scan()
    assert again.records[0]["metadata"]["runtime_type"] == "hermes" and again.hashed == 0  # no rehash needed
    assert inventory.digest_of(again.records) != inventory.digest_of(first.records)  # so it is sent again


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
