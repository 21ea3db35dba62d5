"""The trust boundary (SPEC section 11, docs/trust-boundary.md): a config revision or a
blueprint update may change what the agent is told, never what the host runs.

Hostile revisions are fixture manifests in ./revisions/; each is refused as a whole,
its finish naming the key, and nothing of it is stored or applied."""
import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml
from adapter_helpers import setting
from fault_helpers import API
from skills_helpers import BASE, FakeRuntime, ctx, run

from caldera.agents import trust, updates, window
from caldera.agents.manifest import load_manifest
from caldera.agents.updates import load_effective
from caldera.errors import CommandError

REVISIONS = Path(__file__).resolve().parent / "revisions"
HOSTILE = sorted(REVISIONS.glob("hostile_*.yaml"))


def _installed(tmp_path, base_url: str = BASE) -> FakeRuntime:
    rt = FakeRuntime(tmp_path, base_url=base_url)
    rt.paths.manifest_path.write_text((REVISIONS / "installed.yaml").read_text())
    return rt


def _envelope(content: dict, rev_id: int) -> bytes:
    raw = json.dumps(content, separators=(",", ":")).encode()
    checksum = "sha256:" + hashlib.sha256(raw).hexdigest()
    return (b'{"success":true,"data":{"revision":{"id":%d,"revision_no":1,"content":%s,"checksum":"%s"}}}'
            % (rev_id, raw, checksum.encode()))


def _apply(rt, wire, rev_id: int, content: dict):
    wire.route("GET", f"{API}/config/revisions/{rev_id}", body=_envelope(content, rev_id), status=200, times=1)
    return run(rt, "apply_config_revision", {"revision_id": rev_id})


def _key_of(fixture: Path) -> str:
    return fixture.read_text().splitlines()[0].split("touches ")[1].split(";")[0]


@pytest.mark.parametrize("fixture", HOSTILE, ids=lambda p: p.stem)
def test_a_hostile_revision_is_refused_as_a_whole_naming_the_key(tmp_path, fixture, wire):
    rt = _installed(tmp_path, wire.url)
    rt.state.set("current_config_revision_id", 4)
    before = rt.paths.manifest_path.read_bytes()
    # The settings ride along in the same revision: refused as a whole means they are not applied either.
    content = {"manifest": fixture.read_text(), "settings": {"max_7d": 0.5}}
    with pytest.raises(CommandError) as err:
        _apply(rt, wire, 12, content)
    message = str(err.value)
    assert _key_of(fixture) in message and "refused as a whole, nothing applied" in message
    assert rt.paths.manifest_path.read_bytes() == before
    assert not updates.update_file(rt.paths).exists() and window.current(rt.paths) is None
    assert not (rt.paths.state_dir / "config-revisions").exists()
    assert rt.state.get("current_config_revision_id") == 4
    assert load_effective(rt.paths).command == load_manifest(rt.paths.manifest_path).command


def test_runtime_keys_at_the_top_of_a_revision_are_refused_too(tmp_path, wire):
    rt = _installed(tmp_path, wire.url)
    with pytest.raises(CommandError, match=r"refused as a whole.*env: changes what the host runs"):
        _apply(rt, wire, 5, {"env": {"LD_PRELOAD": "/tmp/x.so"}, "mode": "bundle"})
    with pytest.raises(CommandError, match=r"mcp\.shell\.command"):
        _apply(rt, wire, 6, {"mcp": {"shell": {"command": ["sh"]}}})


def test_what_the_agent_is_told_is_applied_over_a_read_only_etc(tmp_path, wire):
    rt = _installed(tmp_path, wire.url)
    installed = rt.paths.manifest_path.read_bytes()
    result = _apply(rt, wire, 7, {"manifest": (REVISIONS / "told.yaml").read_text()})
    assert result["manifest"]["changed"] is True and result["current_config_revision_id"] == 7
    # Kept in the state dir with its revision id; the installed file and its directory are untouched.
    assert rt.paths.manifest_path.read_bytes() == installed
    assert sorted(p.name for p in rt.paths.config_dir.iterdir()) == ["caldera.agent.yaml"]
    stored = json.loads(updates.update_file(rt.paths).read_text())
    assert stored["revision_id"] == 7 and stored["doc"]["version"] == "1.1.0"
    # A restart reads it again: the effective manifest is the update over the installed one.
    effective = load_effective(rt.paths)
    assert effective.version == "1.1.0" and effective.update["revision_id"] == 7
    assert effective.timeout_seconds == 30 and effective.controls == ("pause", "resume")
    assert setting(effective, "max_7d")["max"] == 0.9 and setting(effective, "mode") is None
    assert effective.command == load_manifest(rt.paths.manifest_path).command


def test_a_stored_update_that_no_longer_fits_the_installed_manifest_is_ignored(tmp_path, wire):
    rt = _installed(tmp_path, wire.url)
    _apply(rt, wire, 7, {"manifest": (REVISIONS / "told.yaml").read_text()})
    # The operator installs a blueprint with tighter bounds: the stored update would now widen them.
    rt.paths.manifest_path.write_text(rt.paths.manifest_path.read_text().replace("max: 0.95", "max: 0.8"))
    effective = load_effective(rt.paths)
    assert effective.update is None and setting(effective, "max_7d")["max"] == 0.8


