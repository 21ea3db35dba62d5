"""The adversarial adapters: each case ends in the behaviour SPEC section 7 names."""
import json
import os
import time

import pytest
from adapter_helpers import calls, make_agent, workdir

from caldera.agents.adapter import invoke, verbs
from caldera.agents.adapter.answer import DONE, FAILED, REFUSED, UNSUPPORTED
from caldera.agents.manifest import load_manifest


def _manifest(tmp_path, adapter, **kw):
    paths = make_agent(tmp_path, adapter, **kw)
    return paths, load_manifest(paths.manifest_path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ")[1][0] != "Z"


def test_hanging_adapter_is_killed_with_its_group(tmp_path):
    paths, manifest = _manifest(tmp_path, "hang.py", timeout=1)
    answer = invoke.call(manifest, "status")
    assert answer.kind == FAILED
    assert "timed out" in answer.reason
    child = int((workdir(paths) / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the adapter's child outlived the call"


def test_hanging_pause_is_a_failed_command_sentence(tmp_path):
    _, manifest = _manifest(tmp_path, "hang.py", timeout=1)
    answer = verbs.control(manifest, "pause")
    assert not answer.ok
    assert answer.message.startswith("The agent's adapter failed: pause: timed out")


def test_flood_past_the_cap_fails(tmp_path):
    _, manifest = _manifest(tmp_path, "flood.py")
    answer = invoke.call(manifest, "status")
    assert answer.kind == FAILED
    assert "size limit" in answer.reason
    assert len(answer.stdout) <= invoke.VERBS["status"].stdout_cap


def test_flood_in_log_keeps_only_the_tail(tmp_path):
    _, manifest = _manifest(tmp_path, "flood.py")
    answer = invoke.call(manifest, "log", ("big.log",))
    assert answer.kind == DONE
    assert answer.truncated
    assert len(answer.text) == 512 * 1024


@pytest.mark.parametrize("verb", ["status", "settings get", "log --list"])
def test_two_json_objects_fail(tmp_path, verb):
    _, manifest = _manifest(tmp_path, "two_json.py")
    answer = invoke.call(manifest, verb)
    assert answer.kind == FAILED
    assert "more than one JSON object" in answer.reason


@pytest.mark.parametrize("verb", ["status", "settings get", "log --list"])
def test_text_before_the_json_fails(tmp_path, verb):
    _, manifest = _manifest(tmp_path, "text_before.py")
    answer = invoke.call(manifest, verb)
    assert answer.kind == FAILED
    assert "text before the JSON object" in answer.reason


def test_two_objects_from_pause_fail_too(tmp_path):
    _, manifest = _manifest(tmp_path, "two_json.py")
    answer = verbs.control(manifest, "pause")
    assert not answer.ok and "more than one JSON object" in answer.message


def test_environment_is_exactly_the_spec_one(tmp_path, monkeypatch):
    paths, manifest = _manifest(tmp_path, "env_echo.py")
    secret = "s3cret-value-from-secrets-env"
    monkeypatch.setenv("CALDERA_TOKEN", "agt_boot_abcdefghijkl")
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    monkeypatch.setenv("TZ", "Europe/Berlin")
    answer = invoke.call(manifest, "status")
    assert answer.kind == DONE
    seen = json.loads((workdir(paths) / "env.json").read_text())
    env = seen["env"]
    assert set(env) == {"PATH", "HOME", "LANG", "TZ", "CALDERA_AGENT", "CALDERA_VERB"}
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["LANG"] == "C.UTF-8" and env["TZ"] == "Europe/Berlin"
    assert env["CALDERA_AGENT"] == "test-agent" and env["CALDERA_VERB"] == "status"
    assert seen["cwd"] == str(workdir(paths))
    dumped = json.dumps(seen)
    assert "agt_boot_abcdefghijkl" not in dumped and secret not in dumped and "/nowhere" not in dumped


def test_tz_is_left_out_when_unset(tmp_path, monkeypatch):
    paths, manifest = _manifest(tmp_path, "env_echo.py")
    monkeypatch.delenv("TZ", raising=False)
    invoke.call(manifest, "status")
    env = json.loads((workdir(paths) / "env.json").read_text())["env"]
    assert "TZ" not in env


def test_exit_codes(tmp_path):
    paths, manifest = _manifest(tmp_path, "recorder.py")
    assert invoke.call(manifest, "pause").kind == DONE
    refused = invoke.call(manifest, "log", ("run-x.log",))
    assert refused.kind == REFUSED and refused.message == "There is no such log."
    unknown = invoke.call(manifest, "x", verb=invoke.Verb(("frobnicate",), 5, 1024, "answer"))
    assert unknown.kind == UNSUPPORTED
    assert calls(paths)[-1] == ["frobnicate"]


def test_other_exit_status_and_signal_fail(tmp_path):
    paths = make_agent(tmp_path, "recorder.py")
    script = workdir(paths) / "recorder.py"
    script.write_text("import os, signal, sys\n"
                      "if sys.argv[1] == 'pause': sys.exit(3)\n"
                      "os.kill(os.getpid(), signal.SIGSEGV)\n")
    manifest = load_manifest(paths.manifest_path)
    assert invoke.call(manifest, "pause").reason == "pause: exited with status 3"
    assert "signal" in invoke.call(manifest, "resume").reason


def test_settings_set_refused_writes_nothing(tmp_path):
    paths, manifest = _manifest(tmp_path, "set_refuse.py")
    answer = verbs.settings_set(manifest, {"max_7d": 0.5})
    assert answer.kind == REFUSED
    assert answer.message == "Nothing changed: the agent is mid-run; try again later"
    assert not (workdir(paths) / "settings.json").exists()
    assert calls(paths)[-1] == ["settings", "set", '{"max_7d":0.5}']


def test_missing_workdir_is_a_failure_not_a_crash(tmp_path):
    paths, manifest = _manifest(tmp_path, "recorder.py")
    (workdir(paths) / "recorder.py").unlink()
    workdir(paths).rmdir()
    answer = verbs.control(manifest, "pause")
    assert not answer.ok and "does not exist" in answer.message
