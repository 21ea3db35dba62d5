"""The daemon's driver: the report section, a slow status that never stalls other loops,
recovery on the next report, the health check, and the blueprint window."""
import concurrent.futures as cf
import threading
import time

import pytest
import yaml
from adapter_helpers import make_agent, workdir

from caldera.agents import updates, window
from caldera.agents.adapter.driver import adapter_status, open_adapter_driver
from caldera.agents.manifest import load_manifest
from caldera.agents.updates import load_effective
from caldera.errors import ConfigError
from caldera.redact import Redactor


@pytest.fixture
def pool():
    executor = cf.ThreadPoolExecutor(max_workers=4)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def _driver(paths, pool, redactor=None):
    return open_adapter_driver(paths, load_manifest(paths.manifest_path), pool=pool, redactor=redactor or Redactor())


def test_report_section_shape(tmp_path, pool):
    paths = make_agent(tmp_path, "recorder.py")
    section = _driver(paths, pool).report_section()
    assert section["runtime"] == {"openclaw_status": "running", "openclaw_pid": None,
                                  "openclaw_version": "0.1.0", "runtime_status": "running"}
    assert section["agent_status"] == {"state": {"level": "ok", "label": "Ready"}}  # "extra" dropped
    assert section["health"]["adapter"] == "ok" and section["health"]["agent"] == "ok"
    assert section["settings"]["schema"][0]["max"] == 0.95  # narrowed by the adapter's bounds
    assert section["settings"]["values"] == {"max_7d": 0.75}
    assert section["controls"] == ["pause", "resume", "run_now"]


def test_slow_status_does_not_stall_heartbeats_and_recovers(tmp_path, pool):
    paths = make_agent(tmp_path, "slow_status.py", timeout=1, extra="")
    driver = _driver(paths, pool)
    stop, beats = threading.Event(), []

    def heartbeat():  # stands in for the lead's heartbeat loop
        while not stop.is_set():
            beats.append(time.monotonic())
            stop.wait(0.05)

    beat_thread = threading.Thread(target=heartbeat)
    beat_thread.start()
    try:
        started = time.monotonic()
        section = driver.report_section()
        ended = time.monotonic()
    finally:
        stop.set()
        beat_thread.join()
    body = section["agent_status"]
    assert body["state"] == {"level": "bad", "label": "Adapter not answering"}
    assert body["health"][0]["name"] == "Adapter" and "timed out" in body["health"][0]["reason"]
    assert section["runtime"]["openclaw_status"] == "error" and section["health"]["adapter"] == "error"
    # Heartbeats kept coming while the status call hung (they never waited for it).
    during = [b for b in beats if started < b < ended]
    assert len(during) >= 3
    assert (workdir(paths) / "status-started").exists()
    # The next report works as soon as the adapter does.
    (workdir(paths) / "fast").write_text("")
    again = driver.report_section()
    assert again["agent_status"]["state"] == {"level": "ok", "label": "Ready"}
    assert again["health"]["adapter"] == "ok"


def test_report_waits_no_longer_than_the_status_bound_when_the_pool_is_busy(tmp_path):
    paths = make_agent(tmp_path, "recorder.py", timeout=1, extra="")
    busy = cf.ThreadPoolExecutor(max_workers=1)
    release = threading.Event()
    busy.submit(release.wait)  # every worker is taken: the status call can't even start
    try:
        section = _driver(paths, busy).report_section()
    finally:
        release.set()
        busy.shutdown(wait=True)
    assert section["agent_status"]["state"]["label"] == "Adapter not answering"
    assert "still running" in section["agent_status"]["detail"]


def test_schema_breach_in_status_counts_as_not_answering(tmp_path, pool):
    paths = make_agent(tmp_path, "recorder.py", extra="")
    (workdir(paths) / "recorder.py").write_text(
        'print(\'{"state": {"level": "great"}}\')\n')
    section = _driver(paths, pool).report_section()
    assert section["agent_status"]["state"]["label"] == "Adapter not answering"
    assert "level" in section["agent_status"]["detail"]


def test_report_is_redacted(tmp_path, pool):
    paths = make_agent(tmp_path, "recorder.py", extra="")
    (workdir(paths) / "recorder.py").write_text(
        'import json; print(json.dumps({"detail": "token is hunter2-secret-value"}))\n')
    section = _driver(paths, pool, Redactor(["hunter2-secret-value"])).report_section()
    assert "hunter2-secret-value" not in str(section)
    assert "[REDACTED]" in section["agent_status"]["detail"]


def test_health_check_entry(tmp_path, pool):
    extra = "health:\n  command: [sh, -c, 'echo disk full; exit 1']\n"
    paths = make_agent(tmp_path, "recorder.py", extra=extra)
    section = _driver(paths, pool).report_section()
    assert {"name": "Health check", "level": "bad", "reason": "exited with status 1: disk full"} \
        in section["health"]["entries"]


def test_adapter_status_for_caldera_status(tmp_path):
    paths = make_agent(tmp_path, "two_json.py", extra="")
    body = adapter_status(paths, load_manifest(paths.manifest_path))
    assert body["state"]["label"] == "Adapter not answering"
    assert "more than one JSON object" in body["health"][0]["reason"]


