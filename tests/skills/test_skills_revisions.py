"""apply_config_revision (checksum over the raw content bytes, store, apply, report)
and reload_config."""
import hashlib
import json

import pytest
from fault_helpers import API
from skills_helpers import FakeRuntime, run

from caldera.agents import revisions
from caldera.errors import CommandError

# Go's json.Marshal: keys sorted, <>& escaped. Python's json.dumps does not reproduce these bytes.
CONTENT = (b'{"mode":"bundle","payloads":[{"count":1,"env":"CLAWMANAGER_OPENCLAW_SKILLS_JSON"}],'
           b'"resources":[{"id":4,"key":"a\\u003cb\\u0026c","name":"x","type":"skill","version":"1"}],'
           b'"schemaVersion":1}')


def envelope(content: bytes, checksum: str | None = None, rev_id: int = 9) -> bytes:
    checksum = checksum or "sha256:" + hashlib.sha256(content).hexdigest()
    return (b'{"success":true,"message":"ok","data":{"revision":{"id":%d,"instance_id":7,"revision_no":3,'
            b'"content":%s,"checksum":"%s","status":"published"}}}' % (rev_id, content, checksum.encode()))


class Answer:
    def __init__(self, ok, message=None):
        self.ok, self.message, self.reason = ok, message, None


class Driver:
    def __init__(self, ok=True):
        self.calls, self.ok = [], ok

    def settings_set(self, values, cancel=None, deadline=None):
        self.calls.append(values)
        return Answer(self.ok, "fine" if self.ok else "Threshold out of range")


def test_checksum_is_over_raw_bytes_not_reserialised():
    assert json.dumps(json.loads(CONTENT), separators=(",", ":"), sort_keys=True).encode() != CONTENT
    raw = envelope(CONTENT)
    assert revisions.value_span(raw, ("data", "revision", "content")) == CONTENT


def test_apply_stores_and_records(tmp_path, wire):
    rt = FakeRuntime(tmp_path, base_url=wire.url)
    wire.route("GET", f"{API}/config/revisions/9", body=envelope(CONTENT), status=200)
    result = run(rt, "apply_config_revision", {"revision_id": 9, "snapshot_id": 2})
    assert result["current_config_revision_id"] == 9 and rt.state.get("current_config_revision_id") == 9
    assert result["bootstrap_manifest"] == {"mode": "bundle", "resources": 1, "recorded": True}
    stored = rt.paths.state_dir / "config-revisions"
    assert (stored / "9.content.json").read_bytes() == CONTENT
    assert json.loads((stored / "9.json").read_text())["revision_no"] == 3
    assert rt.reports == 1


def test_checksum_mismatch_applies_nothing(tmp_path, wire):
    rt = FakeRuntime(tmp_path, base_url=wire.url)
    rt.state.set("current_config_revision_id", 4)
    wire.route("GET", f"{API}/config/revisions/9", body=envelope(CONTENT, "sha256:" + "0" * 64), status=200)
    with pytest.raises(CommandError, match="checksum mismatch"):
        run(rt, "apply_config_revision", {"revision_id": 9})
    wire.route("GET", f"{API}/config/revisions/10", status=404, body=b"")
    with pytest.raises(CommandError, match="revision 10 not found"):
        run(rt, "apply_config_revision", {"revision_id": 10})
    assert rt.state.get("current_config_revision_id") == 4
    assert not (rt.paths.state_dir / "config-revisions").exists()


def test_settings_go_through_the_adapter(tmp_path, wire):
    content = b'{"settings":{"threshold":0.5}}'
    rt = FakeRuntime(tmp_path, base_url=wire.url, driver=Driver())
    wire.route("GET", f"{API}/config/revisions/9", body=envelope(content), status=200)
    result = run(rt, "apply_config_revision", {"revision_id": "9"})
    assert rt.driver.calls == [{"threshold": 0.5}] and result["settings"]["keys"] == ["threshold"]
    rt.driver = Driver(ok=False)
    wire.route("GET", f"{API}/config/revisions/11", body=envelope(content, rev_id=11), status=200)
    with pytest.raises(CommandError, match="Threshold out of range"):
        run(rt, "apply_config_revision", {"revision_id": 11})
    assert rt.state.get("current_config_revision_id") == 9


MANIFEST = "name: demo\nversion: {v}\nruntime:\n  type: adapter\n  command: [python3, adapter.py]\n  workdir: .\n"


