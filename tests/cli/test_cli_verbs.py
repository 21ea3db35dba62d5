"""The local verbs through `caldera.cli.main`, and what they import."""
import json
import subprocess
import sys
import threading
import time

import pytest
from adapter_helpers import REPO, calls, copy_example, make_agent, workdir

from caldera.cli import main, verbs


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


# ---- `caldera log --run RUN_ID [--follow]` and the run logs in `--list` (issue 40) ----------------

SECRET = "agt_boot_leakedtoken123"


@pytest.fixture
def run_agent(tmp_path, caldera_env):
    paths = make_agent(tmp_path, "recorder.py")
    (paths.config_dir / "secrets.env").write_text(f"CALDERA_TOKEN={SECRET}\n")
    (paths.config_dir / "secrets.env").chmod(0o600)
    (paths.state_dir / "logs").mkdir(parents=True, exist_ok=True)
    return paths


def _event(seq, type_, **data):
    return "2026-12-05T09:00:00.000Z event " + json.dumps(
        {"run_id": "r1", "seq": seq, "ts": "2026-12-05T09:00:00.000Z", "type": type_, "data": data},
        separators=(",", ":")) + "\n"


def test_a_run_log_is_printed_redacted_and_listed(run_agent, capsys):
    log = run_agent.state_dir / "logs" / "run-r1.log"
    log.write_text("2026-12-05T09:00:00.000Z note run r1 requested: backend codex\n"
                   f"2026-12-05T09:00:01.000Z s2c the key is {SECRET}\n"
                   + _event(1, "terminal_status", status="completed"))
    code, out, err = _run(capsys, "log", "--run", "r1", *_flags(run_agent))
    assert code == 0 and err == ""
    assert "run r1 requested" in out and SECRET not in out and '"terminal_status"' in out
    code, out, _ = _run(capsys, "log", *_flags(run_agent))
    assert code == 0 and out.startswith("run-20261003-124101.log\n")  # the adapter's names first, as before
    assert "--run RUN_ID" in out and out.rstrip().endswith("r1")
    code, out, _ = _run(capsys, "log", "--list", "--json", *_flags(run_agent))
    assert json.loads(out)["runs"] == ["r1"] and json.loads(out)["logs"] == ["run-20261003-124101.log"]


def test_a_missing_run_log_and_a_bad_run_id_are_said(run_agent, capsys):
    code, _, err = _run(capsys, "log", "--run", "nope", *_flags(run_agent))
    assert code == 1 and "There is no run log for nope" in err and "--list" in err
    code, _, err = _run(capsys, "log", "--run", "../x", *_flags(run_agent))
    assert code == 2 and "run_id" in err


def test_a_long_run_log_prints_its_tail(run_agent, capsys, monkeypatch):
    monkeypatch.setattr(verbs, "RUN_TAIL_BYTES", 1000)
    (run_agent.state_dir / "logs" / "run-r1.log").write_text("".join(f"2026 note line {n}\n" for n in range(500)))
    code, out, _ = _run(capsys, "log", "--run", "r1", *_flags(run_agent))
    assert code == 0 and out.startswith("(the first ") and "line 499\n" in out and "line 0\n" not in out
    assert all(line.startswith(("2026 note line", "(the first")) for line in out.splitlines())


def test_follow_prints_what_the_run_adds_and_ends_after_its_terminal_event(run_agent, capsys, monkeypatch):
    monkeypatch.setattr(verbs, "FOLLOW_POLL", 0.05)
    monkeypatch.setattr(verbs, "FOLLOW_QUIET_AFTER_END", 0.2)
    log = run_agent.state_dir / "logs" / "run-r1.log"
    log.write_text(_event(1, "assistant_message", text="first"))
    written = threading.Event()

    def grow():
        with open(log, "a") as fh:
            fh.write(_event(2, "tool_call", command="make", status="started"))
            fh.flush()
            fh.write(f"2026 s2c {SECRET} par")  # half a line: printed once whole
            fh.flush()
            threading.Event().wait(0.2)
            fh.write("tial\n" + _event(3, "terminal_status", status="completed"))
        written.set()

    threading.Timer(0.2, grow).start()
    code, out, _ = _run(capsys, "log", "--run", "r1", "--follow", *_flags(run_agent))
    assert code == 0 and written.is_set()
    assert [line.split(" ", 2)[1] for line in out.splitlines()] == ["event", "event", "s2c", "event"]
    assert out.count("par") == 1 and " partial\n" in out and SECRET not in out and out.rstrip().endswith("}}")