def test_process_mode_has_no_driver(tmp_path, pool):
    paths = make_agent(tmp_path, "recorder.py", extra="")
    paths.manifest_path.write_text(paths.manifest_path.read_text().replace("type: adapter", "type: process"))
    with pytest.raises(ConfigError, match="not adapter mode"):
        _driver(paths, pool)


# ---------------------------------------------------------------- the 30-minute window

def _new_manifest(paths, version):
    doc = yaml.safe_load(paths.manifest_path.read_text())
    doc["version"] = version
    return yaml.safe_dump(doc)


def test_update_then_three_bad_reports_roll_back(tmp_path, pool):
    paths = make_agent(tmp_path, "recorder.py", extra="")
    driver = _driver(paths, pool)
    result = window.apply_manifest_update(paths, _new_manifest(paths, "0.2.0"), now=1000.0)
    assert result["changed"] and result["previous_version"] == "0.1.0"
    driver.wall = lambda: 1010.0
    assert driver.report_section()["runtime"]["openclaw_version"] == "0.2.0"  # the driver picked it up
    assert load_effective(paths).version == "0.2.0"
    assert load_manifest(paths.manifest_path).version == "0.1.0"  # the installed file is never written
    # The adapter now answers bad: three reports in a row inside the window roll back.
    (workdir(paths) / "recorder.py").write_text(
        'import json; print(json.dumps({"state": {"level": "bad", "label": "Broken"}}))\n')
    for _ in range(3):
        section = driver.report_section()
    assert load_effective(paths).version == "0.1.0"
    assert driver.manifest.version == "0.1.0"
    entry = [e for e in section["health"]["entries"] if e["name"] == "Blueprint update"]
    assert entry and entry[0]["level"] == "bad" and "rolled back to 0.1.0" in entry[0]["reason"]


def test_a_good_report_resets_the_streak_and_the_window_closes(tmp_path):
    paths = make_agent(tmp_path, "recorder.py", extra="")
    window.apply_manifest_update(paths, _new_manifest(paths, "0.2.0"), now=0.0)
    for bad in (True, True, False, True, True):
        window.observe(paths, bad, now=10.0)
    assert window.current(paths)["status"] == "open"
    closed = window.observe(paths, True, now=window.WINDOW_SECONDS + 1.0)
    assert closed["status"] == "closed"
    assert not updates.previous_file(paths).exists()
    for _ in range(3):
        window.observe(paths, True, now=window.WINDOW_SECONDS + 2.0)
    assert load_effective(paths).version == "0.2.0"  # no rollback after the window


def test_a_bad_update_changes_nothing(tmp_path):
    paths = make_agent(tmp_path, "recorder.py", extra="")
    before = paths.manifest_path.read_bytes()
    for text in ("name: test-agent\nruntime: {type: adapter, command: [x]}\nsecrets: [a]\n",
                 "name: other\nruntime: {type: adapter, command: [x]}\n", "runtime: ["):
        with pytest.raises(ConfigError):
            window.apply_manifest_update(paths, text)
    assert paths.manifest_path.read_bytes() == before
    assert window.current(paths) is None


def _status_calls(paths) -> int:
    log = workdir(paths) / "calls.log"
    return sum(1 for line in log.read_text().splitlines() if line == '["status"]') if log.exists() else 0


def test_a_fresh_status_answer_is_reused_until_a_verb_or_its_age_drops_it(tmp_path, pool):
    from caldera.agents.adapter import driver as driver_mod

    paths = make_agent(tmp_path, "recorder.py")
    driver = _driver(paths, pool)
    now = [1000.0]
    driver.clock = lambda: now[0]
    driver.report_section()
    now[0] += driver_mod.STATUS_FRESH - 1
    driver.report_section()
    assert _status_calls(paths) == 1  # fresh: the periodic report did not spawn the adapter
    assert driver.pause().ok
    driver.report_section()
    assert _status_calls(paths) == 2  # a verb went through: the next report asks again
    now[0] += driver_mod.STATUS_FRESH
    driver.report_section()
    assert _status_calls(paths) == 3  # too old: asked again


def test_an_unanswered_status_is_never_reused(tmp_path, pool):
    paths = make_agent(tmp_path, "recorder.py", extra="")
    driver = _driver(paths, pool)
    (workdir(paths) / "recorder.py").write_text("import sys; sys.exit(3)\n")
    assert driver.report_section()["health"]["adapter"] == "error"
    (workdir(paths) / "recorder.py").write_text(
        'import json; print(json.dumps({"state": {"level": "ok", "label": "Back"}}))\n')
    assert driver.report_section()["health"]["adapter"] == "ok"  # asked again at once


def test_the_two_openers_name_the_state_file_alike():
    import inspect

    from caldera.agents.process.driver import open_process_driver

    adapter = inspect.signature(open_adapter_driver).parameters
    process = inspect.signature(open_process_driver).parameters
    assert {"state", "redactor"} <= adapter.keys() & process.keys()
    assert "store" not in process
