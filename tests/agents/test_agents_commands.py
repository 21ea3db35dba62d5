"""The control-plane handlers of adapter mode, with the real driver and a small runtime double."""
import concurrent.futures as cf

import pytest
from adapter_helpers import calls, make_agent
from core_helpers import command_context, replaced

from caldera.agents.adapter import commands
from caldera.agents.adapter.driver import open_adapter_driver
from caldera.agents.driver import AgentCall
from caldera.agents.manifest import load_manifest
from caldera.daemon.wakeups import Wakeups
from caldera.errors import CommandError
from caldera.redact import Redactor


@pytest.fixture
def pool():
    executor = cf.ThreadPoolExecutor(max_workers=2)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def _ctx(tmp_path, pool, extra=None, kind="pause", wake=None):
    paths = make_agent(tmp_path, "recorder.py", **({"extra": extra} if extra is not None else {}))
    driver = open_adapter_driver(paths, load_manifest(paths.manifest_path), pool=pool, redactor=Redactor())
    wake = wake or Wakeups()
    return paths, command_context(AgentCall, kind, driver=driver, report_now=wake.report_now)


def test_pause_succeeds_and_reports_now(tmp_path, pool):
    wake = Wakeups()
    _, ctx = _ctx(tmp_path, pool, wake=wake)
    assert commands.pause(ctx, {}) == {"ok": True, "message": "Paused.", "held": []}
    assert wake.report.is_set()  # the state changed: a report goes out now


def test_controls_named_by_the_manifest_limit_the_commands(tmp_path, pool):
    paths, ctx = _ctx(tmp_path, pool, extra="controls: [pause]\n")
    with pytest.raises(CommandError, match="run_now is not among this agent's controls"):
        commands.run_now(ctx, {})
    assert calls(paths) == []


def test_run_now_refused_fails_the_command_with_the_sentence(tmp_path, pool):
    paths, ctx = _ctx(tmp_path, pool)
    (paths.config_dir.parent / "work" / "nothing-to-run").write_text("")
    with pytest.raises(CommandError) as info:
        commands.run_now(ctx, {})
    assert str(info.value) == "Nothing to run."
    assert info.value.result == {"ok": False, "message": "Nothing to run.", "held": []}


def test_settings_set_and_get(tmp_path, pool):
    paths, ctx = _ctx(tmp_path, pool)
    with pytest.raises(CommandError, match="Nothing changed: max_7d: 0.97 is above the maximum 0.95"):
        commands.settings_set(ctx, {"values": {"max_7d": 0.97}})
    assert commands.settings_set(ctx, {"values": {"max_7d": 0.9}})["ok"]
    got = commands.settings_get(ctx, {})
    assert got["values"] == {"max_7d": 0.9} and got["schema"][0]["max"] == 0.95
    with pytest.raises(CommandError, match="needs values"):
        commands.settings_set(ctx, {})


def test_logs(tmp_path, pool):
    paths, ctx = _ctx(tmp_path, pool)
    assert commands.log_list(ctx, {})["logs"] == ["run-20261003-124101.log"]
    got = commands.log_get(ctx, {"name": "run-20261003-124101.log"})
    assert got["text"] == "line\n" * 3 and got["truncated"] is False
    before = len(calls(paths))
    with pytest.raises(CommandError, match="not a path"):
        commands.log_get(ctx, {"name": "../../etc/passwd"})
    with pytest.raises(CommandError, match="There is no such log."):
        commands.log_get(ctx, {"name": "run-1.log"})
    assert len(calls(paths)) == before + 1  # the path never reached the adapter


def test_process_only_and_no_driver(tmp_path, pool):
    from caldera.agents.process import commands as process_commands

    _, ctx = _ctx(tmp_path, pool, kind="restart_openclaw")
    with pytest.raises(CommandError, match="restart_openclaw acts only in process mode"):
        process_commands.restart_openclaw(ctx, {})
    ctx = replaced(ctx, driver=None)
    with pytest.raises(CommandError, match="no adapter"):
        commands.pause(ctx, {})


def test_payload_schemas_exist_and_hold():
    from caldera.protocol.schemas import SchemaError, validate

    for kind in ("pause", "resume", "run_now", "settings_get", "log_list", "start_openclaw",
                 "stop_openclaw", "restart_openclaw"):
        validate(f"commands/{kind}.schema.json", {})
    validate("commands/settings_set.schema.json", {"values": {"max_7d": 0.5}})
    validate("commands/log_get.schema.json", {"name": "run-1.log"})
    for kind, bad in (("settings_set", {}), ("settings_set", {"values": {}}), ("log_get", {"name": ""}),
                      ("log_get", {"name": "a" * 191})):
        with pytest.raises(SchemaError):
            validate(f"commands/{kind}.schema.json", bad)
