"""State dirs written by the released caldera 0.1.0, read by this runtime (issue 35).

The fixtures (tests/fixtures/state-0.1.0/, made by its make.py: README.md there) are the
config dir, the state dir and the plane's database as 0.1.0 left them. Each test copies one,
points it at a plane on loopback that serves that database (a host keeps its plane's URL
across an upgrade; the fixture's port was the maker's), and runs this caldera on it.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import Daemon, wait_for
from stateformat_helpers import read_format

from caldera.host import stateformat
from caldera.plane.server import PlaneServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "state-0.1.0"
TOKEN = "fixture-bootstrap-token-not-a-secret"
INSTANCE = 7
NAME = "fx-agent"


def load(name: str, into: Path) -> tuple[Path, Path]:
    """The fixture `name` as a host has it: (config root, state root). git keeps no modes:
    the ones 0.1.0 wrote are put back (the runtime refuses a secrets.env others may read)."""
    src = FIXTURES / name
    cfg, state = into / "etc", into / "var"
    shutil.copytree(src / "config", cfg, symlinks=True)
    (state).mkdir()
    shutil.copytree(src / "state", state / NAME, symlinks=True)
    shutil.copy2(src / "plane.db", into / "plane.db")
    agent = cfg / "agents" / NAME
    os.chmod(agent / "secrets.env", 0o600)
    os.chmod(agent / "agent.env", 0o640)
    for top, dirs, files in os.walk(state / NAME):
        for d in dirs:
            os.chmod(Path(top) / d, 0o700)
        for f in files:
            os.chmod(Path(top) / f, 0o644 if f == "status.json" else 0o600)
    os.chmod(state / NAME, 0o711)
    return cfg, state


def repoint(cfg: Path, state: Path, url: str) -> None:
    """The plane's new port, in the two places 0.1.0 keeps the URL; nothing else changes."""
    env = cfg / "agents" / NAME / "agent.env"
    lines = [f"CALDERA_BASE_URL={url}" if ln.startswith("CALDERA_BASE_URL=") else ln
             for ln in env.read_text().splitlines()]
    env.write_text("\n".join(lines) + "\n")
    session = state / NAME / "session.json"
    doc = json.loads(session.read_text())
    session.write_text(json.dumps({**doc, "base_url": url}))


@pytest.fixture
def fixture_env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith(("CALDERA_", "CLAWMANAGER_")):
            monkeypatch.delenv(key)

    def open_fixture(name: str):
        cfg, state = load(name, tmp_path)
        plane = PlaneServer(str(tmp_path / "plane.db"), tokens={TOKEN: INSTANCE}, heartbeat_interval=1,
                            poll_interval=1, session_ttl=10 * 365 * 86400).start()
        planes.append(plane)
        repoint(cfg, state, plane.url)
        monkeypatch.setenv("CALDERA_CONFIG_DIR", str(cfg))
        monkeypatch.setenv("CALDERA_STATE_DIR", str(state))
        return plane, state / NAME

    planes: list[PlaneServer] = []
    yield open_fixture
    for plane in planes:
        plane.stop()


def commands(plane) -> dict[int, dict]:
    return {int(c["id"]): c for c in plane.store.commands(INSTANCE)}


def requests_to(plane, method: str, path_end: str) -> int:
    return sum(1 for m, path, status in list(plane.requests) if m == method and path.endswith(path_end))


def tree_digest(root: Path) -> str:
    """Every name, mode and content under root."""
    h = hashlib.sha256()
    for top, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files) + dirs:
            p = Path(top) / name
            st = os.lstat(p)
            h.update(f"{p.relative_to(root)} {st.st_mode:o}\n".encode())
            if p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


def test_fixtures_are_what_make_py_says():
    """Guards the fixtures themselves: 0.1.0's layout, no format marker, the finishes queued
    (one held back with its retry record) and, in daemon-killed, a command in flight."""
    for name, queued in (("daemon-killed", 3), ("cron", 2)):
        state = FIXTURES / name / "state"
        assert not (state / stateformat.MARKER).exists()
        items = [json.loads(p.read_text()) for p in sorted((state / "outbox").glob("*-finish.json"))]
        assert len(items) == queued and sum(1 for i in items if i.get("retry")) == 1
        assert json.loads((state / "session.json").read_text())["session_token"].startswith("agt_sess_")
    journal = json.loads((FIXTURES / "daemon-killed" / "state" / "state.json").read_text())["commands"]
    assert [e["phase"] for e in journal.values()] == ["executing"]


def test_daemon_on_a_killed_010_state_dir_delivers_everything_once_without_registering(fixture_env):
    plane, state = fixture_env("daemon-killed")
    in_flight = int(next(iter(json.loads((state / "state.json").read_text())["commands"])))
    assert commands(plane)[in_flight]["status"] == "running"
    daemon = Daemon(NAME)
    try:
        done = lambda: all(c["status"] in ("succeeded", "failed") for c in commands(plane).values())  # noqa: E731
        wait_for(done, timeout=30, what="every command of the 0.1.0 state finished at the plane")
        wait_for(lambda: not list((state / "outbox").glob("*.json")), timeout=30, what="an empty outbox")
    finally:
        assert daemon.stop() == 0, daemon.log()
    got = commands(plane)
    assert [got[i]["status"] for i in (1, 2, 3)] == ["succeeded"] * 3
    assert got[in_flight]["status"] == "failed" and "interrupted" in got[in_flight]["error_message"]
    for cid in (1, 2, 3, in_flight):  # exactly once: the plane took each finish one time
        assert requests_to(plane, "POST", f"/commands/{cid}/finish") == 1, cid
    assert requests_to(plane, "POST", "/agent/register") == 0  # the 0.1.0 session goes on
    assert json.loads((state / stateformat.MARKER).read_text()) == {"format": 1, "written_by": "0.2.0"}
    assert "registered" not in daemon.log()


