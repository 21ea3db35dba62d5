"""The local verbs through `caldera.cli.main`, and what they import."""
import json
import subprocess
import sys

import pytest
from adapter_helpers import REPO, calls, copy_example, make_agent, workdir

from caldera.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _flags(paths):
    return ["--manifest", str(paths.manifest_path), "--state-dir", str(paths.state_dir)]


@pytest.fixture
def agent(tmp_path, caldera_env):
    return make_agent(tmp_path, "recorder.py")


def test_pause_human_and_json(agent, capsys):
    assert _run(capsys, "pause", *_flags(agent)) == (0, "Paused.\n", "")
    code, out, _ = _run(capsys, "pause", "--json", *_flags(agent))
    assert code == 0 and json.loads(out) == {"ok": True, "message": "Paused.", "held": []}


def test_resume_appends_held_items_not_in_the_message(agent, capsys):
    code, out, _ = _run(capsys, "resume", "--json", *_flags(agent))
    body = json.loads(out)
    assert code == 0
    assert body["message"] == ("Pause lifted. Alex is working in a session, so no run starts. "
                               "Held: weekly limit reached.")
    assert body["held"] == ["Alex is working in a session", "weekly limit reached"]


def test_run_now_exit_0_when_held_and_1_when_nothing_runs(agent, capsys):
    code, out, _ = _run(capsys, "run-now", *_flags(agent))
    assert code == 0 and out == "Requested, but held. Held: paused.\n"
    (workdir(agent) / "nothing-to-run").write_text("")
    code, out, err = _run(capsys, "run-now", *_flags(agent))
    assert (code, out, err) == (1, "", "Nothing to run.\n")


def test_settings_get_and_set(agent, capsys):
    code, out, _ = _run(capsys, "settings", "get", "--json", *_flags(agent))
    assert code == 0 and json.loads(out)["schema"][0]["max"] == 0.95
    code, _, err = _run(capsys, "settings", "set", "max_7d=97%", *_flags(agent))
    assert code == 1 and err == "Nothing changed: max_7d: 0.97 is above the maximum 0.95\n"
    assert not [c for c in calls(agent) if c[:2] == ["settings", "set"]]
    code, out, _ = _run(capsys, "settings", *_flags(agent), "set", "--json", '{"max_7d": 0.9}')
    assert (code, out) == (0, "Saved.\n")
    code, out, _ = _run(capsys, "settings", "set", "max_7d=0.5", "--json", *_flags(agent))
    assert code == 0 and json.loads(out)["ok"] is True


def test_settings_set_usage_errors_exit_2(agent, capsys):
    assert _run(capsys, "settings", "set", *_flags(agent))[0] == 2
    assert _run(capsys, "settings", "set", "nope=1", *_flags(agent))[0] == 2


def test_log_list_and_get(agent, capsys):
    assert _run(capsys, "log", *_flags(agent)) == (0, "run-20261003-124101.log\n", "")
    assert _run(capsys, "log", "run-20261003-124101.log", *_flags(agent)) == (0, "line\n" * 3, "")
    code, out, err = _run(capsys, "log", "../../etc/passwd", *_flags(agent))
    assert code == 1 and "not a path" in err
    assert _run(capsys, "log", "run-1.log", *_flags(agent))[2] == (
        f"There is no such log. Asked for run-1.log; `caldera log {' '.join(_flags(agent))}` lists the agent's logs.\n")


def test_config_error_exits_2(tmp_path, caldera_env, capsys):
    bad = tmp_path / "caldera.agent.yaml"
    bad.write_text("name: x\nruntime: {type: adapter, command: [a]}\nsecrets: [t]\n")
    code, _, err = _run(capsys, "pause", "--manifest", str(bad), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "'secrets' is not allowed" in err


def test_secret_values_never_reach_the_output(tmp_path, caldera_env, capsys):
    paths = make_agent(tmp_path, "recorder.py")
    (paths.config_dir / "secrets.env").write_text("CALDERA_TOKEN=agt_boot_leakedtoken123\n")
    (paths.config_dir / "secrets.env").chmod(0o600)
    (workdir(paths) / "recorder.py").write_text(
        'import json; print(json.dumps({"message": "token agt_boot_leakedtoken123"}))\n')
    code, out, _ = _run(capsys, "pause", *_flags(paths))
    assert code == 0 and "leakedtoken123" not in out


def test_local_verbs_import_neither_requests_nor_jsonschema_nor_yaml_when_warm(tmp_path, caldera_env):
    manifest = copy_example(tmp_path)
    state = tmp_path / "state"
    probe = ("import sys; from caldera.cli import main; code = main(sys.argv[1:]);"
             "print('HEAVY', sorted(m for m in ('requests', 'jsonschema', 'yaml') if m in sys.modules), code)")
    args = ["--manifest", str(manifest), "--state-dir", str(state)]
    for verb in (["pause"], ["pause"], ["resume"], ["run-now"], ["settings", "get"],
                 ["settings", "set", "max_7d=0.5"], ["log"]):
        out = subprocess.run([sys.executable, "-c", probe, *verb, *args], capture_output=True, text=True,
                             cwd=REPO, check=True).stdout
        heavy = out.strip().splitlines()[-1]
        assert heavy.endswith(" 0"), out
        # The first call parses the YAML once and fills the cache; none imports the rest.
        assert "'requests'" not in heavy and "'jsonschema'" not in heavy, heavy
    warm = subprocess.run([sys.executable, "-c", probe, "pause", *args], capture_output=True, text=True,
                          cwd=REPO, check=True).stdout.strip().splitlines()[-1]
    assert warm == "HEAVY [] 0"
