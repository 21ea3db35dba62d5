"""The backend profile names live in one place, caldera/backends/registry.PROFILES (issue 39:
agent_run's schema listed two of three, so OpenCode could be reached from no control plane).
Every other list of them is checked against it here: the schema the agent and `caldera plane`
validate with, the tables keyed by profile, `caldera turn --backend` and its bash completion."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from caldera.backends import base, readiness
from caldera.backends.registry import BINARIES, DEFAULT_PROFILE, LLM_SOURCES, PROFILES
from caldera.cli import turn
from caldera.plane.store import Store
from caldera.protocol import schemas

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "commands/agent_run.schema.json"


@pytest.fixture
def db(tmp_path):
    """A plane database (`caldera plane enqueue` writes into an existing one)."""
    store = Store(tmp_path / "p.db")
    store.add_instance(1, "tok-1")
    store.close()
    return tmp_path / "p.db"


def caldera(*args):
    return subprocess.run([sys.executable, "-m", "caldera.cli", *args], capture_output=True, text=True, timeout=60)


def test_agent_run_schema_allows_exactly_the_registered_profiles():
    published = json.loads((REPO / "schemas" / SCHEMA).read_text())
    packaged = json.loads(schemas.schema_dir().joinpath(SCHEMA).read_text())  # what the agent and plane read
    for schema in (published, packaged):
        field = schema["properties"]["backend_profile"]
        assert field["enum"] == list(PROFILES)
        assert field["default"] == DEFAULT_PROFILE


def test_every_table_keyed_by_profile_names_every_profile():
    for table in (BINARIES, LLM_SOURCES, readiness.PLANS, turn.HOW_TO_GET):
        assert list(table) == list(PROFILES)
    for profile in PROFILES:  # each backend calls itself, and reads its projection, by its profile's name
        assert base.get_backend(profile).name == profile
        assert LLM_SOURCES[profile].projection == profile


@pytest.mark.parametrize("profile", list(PROFILES))
def test_plane_enqueue_and_the_agents_check_accept_every_profile(profile, db):
    payload = {"run_id": "r-1", "prompt": "hi", "workspace": "/srv/ws", "backend_profile": profile}
    schemas.validate(SCHEMA, payload)  # the daemon's check before the handler (executor._validate)
    done = caldera("plane", "enqueue", "--db", str(db), "--instance", "1", "agent_run",
                   "--payload", json.dumps(payload))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().isdigit()


def test_plane_enqueue_refuses_an_unknown_profile_naming_the_known_ones(db):
    payload = {"run_id": "r-1", "prompt": "hi", "workspace": "/srv/ws", "backend_profile": "aider"}
    done = caldera("plane", "enqueue", "--db", str(db), "--instance", "1", "agent_run",
                   "--payload", json.dumps(payload))
    assert done.returncode == 2
    assert "'aider'" in done.stderr and all(f"'{p}'" in done.stderr for p in PROFILES), done.stderr


def test_caldera_turn_offers_the_profiles_and_bash_completes_them():
    done = caldera("turn", "--help")
    assert "{" + ",".join(PROFILES) + "}" in done.stdout.replace("\n", "").replace(" ", "")
    completed = caldera("__complete", "3", "caldera", "turn", "--backend", "")
    assert completed.stdout.split() == list(PROFILES)
    refused = caldera("turn", "--workspace", "/", "--backend", "aider", "hi")
    assert refused.returncode == 2 and "invalid choice: 'aider'" in refused.stderr
