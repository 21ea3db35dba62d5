"""Releases (issue 35): one version, read everywhere it is shown; the release table; the
schemas inside the package."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import caldera
from caldera.plane import page
from caldera.plane.store import Store
from caldera.protocol import schemas
from caldera.protocol.payloads import Identity, register_body

ROOT = Path(__file__).resolve().parents[2]


def release_table() -> dict[str, str]:
    """version -> the table's commit cell, from docs/packaging.md's "Releases"."""
    text = (ROOT / "docs" / "packaging.md").read_text()
    section = text[text.index("## Releases"):]
    section = section[:section.index("\n## ", 1)]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| (\d+\.\d+\.\d+) \| ([^|]+)\|", section, re.M)}


def test_the_release_table_names_010s_commit_and_this_version():
    table = release_table()
    assert table["0.1.0"] == "`f583354`"
    assert caldera.__version__ in table
    changelog = (ROOT / "debian" / "changelog").read_text()
    for version in table:  # every release has its changelog entry
        assert re.search(rf"^caldera \({re.escape(version)}\) ", changelog, re.M), version


def test_010s_commit_is_in_the_history_where_there_is_one():
    if not (ROOT / ".git").exists():
        pytest.skip("no git history here (the .deb's build tree)")
    done = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", "f583354^{commit}"], capture_output=True)
    if done.returncode and b"not a git repository" in done.stderr:
        pytest.skip("no git history here")
    assert done.returncode == 0, "f583354 (0.1.0) is not in this clone's history (a shallow clone?)"


def _tags() -> dict[str, str] | None:
    """tag -> the full hash of its commit, in this clone; None without a git history."""
    if not (ROOT / ".git").exists():
        return None
    done = subprocess.run(["git", "-C", str(ROOT), "tag", "--list", "v*"], capture_output=True, text=True)
    if done.returncode:
        return None
    return {name: subprocess.run(["git", "-C", str(ROOT), "rev-parse", f"{name}^{{commit}}"], capture_output=True,
                                 text=True, check=True).stdout.strip() for name in done.stdout.split()}


def test_every_row_names_its_tag_and_every_tag_here_points_at_its_rows_commit():
    """A release cannot name its own commit: its row names the tag (set on the commit the lead
    submits), and the next release puts the hash in. Nothing may claim a commit the tag does
    not point at."""
    text = (ROOT / "docs" / "packaging.md").read_text()
    section = text[text.index("## Releases"):]
    rows = re.findall(r"^\| (\d+\.\d+\.\d+) \| ([^|]+)\| ([^|]+)\|", section[:section.index("\n## ", 1)], re.M)
    assert rows
    tags = _tags()
    for version, commit, tag in rows:
        assert f"`v{version}`" in tag, (version, tag)
        short = re.fullmatch(r"`([0-9a-f]{7,40})`", commit.strip())
        if short is None:
            assert f"the tag `v{version}` points at" in commit, (version, commit)
        if tags is not None and f"v{version}" in tags and short is not None:
            assert tags[f"v{version}"].startswith(short.group(1)), f"v{version} is not {short.group(1)}"


def test_the_one_version_reaches_the_cli_the_register_body_and_the_planes_page(tmp_path):
    version = caldera.__version__
    out = subprocess.run([sys.executable, "-m", "caldera.cli", "--version"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.stdout.strip() == f"caldera {version}"

    class Settings:  # what register_body reads of the settings
        instance_id, runtime_type, persistent_dir = 7, "caldera", "/var/lib/caldera/x"

    body = register_body(Identity(agent_id="caldera-7-main", agent_name="x", runtime_name="x"), Settings())
    assert body["agent_version"] == f"caldera-{version}"
    store = Store(str(tmp_path / "plane.db"))
    try:
        assert f"caldera {version}" in page.render(store)
    finally:
        store.close()


def test_the_schemas_are_read_from_the_package_itself():
    """Not from beside a checkout nor /usr/share: the caldera that runs carries them."""
    where = Path(str(schemas.schema_dir()))
    assert where == Path(caldera.__file__).parent / "schemas"
    assert (where / "manifest.schema.json").is_file()
    assert len(list(where.rglob("*.schema.json"))) == len(list((ROOT / "schemas").rglob("*.schema.json")))
