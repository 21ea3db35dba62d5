"""The 30-minute window: it rolls back only what the update made worse, restores exactly
the previous effective manifest and reports the previous revision id as current."""
import concurrent.futures as cf

import pytest
import yaml
from adapter_helpers import make_agent, setting, workdir

from caldera.agents import updates, window
from caldera.agents.adapter.driver import open_adapter_driver
from caldera.agents.manifest import load_manifest
from caldera.agents.updates import load_effective
from caldera.host.statefile import StateFile
from caldera.redact import Redactor

SETTINGS = """\
settings:
  schema:
    - { key: max_7d, label: Weekly limit, type: percent, min: 0.1, max: 0.95 }
"""


@pytest.fixture
def pool():
    executor = cf.ThreadPoolExecutor(max_workers=4)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def _agent(tmp_path, pool):
    paths = make_agent(tmp_path, "level_file.py", extra=SETTINGS)
    state = StateFile(tmp_path / "state.json")
    driver = open_adapter_driver(paths, load_manifest(paths.manifest_path), pool=pool, redactor=Redactor(),
                                 state=state)
    return paths, driver, state


def _narrowed(paths, version, high):
    doc = yaml.safe_load(paths.manifest_path.read_text())
    doc["version"] = version
    doc["settings"]["schema"][0]["max"] = high
    return yaml.safe_dump(doc)


def _level(paths, level):
    (workdir(paths) / "level").write_text(level)


def _update(paths, driver, state, rev, version, high):
    result = window.apply_manifest_update(paths, _narrowed(paths, version, high), revision_id=rev,
                                          previous_revision_id=state.get("current_config_revision_id"),
                                          level_before=driver.last_level)
    state.set("current_config_revision_id", rev)  # what apply_config_revision records
    return result


def test_an_agent_already_bad_keeps_a_narrowing_update(tmp_path, pool):
    paths, driver, state = _agent(tmp_path, pool)
    _level(paths, "bad")  # quota exhausted: bad for its own reasons, before any update
    driver.report_section()
    assert driver.last_level == "bad"
    _update(paths, driver, state, 8, "1.1", 0.9)
    for _ in range(5):
        section = driver.report_section()
    assert window.current(paths)["status"] == "open"
    assert setting(driver.manifest, "max_7d")["max"] == 0.9
    assert state.get("current_config_revision_id") == 8
    assert section["settings"]["schema"][0]["max"] == 0.9


def test_rollback_restores_the_previous_effective_manifest_and_revision(tmp_path, pool):
    paths, driver, state = _agent(tmp_path, pool)
    driver.report_section()
    _update(paths, driver, state, 7, "1.1", 0.9)       # a good update: it stays
    driver.report_section()
    window.observe(paths, False, now=10 ** 10)          # its window closes
    _update(paths, driver, state, 8, "1.2", 0.8)       # the next one makes the agent bad
    _level(paths, "bad")
    for _ in range(3):
        section = driver.report_section()
    record = window.current(paths)
    assert record["status"] == "rolled_back" and record["previous_revision_id"] == 7
    effective = load_effective(paths)
    assert effective.version == "1.1" and effective.update["revision_id"] == 7
    assert setting(effective, "max_7d")["max"] == 0.9    # exactly the previous effective manifest
    assert driver.manifest.version == "1.1"
    assert state.get("current_config_revision_id") == 7  # reported as current again
    entry = [e for e in section["health"]["entries"] if e["name"] == window.ENTRY_NAME][0]
    assert entry["level"] == "bad" and "revision 8" in entry["reason"] and "revision 7" in entry["reason"]


def test_a_rollback_never_widens_past_the_installed_bounds(tmp_path, pool):
    paths, driver, state = _agent(tmp_path, pool)
    driver.report_section()
    _update(paths, driver, state, 8, "1.1", 0.9)
    # The stored "previous" was tampered with to widen the bounds: the rollback still can't widen.
    prev = updates.read_record(updates.previous_file(paths))
    doc = yaml.safe_load(_narrowed(paths, "evil", 1.0))
    updates.write(paths, dict(prev, doc=doc), file=updates.previous_file(paths))
    _level(paths, "bad")
    for _ in range(3):
        driver.report_section()
    assert window.current(paths)["status"] == "rolled_back"
    assert setting(load_effective(paths), "max_7d")["max"] == 0.95   # the installed bound, not 1.0


def test_the_update_survives_a_restart(tmp_path, pool):
    paths, driver, state = _agent(tmp_path, pool)
    driver.report_section()
    _update(paths, driver, state, 8, "1.1", 0.9)
    fresh = open_adapter_driver(paths, load_manifest(paths.manifest_path), pool=pool, redactor=Redactor(),
                                state=StateFile(tmp_path / "state.json"))
    assert fresh.manifest.version == "1.1" and fresh.manifest.update["revision_id"] == 8
    assert load_manifest(paths.manifest_path).version == "0.1.0"


def test_a_rolled_back_revision_is_not_applied_again(tmp_path, pool):
    # The control plane keeps naming it as desired: re-applying it would loop.
    from caldera.errors import ConfigError

    paths, driver, state = _agent(tmp_path, pool)
    driver.report_section()
    _update(paths, driver, state, 8, "1.1", 0.9)
    _level(paths, "bad")
    for _ in range(3):
        driver.report_section()
    assert window.current(paths)["status"] == "rolled_back"
    with pytest.raises(ConfigError, match="was rolled back"):
        _update(paths, driver, state, 8, "1.1", 0.9)
    _level(paths, "ok")
    _update(paths, driver, state, 9, "1.2", 0.9)  # a new revision is a new decision
    assert load_effective(paths).update["revision_id"] == 9
