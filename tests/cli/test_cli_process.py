"""Process mode from the host's CLI: `caldera check` (and `--start`), `caldera init` of a
process blueprint, and the example agent (examples/inbox-watcher) run by `caldera run`
and driven by the verbs through the control socket."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from process_helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "inbox-watcher"


def caldera(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "caldera.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def test_check_start_on_the_example(caldera_env, tmp_path):
    done = caldera("check", "--manifest", str(EXAMPLE / "caldera.agent.yaml"), "--state-dir", str(tmp_path / "s"),
                   "--start", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout
    checks = {item["check"]: item for item in report["checks"]}
    assert "forwarded keys: agent, detail, gauges" in checks["--start: status file"]["detail"]
    assert not (tmp_path / "s" / "data").exists()  # --start used a scratch state dir


def test_check_names_each_bad_key_and_a_crashing_agent(caldera_env, tmp_path):
    bad = tmp_path / "bad" / "caldera.agent.yaml"
    bad.parent.mkdir()
    bad.write_text("name: bad\nruntime:\n  type: process\n  command: [python3, x.py]\n  restart: sometimes\n"
                   "  stop_signal: SIGTERM\nbindings: [vault]\nenv: {N: 5}\n")
    done = caldera("check", "--manifest", str(bad), "--state-dir", str(tmp_path / "s"))
    assert done.returncode == 1 and "4 breaches of the process contract" in done.stderr
    for key in ("runtime.stop_signal", "runtime.restart", "bindings.0", "env.N"):  # each bad key, once
        assert sum(f": {key}" in line for line in done.stdout.splitlines()) == 1, key
    crash = tmp_path / "crash" / "caldera.agent.yaml"
    crash.parent.mkdir()
    crash.write_text(f"name: crash\nruntime:\n  type: process\n  command: [{json.dumps(sys.executable)}, -c, "
                     "\"import sys; print('boom'); sys.exit(4)\"]\nstatus: s.json\n")
    done = caldera("check", "--manifest", str(crash), "--state-dir", str(tmp_path / "s2"), "--start")
    assert done.returncode == 1
    assert "did not stay up: exited with status 4" in done.stdout and "boom" in done.stdout


def test_init_installs_a_process_blueprint(caldera_env):
    done = caldera("init", str(EXAMPLE), "--json")
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["ok"]
    assert "Process mode: the runtime starts and supervises the agent" in result["message"]
    assert (Path(result["config_dir"]) / "bundle" / "watcher.py").is_file()


def test_the_example_under_caldera_run(caldera_env):
    assert caldera("init", str(EXAMPLE)).returncode == 0
    runtime = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--agent", "inbox-watcher"],
                               env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    state = Path(os.environ["CALDERA_STATE_DIR"]) / "inbox-watcher"
    try:
        status = wait_for(lambda: (d := caldera("status", "--agent", "inbox-watcher", "--json")).returncode == 0
                          and (doc := json.loads(d.stdout)).get("process", {}).get("pid")
                          and doc["agent_status"].get("gauges") and doc, "the agent up with its status file")
        pid = status["process"]["pid"]
        assert status["agent_status"]["agent"]["version"] == "1.0.0"
        (state / "data" / "inbox" / "report.txt").write_text("hello\n")
        ran = caldera("run-now", "--agent", "inbox-watcher")
        assert ran.returncode == 0 and f"pid {pid}" in ran.stdout
        index = state / "data" / "processed" / "index.tsv"
        wait_for(lambda: index.exists() and "report.txt" in index.read_text(), "the run to index the file")
        assert "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03" in index.read_text()
        assert caldera("settings", "set", "interval_seconds=10", "--agent", "inbox-watcher").returncode == 0
        agent_log = state / "logs" / "agent.log"  # the agent answers the SIGHUP in its own time
        wait_for(lambda: agent_log.exists() and "settings re-read" in agent_log.read_text(), "the settings re-read")
        logs = caldera("log", "--agent", "inbox-watcher", "--json")
        assert json.loads(logs.stdout)["logs"] == ["agent.log", "watcher.log"]
        human = caldera("status", "--agent", "inbox-watcher")
        assert f"process: pid {pid}, running" in human.stdout and "inbox" in human.stdout
    finally:
        os.kill(runtime.pid, signal.SIGTERM)
        runtime.wait(60)
        runtime.stderr.close()
    assert runtime.returncode == 0
    done = caldera("pause", "--agent", "inbox-watcher")
    assert done.returncode == 1 and "no caldera runtime is running" in done.stderr
