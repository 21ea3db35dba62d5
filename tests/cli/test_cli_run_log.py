"""`caldera log --run RUN_ID [--follow]` and the run logs in `caldera log --list` (issue 40)."""
import json
import threading

import pytest
from adapter_helpers import make_agent

from caldera.cli import main, verbs

SECRET = "agt_boot_leakedtoken123"


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _flags(paths):
    return ["--manifest", str(paths.manifest_path), "--state-dir", str(paths.state_dir)]


@pytest.fixture
def agent(tmp_path, caldera_env):
    paths = make_agent(tmp_path, "recorder.py")
    (paths.config_dir / "secrets.env").write_text(f"CALDERA_TOKEN={SECRET}\n")
    (paths.config_dir / "secrets.env").chmod(0o600)
    (paths.state_dir / "logs").mkdir(parents=True, exist_ok=True)
    return paths


def _event(seq, type_, **data):
    return "2026-12-05T09:00:00.000Z event " + json.dumps(
        {"run_id": "r1", "seq": seq, "ts": "2026-12-05T09:00:00.000Z", "type": type_, "data": data},
        separators=(",", ":")) + "\n"


def test_a_run_log_is_printed_redacted_and_listed(agent, capsys):
    log = agent.state_dir / "logs" / "run-r1.log"
    log.write_text("2026-12-05T09:00:00.000Z note run r1 requested: backend codex\n"
                   f"2026-12-05T09:00:01.000Z s2c the key is {SECRET}\n"
                   + _event(1, "terminal_status", status="completed"))
    code, out, err = _run(capsys, "log", "--run", "r1", *_flags(agent))
    assert code == 0 and err == ""
    assert "run r1 requested" in out and SECRET not in out and '"terminal_status"' in out
    code, out, _ = _run(capsys, "log", *_flags(agent))
    assert code == 0 and out.startswith("run-20261003-124101.log\n")  # the adapter's names first, as before
    assert "--run RUN_ID" in out and out.rstrip().endswith("r1")
    code, out, _ = _run(capsys, "log", "--list", "--json", *_flags(agent))
    assert json.loads(out)["runs"] == ["r1"] and json.loads(out)["logs"] == ["run-20261003-124101.log"]


def test_a_missing_run_log_and_a_bad_run_id_are_said(agent, capsys):
    code, _, err = _run(capsys, "log", "--run", "nope", *_flags(agent))
    assert code == 1 and "There is no run log for nope" in err and "--list" in err
    code, _, err = _run(capsys, "log", "--run", "../x", *_flags(agent))
    assert code == 2 and "run_id" in err


def test_a_long_run_log_prints_its_tail(agent, capsys, monkeypatch):
    monkeypatch.setattr(verbs, "RUN_TAIL_BYTES", 1000)
    (agent.state_dir / "logs" / "run-r1.log").write_text("".join(f"2026 note line {n}\n" for n in range(500)))
    code, out, _ = _run(capsys, "log", "--run", "r1", *_flags(agent))
    assert code == 0 and out.startswith("(the first ") and "line 499\n" in out and "line 0\n" not in out
    assert all(line.startswith(("2026 note line", "(the first")) for line in out.splitlines())


def test_follow_prints_what_the_run_adds_and_ends_after_its_terminal_event(agent, capsys, monkeypatch):
    monkeypatch.setattr(verbs, "FOLLOW_POLL", 0.05)
    monkeypatch.setattr(verbs, "FOLLOW_QUIET_AFTER_END", 0.2)
    log = agent.state_dir / "logs" / "run-r1.log"
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
    code, out, _ = _run(capsys, "log", "--run", "r1", "--follow", *_flags(agent))
    assert code == 0 and written.is_set()
    assert [line.split(" ", 2)[1] for line in out.splitlines()] == ["event", "event", "s2c", "event"]
    assert out.count("par") == 1 and " partial\n" in out and SECRET not in out and out.rstrip().endswith("}}")


def test_follow_without_run_is_a_usage_error(agent, capsys):
    assert _run(capsys, "log", "--follow", *_flags(agent))[0] == 2