def test_report_once_on_a_cron_010_state_dir(fixture_env):
    plane, state = fixture_env("cron")
    done = subprocess.run([sys.executable, "-m", "caldera.cli", "report", "--once", "--agent", NAME,
                           "--deadline", "15"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = commands(plane)
    assert [got[i]["status"] for i in (1, 2)] == ["succeeded"] * 2
    assert [requests_to(plane, "POST", f"/commands/{i}/finish") for i in (1, 2)] == [1, 1]
    assert requests_to(plane, "POST", "/agent/register") == 0
    assert not list((state / "outbox").glob("*.json"))
    assert read_format(state) == (1, "0.2.0")


REFUSING = [
    ["run", "--agent", NAME], ["report", "--once", "--agent", NAME], ["status", "--agent", NAME],
    ["status", "--agent", NAME, "--json"], ["pause", "--agent", NAME], ["resume", "--agent", NAME],
    ["run-now", "--agent", NAME], ["settings", "get", "--agent", NAME], ["settings", "set", "x=1", "--agent", NAME],
    ["log", "--agent", NAME], ["skills", "--agent", NAME], ["check", "--agent", NAME],
    ["turn", "--agent", NAME, "--workspace", "{tmp}", "hello"],
]
PROCESS_AGENT = "name: fx-agent\nruntime:\n  type: process\n  command: [python3, agent.py]\nstatus: status.json\n"


def _refused_unchanged(plane, state: Path, argv: list[str]) -> None:
    """argv exits 2 with the one sentence naming both versions, and nothing under the state
    root changed (no file made, none rewritten), nor did the plane hear from it."""
    (state / stateformat.MARKER).write_text(json.dumps({"format": 2, "written_by": "0.3.0"}))
    before = tree_digest(state.parent)
    argv = [a.replace("{tmp}", str(state.parent.parent)) for a in argv]
    done = subprocess.run([sys.executable, "-m", "caldera.cli", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (argv, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert lines == [f"caldera {argv[0]}: {state} is in state format 2, written by caldera 0.3.0, and caldera "
                     f"0.2.0 reads formats up to 1: install caldera 0.3.0 or later again (nothing was changed)"], \
        (argv, done.stderr)
    assert tree_digest(state.parent) == before, argv
    assert list(plane.requests) == []


@pytest.mark.parametrize("verb", REFUSING, ids=lambda v: " ".join(v[:2]))
def test_a_newer_format_is_refused_with_exit_2_and_nothing_changed(fixture_env, verb):
    """Every command that opens an agent's state dir (issue 35's review: `skills` made
    skills/.caldera-lock there, `status` cache/ and logs/)."""
    plane, state = fixture_env("daemon-killed")
    _refused_unchanged(plane, state, verb)


@pytest.mark.parametrize("verb", [["status", "--agent", NAME], ["pause", "--agent", NAME], ["log", "--agent", NAME]],
                         ids=lambda v: v[0])
def test_a_newer_format_is_refused_for_a_process_agent_too(fixture_env, verb):
    plane, state = fixture_env("daemon-killed")
    manifest = Path(os.environ["CALDERA_CONFIG_DIR"]) / "agents" / NAME / "caldera.agent.yaml"
    manifest.write_text(PROCESS_AGENT)
    for sub in ("cache", "logs"):  # what status made there before the check
        shutil.rmtree(state / sub, ignore_errors=True)
    _refused_unchanged(plane, state, verb)


def test_init_over_a_newer_state_dir_is_refused_and_changes_nothing(fixture_env, tmp_path):
    plane, state = fixture_env("daemon-killed")
    shutil.rmtree(Path(os.environ["CALDERA_CONFIG_DIR"]) / "agents" / NAME)  # removed, its state kept
    blueprint = Path(__file__).resolve().parents[2] / "examples" / "task-agent"
    _refused_unchanged(plane, state, ["init", str(blueprint), "--name", NAME])


def test_a_format_json_that_is_a_link_is_refused_by_every_command(fixture_env, tmp_path):
    plane, state = fixture_env("daemon-killed")
    (tmp_path / "elsewhere.json").write_text('{"format": 1}')
    os.symlink(tmp_path / "elsewhere.json", state / stateformat.MARKER)
    before = tree_digest(state.parent)
    for argv in (["status", "--agent", NAME], ["run", "--agent", NAME]):
        done = subprocess.run([sys.executable, "-m", "caldera.cli", *argv], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and done.stderr.strip() == (
            f"caldera {argv[0]}: {state / stateformat.MARKER} is a symbolic link, and caldera writes that file "
            f"itself: remove the link (a state dir without it counts as caldera 0.1.0's)"), done.stderr
    assert tree_digest(state.parent) == before