def test_follow_without_run_is_a_usage_error(run_agent, capsys):
    assert _run(capsys, "log", "--follow", *_flags(run_agent))[0] == 2


def test_a_run_log_and_the_log_names_reach_the_terminal_without_its_escapes(run_agent, capsys):
    escape = "\x1b]0;PWNED\x07\x1b[2K\rFAKE"
    logs = run_agent.state_dir / "logs"
    (logs / "run-r1.log").write_text(f"2026 s2c {escape}\n" + _event(1, "terminal_status", status="completed"))
    code, out, _ = _run(capsys, "log", "--run", "r1", *_flags(run_agent))
    assert code == 0 and "\x1b" not in out and "\\x1b]0;PWNED\\x07\\x1b[2K\\x0dFAKE" in out
    (logs / f"run-{escape}.log").write_text("x\n")
    code, out, _ = _run(capsys, "log", "--list", *_flags(run_agent))
    assert code == 0 and "\x1b" not in out and "\r" not in out and "\\x1b]0;PWNED" in out


@pytest.mark.parametrize("target", ["secret", "/dev/zero", "dir"])
def test_a_run_log_is_read_only_as_a_regular_file_not_through_a_link(run_agent, capsys, tmp_path, target):
    secret = tmp_path / "secret"
    secret.write_text("root:the shadow line\n")
    (tmp_path / "dir").mkdir()
    log = run_agent.state_dir / "logs" / "run-r1.log"
    if target == "dir":
        log.mkdir()
    else:
        log.symlink_to(tmp_path / target if target != "/dev/zero" else target)
    code, out, err = _run(capsys, "log", "--run", "r1", *_flags(run_agent))
    assert code == 1 and out == "" and "is not a regular file" in err and "shadow" not in err


def test_a_line_longer_than_the_cap_is_printed_in_pieces(run_agent, capsys, monkeypatch):
    monkeypatch.setattr(verbs, "RUN_LINE_MAX", 1000)
    (run_agent.state_dir / "logs" / "run-r1.log").write_text("2026 s2c " + "A" * 2500 + "\n2026 note end\n")
    code, out, _ = _run(capsys, "log", "--run", "r1", *_flags(run_agent))
    assert code == 0 and out.count("A") == 2500 and max(len(line) for line in out.splitlines()) <= 1000
    assert out.endswith("2026 note end\n")


def test_follow_stops_when_the_log_stays_quiet_without_an_end(run_agent, capsys, monkeypatch):
    monkeypatch.setattr(verbs, "FOLLOW_POLL", 0.05)
    monkeypatch.setattr(verbs, "FOLLOW_QUIET_MAX", 0.3)
    (run_agent.state_dir / "logs" / "run-r1.log").write_text(_event(1, "assistant_message", text="first"))
    started = time.monotonic()
    code, out, err = _run(capsys, "log", "--run", "r1", "--follow", *_flags(run_agent))
    assert code == 0 and "did not grow" in err and time.monotonic() - started < 5


def test_follow_stopped_by_a_signal_exits_130(run_agent, capsys, monkeypatch):
    import os
    import signal

    monkeypatch.setattr(verbs, "FOLLOW_POLL", 0.05)
    (run_agent.state_dir / "logs" / "run-r1.log").write_text(_event(1, "assistant_message", text="first"))
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    code, out, _ = _run(capsys, "log", "--run", "r1", "--follow", *_flags(run_agent))
    assert code == 130 and '"first"' in out


def test_a_run_id_with_a_final_newline_is_no_run_id(run_agent, capsys):
    from caldera.protocol import schemas

    code, _, err = _run(capsys, "log", "--run", "r1\n", *_flags(run_agent))
    assert code == 2 and "run_id" in err
    for name in ("commands/agent_run.schema.json", "commands/agent_interrupt.schema.json"):
        assert schemas.problems(name, {"run_id": "r1\n", "prompt": "p", "workspace": "/w"})
        assert not schemas.problems(name, {"run_id": "r1", "prompt": "p", "workspace": "/w"})
