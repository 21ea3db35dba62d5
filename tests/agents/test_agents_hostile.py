"""Hostile and careless adapters (fixtures in ./adapters/): every answer is parsed with a
depth limit and a size cap, text that is not Unicode is handled at the boundary, and
the settings grid and the 8 KiB cap are measured the way the contract means them."""
import concurrent.futures as cf
import json
import subprocess
import sys

import pytest
from adapter_helpers import make_agent, workdir

from caldera.agents import settings
from caldera.agents.adapter import commands, verbs
from caldera.agents.adapter.driver import adapter_status, open_adapter_driver
from caldera.agents.manifest import load_manifest
from caldera.errors import CommandError
from caldera.redact import Redactor

NOTE_BLOCK = """\
settings:
  schema:
    - { key: max_7d, label: Weekly limit, type: percent, min: 0.1, max: 0.95, step: 0.05 }
    - { key: note, label: Note, type: string, max_length: 8192 }
"""


@pytest.fixture
def pool():
    executor = cf.ThreadPoolExecutor(max_workers=4)
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def cli(paths, *argv):
    return subprocess.run([sys.executable, "-m", "caldera.cli", *argv, "--manifest", str(paths.manifest_path),
                           "--state-dir", str(paths.state_dir)], capture_output=True, timeout=60)


# ---------------------------------------------------------------- nested deeper than 64 levels

def test_deep_output_is_one_failed_status_call_never_a_traceback(tmp_path, pool):
    paths = make_agent(tmp_path, "deep.py", extra="")
    body = adapter_status(paths, load_manifest(paths.manifest_path))
    assert body["state"]["label"] == "Adapter not answering"
    assert "output nested deeper than 64 levels" in body["detail"]
    driver = open_adapter_driver(paths, load_manifest(paths.manifest_path), pool=pool, redactor=Redactor())
    first = driver.report_section()
    assert first["agent_status"]["state"]["label"] == "Adapter not answering"
    assert first["health"]["adapter"] == "error"
    # The next report works as soon as the adapter does.
    (workdir(paths) / "fixed").write_text("")
    assert driver.report_section()["agent_status"]["state"] == {"level": "ok", "label": "Ready"}


def test_deep_output_in_the_cli_is_a_sentence(tmp_path):
    paths = make_agent(tmp_path, "deep.py", extra="")
    done = cli(paths, "status")
    assert done.returncode == 0 and b"Traceback" not in done.stderr
    assert b"Adapter not answering" in done.stdout and b"nested deeper than 64 levels" in done.stdout
    done = cli(paths, "pause")
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert b"The agent's adapter failed: pause: output nested deeper than 64 levels" in done.stderr
    done = cli(paths, "log")
    assert done.returncode == 1 and b"nested deeper than 64 levels" in done.stderr


# ---------------------------------------------------------------- text that is not Unicode

def test_lone_surrogates_from_an_adapter_never_break_output(tmp_path):
    paths = make_agent(tmp_path, "surrogates.py", extra=NOTE_BLOCK.replace(", max_length: 8192", ""))
    for argv in (("status",), ("status", "--json"), ("pause",), ("pause", "--json"), ("settings", "get"),
                 ("settings", "get", "--json"), ("log",)):
        done = cli(paths, *argv)
        assert b"Traceback" not in done.stderr, (argv, done.stderr)
        assert done.returncode == 0, (argv, done.stderr)
    assert "Odd \ufffd label" in cli(paths, "status").stdout.decode()
    listed = cli(paths, "log").stdout.decode().split()
    assert listed == ["good.log"]  # a name that is not text is not offered


def test_a_log_name_that_is_not_text_is_refused_with_a_sentence(tmp_path, pool):
    paths = make_agent(tmp_path, "surrogates.py", extra="")
    done = subprocess.run([sys.executable.encode(), b"-m", b"caldera.cli", b"log", b"bad\xff.log", b"--manifest",
                           bytes(paths.manifest_path), b"--state-dir", bytes(paths.state_dir)],
                          capture_output=True, timeout=60)
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert b"a log name must be valid text" in done.stderr
    # The daemon's door: the command is refused with the sentence, not "internal error".
    driver = open_adapter_driver(paths, load_manifest(paths.manifest_path), pool=pool, redactor=Redactor())
    ctx = type("Ctx", (), {"driver": driver, "cancel": None, "deadline": None, "command_type": "log_get"})()
    with pytest.raises(CommandError, match="a log name must be valid text"):
        commands.log_get(ctx, {"name": "bad\ud800.log"})
    assert not (workdir(paths) / "argv.log").exists()  # the adapter was never called


def test_a_settings_value_that_is_not_text_passes_json_escaped(tmp_path, pool):
    paths = make_agent(tmp_path, "surrogates.py", extra=NOTE_BLOCK)
    done = cli(paths, "settings", "set", "--json", '{"note": "a\\ud800b"}')
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    sent = [json.loads(line) for line in (workdir(paths) / "argv.log").read_text().splitlines()]
    arg = bytes.fromhex([a for a in sent if a[:2] == [b"settings".hex(), b"set".hex()]][0][2])
    assert arg == b'{"note":"a\\ud800b"}' and json.loads(arg) == {"note": "a\ud800b"}
    # A key that is not text names nothing: refused with a sentence, no adapter call.
    answer = verbs.settings_set(load_manifest(paths.manifest_path), {"no\ud800te": "x"})
    assert answer.kind == "refused" and "key must be valid text" in answer.message
    # The daemon's door: JSON-escaped too, no "internal error".
    driver = open_adapter_driver(paths, load_manifest(paths.manifest_path), pool=pool, redactor=Redactor())
    assert driver.settings_set({"note": "\udcff"}).ok


# ---------------------------------------------------------------- the grid and the 8 KiB cap

def test_the_step_grid_stays_anchored_at_the_manifests_min(tmp_path):
    paths = make_agent(tmp_path, "narrowing.py", extra=NOTE_BLOCK)
    manifest = load_manifest(paths.manifest_path)
    answer = verbs.settings_set(manifest, {"max_7d": 0.2})  # adapter narrowed min to 0.12
    assert answer.ok, answer.message
    refused = verbs.settings_set(manifest, {"max_7d": 0.1})  # on the grid, below the narrowed min
    assert refused.kind == "refused" and "below the minimum 0.12" in refused.message
    refused = verbs.settings_set(manifest, {"max_7d": 0.22})
    assert refused.kind == "refused" and "not a multiple of the step 0.05" in refused.message


def test_the_8_kib_cap_counts_the_utf8_bytes_passed(tmp_path):
    paths = make_agent(tmp_path, "narrowing.py", extra=NOTE_BLOCK)
    manifest = load_manifest(paths.manifest_path)
    answer = verbs.settings_set(manifest, {"note": "€" * 2000})  # 6,000 bytes on the wire
    assert answer.ok, answer.message
    passed = (workdir(paths) / "set.log").read_bytes().splitlines()[-1]
    assert passed == ('{"note":"' + "€" * 2000 + '"}').encode() and len(passed) < settings.SET_ARG_MAX_BYTES
    refused = verbs.settings_set(manifest, {"note": "€" * 2800})  # 8,411 bytes
    assert refused.kind == "refused" and "8411 bytes" in refused.message
