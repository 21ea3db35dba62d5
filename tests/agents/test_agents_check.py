"""`caldera check` against the example (clean) and against adapters that break the contract."""
import json

from adapter_helpers import copy_example, make_agent, workdir

from caldera.agents.check import Report, run_checks
from caldera.agents.manifest import load_manifest
from caldera.cli import main


def _breaches(paths):
    report = run_checks(load_manifest(paths.manifest_path), Report())
    return {item["check"]: item["detail"] for item in report.items if not item["ok"]}


def test_the_example_passes(tmp_path, caldera_env, capsys):
    manifest = copy_example(tmp_path)
    code = main(["check", "--json", "--controls", "--manifest", str(manifest), "--state-dir", str(tmp_path / "s")])
    body = json.loads(capsys.readouterr().out)
    assert code == 0, body
    assert body["ok"] is True
    assert {"status", "settings get", "log ../../etc/passwd", "unknown verb", "pause"} <= {
        c["check"] for c in body["checks"]}


def test_sloppy_adapter_breaches_are_each_named(tmp_path):
    paths = make_agent(tmp_path, "sloppy.py")
    found = _breaches(paths)
    assert "exit 0 after a failure" in found["settings set (not JSON)"]
    assert "silent clamping" in found["settings set (max_7d above its maximum 0.95)"]
    assert "a path accepted as a log name" in found["log ../../etc/passwd"]
    assert "must exit 2" in found["unknown verb"]
    # What the clamping probe wrote was put back.
    assert json.loads((workdir(paths) / "settings.json").read_text()) == {"max_7d": 0.5}


def test_two_objects_and_diagnostics_on_stdout(tmp_path):
    assert "more than one JSON object" in _breaches(make_agent(tmp_path / "a", "two_json.py"))["status"]
    found = _breaches(make_agent(tmp_path / "b", "text_before.py"))
    assert "text before the JSON object" in found["status"]
    assert "diagnostics belong on stderr" in found["settings get"]


def test_slow_status_is_a_breach(tmp_path):
    paths = make_agent(tmp_path, "recorder.py", extra="")
    (workdir(paths) / "recorder.py").write_text(
        "import json, sys, time\n"
        "if sys.argv[1] == 'status':\n    time.sleep(2.5)\n    print(json.dumps({}))\n"
        "else:\n    sys.exit(2)\n")
    assert "took 2." in _breaches(paths)["status"]


def test_bad_manifest_exits_1_with_the_reason(tmp_path, caldera_env, capsys):
    manifest = tmp_path / "caldera.agent.yaml"
    manifest.write_text("name: x\nruntime: {type: adapter, command: [a]}\nmcp: {}\n")
    code = main(["check", "--manifest", str(manifest), "--state-dir", str(tmp_path / "s")])
    out = capsys.readouterr()
    assert code == 1 and "'mcp' is not allowed" in out.out


SEED_SETTINGS = """\
settings:
  schema:
    - { key: max_7d, label: Weekly limit, type: percent, min: 0.1, max: 0.95 }
  defaults: { max_7d: 0.75 }
controls: [pause, resume, run_now]
"""


def test_seed_000s_minimal_adapter_passes_verbatim(tmp_path, caldera_env, capsys):
    paths = make_agent(tmp_path, "seed_minimal.py", extra=SEED_SETTINGS)
    code = main(["check", "--json", "--controls", "--manifest", str(paths.manifest_path),
                 "--state-dir", str(tmp_path / "s")])
    body = json.loads(capsys.readouterr().out)
    assert code == 0, body
    results = {(c["check"], c["result"]) for c in body["checks"]}
    # It implements no `log NAME` (exit 2, as the contract allows): reported, not a breach.
    assert ("log ../../etc/passwd", "not implemented") in results
    assert ("log caldera-check-no-such-log.log", "not implemented") in results
    assert ("unknown verb", "pass") in results and ("status", "pass") in results
    assert ("settings set (not JSON)", "pass") in results
    assert all(c["result"] in ("pass", "not implemented", "note") for c in body["checks"])
    # The human report lists each probe with its result.
    main(["check", "--manifest", str(paths.manifest_path), "--state-dir", str(tmp_path / "s")])
    out = capsys.readouterr().out
    assert "not implemented log ../../etc/passwd" in " ".join(out.split()) and "pass" in out


def test_every_probe_runs_after_an_earlier_failure(tmp_path):
    paths = make_agent(tmp_path, "broken_get.py")
    report = run_checks(load_manifest(paths.manifest_path), Report())
    by_check = {}
    for item in report.items:
        by_check.setdefault(item["check"], []).append(item)
    assert by_check["settings get"][0]["result"] == "fail"
    # The set probes ran anyway and found the clamping.
    assert by_check["settings set (not JSON)"][0]["result"] == "fail"
    assert "silent clamping" in by_check["settings set (max_7d above its maximum 1.0)"][0]["detail"]
    assert any("could not put max_7d back" in i["detail"] for i in by_check["settings set"])
    assert by_check["log --list"][0]["result"] == "not implemented"
    assert "log ../../etc/passwd" in by_check  # the name probes still ran


def test_check_says_when_the_adapter_cannot_write_its_workdir(tmp_path, caldera_env, capsys, monkeypatch):
    """Issue 23: a home agent run as the wrong account (or a read-only home) gets a sentence."""
    from caldera.agents.adapter import invoke

    paths = make_agent(tmp_path, "seed_minimal.py", extra=SEED_SETTINGS)
    args = ["check", "--json", "--manifest", str(paths.manifest_path), "--state-dir", str(tmp_path / "s")]
    assert main(args) == 0
    body = json.loads(capsys.readouterr().out)
    assert not [c for c in body["checks"] if c["check"] == "workdir"]  # writable: nothing to say
    real_open = invoke.os.open

    def read_only(path, *a, **kw):
        if ".caldera-check-" in str(path):
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(invoke.os, "open", read_only)
    main(args)
    body = json.loads(capsys.readouterr().out)
    notes = [c for c in body["checks"] if c["check"] == "workdir"]
    assert len(notes) == 1 and notes[0]["result"] == "note"
    assert "the adapter could not write its working directory" in notes[0]["detail"]
    assert "Read-only file system" in notes[0]["detail"]
    assert not list((tmp_path / "work").glob(".caldera-check-*"))


def test_an_unreachable_workdir_is_a_sentence_not_a_traceback(tmp_path, monkeypatch):
    """Debian 13's adduser makes homes 0700: user caldera cannot even stat the checkout."""
    from caldera.agents.adapter import invoke

    real_stat = invoke.os.stat
    home = tmp_path / "home" / "agent" / "task-agent"
    home.mkdir(parents=True)

    def denied(path, *a, **kw):
        if str(path) == str(home):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(invoke.os, "stat", denied)
    problem = invoke.workdir_problem(home)
    assert problem and "out of reach of user" in problem and "caldera init --user ACCOUNT" in problem
    assert invoke.workdir_problem(tmp_path / "missing").endswith("does not exist")
    assert invoke.workdir_problem(tmp_path) is None