def test_a_hand_written_update_file_cannot_smuggle_a_command_in(tmp_path):
    rt = _installed(tmp_path)
    doc = yaml.safe_load((REVISIONS / "hostile_runtime_command.yaml").read_text())
    updates.write(rt.paths, updates.record_for(doc, 99))
    assert load_effective(rt.paths).command == load_manifest(rt.paths.manifest_path).command


# ---------------------------------------------------------------- the rule itself

BASE = yaml.safe_load((REVISIONS / "installed.yaml").read_text())


def _with(**changes) -> dict:
    doc = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *head, last = dotted.split("__")
        target = doc
        for part in head:
            target = target.setdefault(part, {})
        target[last] = value
    return doc


@pytest.mark.parametrize("changes, key", [
    ({"runtime__command": ["sh"]}, "runtime.command"),
    ({"runtime__workdir": "/"}, "runtime.workdir"),
    ({"runtime__type": "process"}, "runtime.type"),
    ({"health__command": ["sh"]}, "health.command"),
    ({"account": True}, "account"),
    ({"secrets": ["OPENAI_API_KEY"]}, "secrets"),
    ({"bindings": ["llm_gateway"]}, "bindings"),
    ({"env": {"PATH": "/tmp"}}, "env"),
    ({"status": "/etc/shadow"}, "status"),
    ({"logs": "/var/log"}, "logs"),
    ({"state": "/root"}, "state"),
    ({"instructions": "/etc/passwd"}, "instructions"),
    ({"mcp": {"files": {"command": ["npx", "evil"]}}}, "mcp.files.command"),
    ({"something_new": 1}, "something_new"),
])
def test_check_update_names_each_key_that_moves_what_the_host_runs(changes, key):
    problems = trust.check_update(BASE, _with(**changes))
    assert problems and problems[0].startswith(key + ":"), problems


def test_check_update_allows_what_the_agent_is_told():
    told = _with(version="9", description="d", runtime__timeout_seconds=5, health__interval_seconds=600,
                 controls=["pause"], mcp={"docs": {"url": "https://mcp.example/docs"}})
    told["settings"]["schema"][0].update(min=0.2, max=0.9, label="Weekly cap")
    assert trust.check_update(BASE, told) == []


@pytest.mark.parametrize("change, word", [
    ({"max": 1.0}, "max"), ({"min": 0.05}, "min"), ({"min": 0.12}, "off the installed grid"),
    ({"step": 0.01}, "step"), ({"type": "number"}, "type"),
])
def test_settings_may_only_narrow_on_the_installed_grid(change, word):
    doc = copy.deepcopy(BASE)
    doc["settings"]["schema"][0].update(change)
    problems = trust.check_update(BASE, doc)
    assert problems and word in problems[0]


def test_controls_only_as_a_subset_and_enum_options_only_fewer():
    doc = _with(controls=["pause", "run_now"])
    installed = _with(controls=["pause"])
    assert "run_now" in trust.check_update(installed, doc)[0]
    doc = copy.deepcopy(BASE)
    doc["settings"]["schema"][1]["options"] = ["fast", "slow", "reckless"]
    assert "reckless" in trust.check_update(BASE, doc)[0]
    doc = copy.deepcopy(BASE)
    doc["settings"]["schema"].append({"key": "new", "type": "boolean"})
    assert "may not add" in trust.check_update(BASE, doc)[0]


def test_a_revision_nested_too_deep_is_refused_with_a_sentence(tmp_path, wire):
    rt = _installed(tmp_path, wire.url)
    raw = b"[" * 20000 + b"]" * 20000
    body = (b'{"success":true,"data":{"revision":{"id":3,"content":%s,"checksum":"sha256:%s"}}}'
            % (raw, hashlib.sha256(raw).hexdigest().encode()))
    wire.route("GET", f"{API}/config/revisions/3", body=body, status=200)
    with pytest.raises(CommandError, match="nested deeper than 64 levels"):
        run(rt, "apply_config_revision", {"revision_id": 3})


def test_a_transient_failure_is_recorded_as_an_outcome_too(tmp_path, monkeypatch):
    """Only a CommandError was recorded: a plane outage or a timeout left no outcome."""
    from caldera.agents import outcomes, revisions
    from caldera.errors import Retryable

    rt = _installed(tmp_path)

    def down(*args, **kwargs):
        raise Retryable("the plane is down (503)")

    monkeypatch.setattr(revisions, "fetch", down)
    with pytest.raises(Retryable):
        revisions.apply_config_revision(ctx(rt, "apply_config_revision"), {"revision_id": 7})
    last = outcomes.health(rt.state)["config_revisions"]["last"]
    assert last["revision_id"] == 7 and last["outcome"] == "failed" and "503" in last["reason"]


def test_a_revision_id_that_is_no_number_goes_into_state_json_bounded(tmp_path):
    from caldera.agents import outcomes, revisions

    rt = _installed(tmp_path)  # the schema refuses it in a command; a heartbeat's hint is no command
    with pytest.raises(CommandError):
        revisions.apply_config_revision(ctx(rt, "apply_config_revision"), {"revision_id": "x" * 1_000_000})
    last = outcomes.health(rt.state)["config_revisions"]["last"]
    assert last["revision_id"] == "x" * 40 and last["outcome"] == "failed"