def test_manifest_goes_through_the_blueprint_update(tmp_path, wire):
    rt = FakeRuntime(tmp_path, base_url=wire.url)
    rt.paths.manifest_path.write_text(MANIFEST.format(v="1.0.0"))
    content = json.dumps({"manifest": MANIFEST.format(v="1.1.0")}, separators=(",", ":")).encode()
    wire.route("GET", f"{API}/config/revisions/9", body=envelope(content), status=200)
    result = run(rt, "apply_config_revision", {"revision_id": 9})
    assert result["manifest"]["applied"] is True and result["manifest"]["version"] == "1.1.0"
    # Stored in the state dir over the installed manifest; /etc is never written (read-only there).
    assert "1.0.0" in rt.paths.manifest_path.read_text()
    assert sorted(p.name for p in rt.paths.config_dir.iterdir()) == ["caldera.agent.yaml"]
    from caldera.agents.updates import load_effective

    effective = load_effective(rt.paths)
    assert effective.version == "1.1.0" and effective.update["revision_id"] == 9


def test_reload_config_keeps_the_connection(tmp_path, caldera_env):
    from caldera.config import load_settings

    rt = FakeRuntime(tmp_path)
    rt.paths.agent_env.write_text("CALDERA_BASE_URL=http://127.0.0.1:9\nCALDERA_LOG_LEVEL=info\n")
    rt.settings = load_settings(rt.paths, environ={})
    rt.paths.agent_env.write_text("CALDERA_BASE_URL=http://127.0.0.1:8\nCALDERA_LOG_LEVEL=debug\n")
    rt.paths.manifest_path.write_text(MANIFEST.format(v="2.0.0"))
    result = run(rt, "reload_config", {})
    assert rt.settings.log_level == "debug" and rt.settings.base_url == "http://127.0.0.1:9"
    assert "CALDERA_LOG_LEVEL" in result["changed_keys"]
    assert any(n.startswith("base_url") for n in result["not_applied"])
    assert result["manifest"]["version"] == "2.0.0"


def test_process_told_keys_are_checked_before_anything_is_applied(tmp_path, wire):
    """A revision whose `mcp` tries to change a command entry is refused whole: its settings
    are not applied either, and the current revision id stays (agents/process/told.py)."""
    driver = Driver()
    rt = FakeRuntime(tmp_path, base_url=wire.url, driver=driver)
    rt.state.set("current_config_revision_id", 4)
    content = b'{"mcp":{"files":{"command":["sh","-c","x"]}},"settings":{"t":1}}'
    wire.route("GET", f"{API}/config/revisions/9", body=envelope(content), status=200)
    with pytest.raises(CommandError, match="refused as a whole, nothing applied: mcp.files.command"):
        run(rt, "apply_config_revision", {"revision_id": 9})
    assert driver.calls == [] and rt.state.get("current_config_revision_id") == 4


class ToldDriver(Driver):
    """A process driver's two told methods (agents/process/told.py is tested with a real agent)."""

    def __init__(self, problems):
        super().__init__()
        self.problems, self.applied = problems, []

    def check_told(self, content):
        return list(self.problems)

    def apply_told(self, content):
        self.applied.append(content)
        return {"told": {"applied": sorted(k for k in ("instructions", "mcp") if k in content), "agent_told": True}}


def test_a_process_agent_is_told_instructions_after_the_checks(tmp_path, wire):
    driver = ToldDriver([])
    rt = FakeRuntime(tmp_path, base_url=wire.url, driver=driver)
    content = b'{"instructions":"Be brief.","settings":{"t":1}}'
    wire.route("GET", f"{API}/config/revisions/9", body=envelope(content), status=200)
    result = run(rt, "apply_config_revision", {"revision_id": 9})
    assert result["told"] == {"applied": ["instructions"], "agent_told": True}
    assert driver.calls == [{"t": 1}] and rt.state.get("current_config_revision_id") == 9


def test_a_process_agent_refusing_told_keys_refuses_the_whole_revision(tmp_path, wire):
    driver = ToldDriver(["instructions: the installed manifest declares no instructions file"])
    rt = FakeRuntime(tmp_path, base_url=wire.url, driver=driver)
    content = b'{"instructions":"x","settings":{"t":1}}'
    wire.route("GET", f"{API}/config/revisions/9", body=envelope(content), status=200)
    with pytest.raises(CommandError, match="nothing applied: instructions: the installed manifest declares no"):
        run(rt, "apply_config_revision", {"revision_id": 9})
    assert driver.calls == [] and driver.applied == []
    assert not (rt.paths.state_dir / "config-revisions" / "9.content.json").exists()  # not even stored
