"""Process mode with real processes: start, the environment the agent sees, crash loops,
stop escalation (grandchildren too), pause across runtimes, the survivor of a kill -9,
hostile status files in a report, the verbs."""
import dataclasses
import json
import os
import signal
import threading
from pathlib import Path

import pytest
from process_helpers import alive, kill_quietly, make_process_agent, read_state, wait_for

from caldera.agents.manifest import load_manifest
from caldera.agents.process.driver import open_process_driver
from caldera.agents.process.policy import RestartPolicy
from caldera.agents.process.supervisor import FAILED, RUNNING, STOPPED
from caldera.host.proc import stop_group
from caldera.host.statefile import StateFile
from caldera.redact import Redactor


class Running:
    """A driver whose supervisor thread runs, stopped (and the agent with it) at the end."""

    def __init__(self, paths, policy=None, environ=None):
        self.paths = paths
        self.store = StateFile(paths.state_dir / "state.json")
        self.redactor = Redactor(["s3cret-value"])
        self.driver = open_process_driver(paths, load_manifest(paths.manifest_path), state=self.store,
                                          redactor=self.redactor, report_interval=5.0,
                                          environ=environ if environ is not None else {"TZ": "UTC"})
        if policy is not None:
            self.driver.supervisor.policy = policy
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.driver.supervise, args=(self.stop,))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()

    @property
    def sup(self):
        return self.driver.supervisor

    def pid(self):
        return wait_for(self.sup.pid, "the agent's pid")


def test_starts_one_agent_reports_its_pid_version_and_filtered_status(tmp_path):
    paths = make_process_agent(tmp_path, "run")
    with Running(paths) as run:
        pid = run.pid()
        wait_for(lambda: (paths.state_dir / "agent" / "status.json").exists(), "the status file")
        section = wait_for(lambda: (s := run.driver.report_section())["runtime"]["openclaw_status"] == RUNNING and s,
                           "running")
        assert section["runtime"]["openclaw_pid"] == pid == section["runtime"]["runtime_pid"]
        assert section["runtime"]["openclaw_version"] == "fake-2.0"  # the status file's agent.version
        assert "junk" not in section["agent_status"]
        assert section["health"]["agent_process"]["pid"] == pid
        assert read_state(paths)["agent_process"]["pid"] == pid
        assert os.getpgid(pid) == pid  # its own process group
        # the log is written by its own thread (a slow disk never blocks the agent): wait for it
        agent_log = paths.state_dir / "logs" / "agent.log"  # opened by the writer at its first write
        wait_for(lambda: agent_log.exists() and b"agent up" in agent_log.read_bytes(),
                 "the agent's output in agent.log")
    assert not alive(pid)
    assert run.driver.report_section()["runtime"]["openclaw_pid"] is None


def test_a_start_that_waited_for_the_runtime_stop_starts_nothing(tmp_path):
    # `caldera start` or `resume` through the control socket waits for the supervisor while the
    # runtime stops its agent; once it gets its turn, no child may start without a supervisor.
    paths = make_process_agent(tmp_path, "run")
    with Running(paths) as run:
        pid = run.pid()
    assert not alive(pid) and run.sup.status == STOPPED
    answer = run.driver.start()
    assert run.sup.pid() is None and answer.kind == "failed" and "stopping" in answer.message
    assert run.sup.hold is None  # nothing recorded either: the next runtime starts it as before


def test_the_manifest_version_when_the_status_file_has_none(tmp_path):
    paths = make_process_agent(tmp_path, "run")
    with Running(paths) as run:
        run.pid()
        (paths.state_dir / "agent" / "status.json").unlink(missing_ok=True)
        run.driver.spec = dataclasses.replace(run.driver.spec, status_file=paths.state_dir / "agent" / "none.json")
        section = run.driver.report_section()
        assert section["runtime"]["openclaw_version"] == "1.0.0"
        assert any("not written yet" in e["reason"] for e in section["health"]["entries"])


def test_the_environment_the_agent_sees(tmp_path):
    extra = "secrets: [API_KEY]\nbindings: [llm_gateway]\nenv: {MODE: fast}\n"
    paths = make_process_agent(tmp_path, "env", extra=extra)
    (paths.config_dir / "secrets.env").write_text(
        "API_KEY=s3cret-value\nOTHER=unnamed-secret\nCALDERA_TOKEN=agt_boot_0123456789\n")
    os.chmod(paths.config_dir / "secrets.env", 0o600)
    (paths.config_dir / "agent.env").write_text("AGENT_ENV_VALUE=nope\n")
    environ = {"TZ": "UTC", "CLAWMANAGER_LLM_BASE_URL": "http://gw.local/v1",
               "CLAWMANAGER_LLM_API_KEY": "sk-gw-0123456789abcdef", "CLAWMANAGER_LLM_MODEL": "m1", "LEAK": "leak",
               "CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN": "agt_boot_zzzzzzzz"}
    with Running(paths, environ=environ) as run:
        run.pid()
        env_file = paths.state_dir / "agent" / "env.json"
        wait_for(lambda: env_file.exists() and env_file.stat().st_size, "the agent's env dump")
        env = json.loads(env_file.read_text())
        section = run.driver.report_section()
    expected = {"PATH", "HOME", "LANG", "TZ", "CALDERA_AGENT", "CALDERA_AGENT_STATE_DIR", "CALDERA_SETTINGS_FILE",
                "MODE", "API_KEY", "CLAWMANAGER_LLM_BASE_URL", "CLAWMANAGER_LLM_API_KEY", "CLAWMANAGER_LLM_MODEL",
                "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"}
    assert set(env) == expected
    assert env["API_KEY"] == "s3cret-value" and env["OPENAI_API_KEY"] == "sk-gw-0123456789abcdef"
    assert env["CALDERA_AGENT_STATE_DIR"] == str(paths.state_dir / "agent")
    assert oct(os.stat(paths.state_dir / "agent").st_mode & 0o777) == "0o700"
    text = json.dumps(section)
    assert "s3cret-value" not in text and "sk-gw-0123456789abcdef" not in text


def test_crash_loop_ends_in_error_and_waits_for_a_command(tmp_path):
    paths = make_process_agent(tmp_path, "crash")
    with Running(paths, policy=RestartPolicy("on-failure", delays=(0,))) as run:
        wait_for(lambda: run.sup.status == FAILED, "the error state")
        assert run.sup.restarts == 4  # 5 failures: the first start and 4 restarts
        assert "5 failures within 10 minutes" in run.sup.reason
        section = run.driver.report_section()
        assert section["runtime"]["openclaw_status"] == "error" and section["runtime"]["openclaw_pid"] is None
        assert section["agent_status"]["state"]["level"] == "bad"
        assert read_state(paths)["agent_process"]["last_exit"]["code"] == 3
        restarts = run.sup.restarts
        for _ in range(5):
            run.sup.step()  # no restart without a command
        assert run.sup.restarts == restarts and run.sup.status == FAILED
        run.driver.start()  # the command: the ladder and the failures start again
        wait_for(lambda: run.sup.restarts > restarts or run.sup.status != FAILED, "a start after the command")
    log = (paths.state_dir / "logs" / "agent.log").read_text()
    assert log.count("crashing") >= 5 and "exited with status 3" in log


def test_stop_escalates_to_kill_for_the_whole_group(tmp_path):
    paths = make_process_agent(tmp_path, "stubborn")
    with Running(paths) as run:
        pid = run.pid()
        grandchild_file = paths.state_dir / "agent" / "grandchild.pid"
        wait_for(lambda: grandchild_file.exists() and grandchild_file.read_text(), "the grandchild")
        grandchild = int(grandchild_file.read_text())
        answer = run.driver.stop()
        assert answer.ok
        assert not alive(pid) and not alive(grandchild)
        assert read_state(paths)["agent_process"]["last_exit"]["signal"] == signal.SIGKILL
        assert run.sup.status == STOPPED and read_state(paths)["agent_hold"] == "stopped"


def test_stop_group_kills_after_the_timeout_only(tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert stop_group(child.pid, signal.SIGTERM, 30, reap=child.poll, tick=threading.Event()) is True
        stubborn = subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, "
                                     "signal.SIG_IGN); print(1, flush=True); time.sleep(60)"],
                                    start_new_session=True, stdout=subprocess.PIPE)
        stubborn.stdout.readline()
        assert stop_group(stubborn.pid, signal.SIGTERM, 0.5, reap=stubborn.poll, tick=threading.Event()) is False
        assert stubborn.wait() == -signal.SIGKILL
        stubborn.stdout.close()
    finally:
        kill_quietly(child.pid)


def test_a_child_started_before_the_log_pump_has_its_output_drained_once_the_pump_comes(tmp_path):
    """A resume (a command, the control socket) can start the agent before the supervisor thread
    made the log pump: that child's pipe was never read (the agent blocks once it is full) nor
    closed (Debian 13's suite failed on the ResourceWarning)."""
    paths = make_process_agent(tmp_path, "run")
    run = Running(paths)
    run.sup.boot()  # the supervisor thread has not started: no pump yet
    run.sup.step()
    first = run.sup.popen
    assert first is not None and run.sup.pump is None
    wait_for((paths.state_dir / "agent" / "status.json").exists, "the early child up (it printed before)")
    agent_log = paths.state_dir / "logs" / "agent.log"
    with run:
        wait_for(lambda: agent_log.exists() and f"agent up {first.pid}".encode() in agent_log.read_bytes(),
                 "the early child's output in agent.log")
    wait_for(lambda: first.stdout.closed, "the early child's pipe closed by its reader at EOF")


def test_the_pipe_of_a_child_stopped_before_any_pump_came_is_closed(tmp_path):
    paths = make_process_agent(tmp_path, "run")
    run = Running(paths)
    run.sup.boot()
    run.sup.step()
    popen = run.sup.popen
    run.sup.shutdown()
    assert popen.poll() is not None and popen.stdout.closed


def test_pause_survives_a_new_runtime_and_resume_starts(tmp_path):
    paths = make_process_agent(tmp_path, "run")
    with Running(paths) as run:
        pid = run.pid()
        assert run.driver.pause().ok
        assert not alive(pid)
        refused = run.driver.run_now()
        assert not refused.ok and "paused" in refused.message
    with Running(paths) as run:
        for _ in range(3):
            run.sup.step()
        assert run.sup.pid() is None
        body = run.driver.report_section()["agent_status"]
        assert body["state"]["label"] == "Paused" and body["held"] == ["Paused"]
        answer = run.driver.resume()
        assert answer.ok and "Pause lifted" in answer.message
        assert run.sup.pid() is not None and read_state(paths)["agent_hold"] is None


def test_run_now_settings_and_logs(tmp_path):
    extra = "settings:\n  schema:\n    - {key: level, type: integer, min: 1, max: 5}\n  defaults: {level: 2}\n"
    paths = make_process_agent(tmp_path, "run", extra=extra)
    status_file = paths.state_dir / "agent" / "status.json"
    with Running(paths) as run:
        run.pid()
        wait_for(status_file.exists, "the status file")
        assert run.driver.run_now().ok
        wait_for(lambda: "1 runs" in status_file.read_text(), "the run the signal asked for")
        refused = run.driver.settings_set({"level": 9})
        assert not refused.ok and refused.message.startswith("Nothing changed")
        assert run.driver.settings_set({"level": 4}).ok
        assert json.loads((paths.state_dir / "agent" / "settings.json").read_text()) == {"level": 4}
        wait_for(lambda: "hups=1" in status_file.read_text(), "the SIGHUP after the change")
        assert run.driver.settings_get().data["values"] == {"level": 4}
        assert run.driver.log_list().data["logs"] == ["agent.log"]
        wait_for(lambda: "agent up" in run.driver.log_get("agent.log").text, "the agent's output through log_get")
        assert run.driver.log_get("../state.json").message.startswith("a log name is a name")
        assert run.driver.log_get("nope.log").message == "There is no such log."


def test_after_kill_9_of_the_runtime_the_survivor_is_stopped_never_doubled(tmp_path):
    """A runtime that died without stopping its agent: the next one stops the survivor first."""
    import subprocess
    import sys

    paths = make_process_agent(tmp_path, "run")
    code = ("import sys, threading\n"
            "from caldera.agents.manifest import load_manifest\n"
            "from caldera.agents.process.driver import open_process_driver\n"
            "from caldera.config import AgentPaths\n"
            "from caldera.host.statefile import StateFile\n"
            "from caldera.redact import Redactor\n"
            "from pathlib import Path\n"
            "c, m, s = map(Path, sys.argv[1:4])\n"
            "p = AgentPaths('fake', c, m, s)\n"
            "d = open_process_driver(p, load_manifest(m), state=StateFile(s / 'state.json'), redactor=Redactor(),\n"
            "                        environ={})\n"
            "d.supervise(threading.Event())\n")
    runtime = subprocess.Popen([sys.executable, "-c", code, str(paths.config_dir), str(paths.manifest_path),
                                str(paths.state_dir)], start_new_session=True)
    try:
        first = wait_for(lambda: read_state(paths).get("agent_process", {}).get("pid"), "the first agent")
        status = paths.state_dir / "agent" / "status.json"
        wait_for(lambda: alive(first) and status.exists(), "the first agent up (a survivor still starting "
                                                          "would die of SIGPIPE printing into the dead pipe)")
        os.kill(runtime.pid, signal.SIGKILL)
        runtime.wait()
        assert alive(first)  # the survivor: its own session, so the kill did not reach it
        with Running(paths) as run:
            second = run.pid()
            assert second != first and not alive(first)
            assert any("was still running; it was stopped" in e["reason"]
                       for e in run.driver.report_section()["health"]["entries"])
    finally:
        kill_quietly(runtime.pid)
        kill_quietly(first if "first" in dir() else None)


def test_a_reused_pid_is_not_mistaken_for_the_agent(tmp_path):
    paths = make_process_agent(tmp_path, "run")
    store = StateFile(paths.state_dir / "state.json")
    store.set("agent_process", {"pid": os.getpid(), "start_time": 1, "restarts": 0})  # our pid, wrong start time
    with Running(paths) as run:
        assert run.pid() != os.getpid()
    # and this test process was not signalled: we are still here


@pytest.mark.parametrize("content", [b"{broken", b"x" * (300 * 1024), "symlink"])
def test_hostile_status_files_never_break_a_report(tmp_path, content):
    paths = make_process_agent(tmp_path, "clean", runtime="  restart: never\n")
    status = paths.state_dir / "agent" / "status.json"
    status.parent.mkdir(parents=True)
    if content == "symlink":
        (tmp_path / "elsewhere.json").write_text(json.dumps({"state": {"level": "ok", "label": "forged"}}))
        status.symlink_to(tmp_path / "elsewhere.json")
    else:
        status.write_bytes(content)
    with Running(paths) as run:
        wait_for(lambda: run.sup.status == STOPPED and run.sup.last_exit, "the clean exit")
        section = run.driver.report_section()
        assert section["agent_status"]["state"]["level"] == "off"
        reasons = [e["reason"] for e in section["health"]["entries"] if e["name"] == "Status file"]
        assert reasons and "forged" not in json.dumps(section)


def test_instructions_and_mcp_and_what_a_revision_may_tell(tmp_path):
    extra = ("instructions: prompt.md\nmcp:\n  files: {command: [npx, fs-server]}\n"
             "  search: {url: 'https://search.example/mcp'}\n")
    paths = make_process_agent(tmp_path, "env", extra=extra)
    (tmp_path / "work" / "prompt.md").write_text("Be brief.\n")
    with Running(paths) as run:
        run.pid()
        env_file = paths.state_dir / "agent" / "env.json"
        wait_for(lambda: env_file.exists() and env_file.stat().st_size, "the agent's env dump")
        env = json.loads(env_file.read_text())
        assert Path(env["CALDERA_INSTRUCTIONS_FILE"]).read_text() == "Be brief.\n"
        mcp = json.loads(Path(env["CALDERA_MCP_CONFIG"]).read_text())["mcpServers"]
        assert mcp == {"files": {"command": ["npx", "fs-server"]}, "search": {"url": "https://search.example/mcp"}}
        refused = run.driver.check_told({"mcp": {"files": {"command": ["sh", "-c", "evil"]},
                                                  "files2": {"command": ["x"]},
                                                  "search": {"command": ["x"]}}})
        assert len(refused) == 3 and all(p.startswith("mcp.") for p in refused), refused
        assert run.driver.check_told({"mcp": {"files": {"url": "https://x.example"}}}) != []  # a command server
        assert run.driver.check_told({"mcp": {"search": {"url": "ftp://x"}}}) != []
        content = {"instructions": "Be thorough.\n", "mcp": {"search": {"url": "https://search2.example/mcp"},
                                                            "docs": {"url": "https://docs.example/mcp"}}}
        assert run.driver.check_told(content) == []
        status = paths.state_dir / "agent" / "status.json"
        wait_for(status.exists, "the status file")
        result = run.driver.apply_told(content)["told"]
        assert result == {"applied": ["instructions", "mcp"], "agent_told": True}
        assert Path(env["CALDERA_INSTRUCTIONS_FILE"]).read_text() == "Be thorough.\n"
        mcp = json.loads(Path(env["CALDERA_MCP_CONFIG"]).read_text())["mcpServers"]
        assert mcp["search"] == {"url": "https://search2.example/mcp"}
        assert mcp["files"]["command"] == ["npx", "fs-server"]
        assert mcp["docs"] == {"url": "https://docs.example/mcp"}  # an added url server (trust.check_update allows it)
        wait_for(lambda: "hups=1" in status.read_text(), "the SIGHUP that tells the agent")


def test_a_revision_may_not_tell_an_adapter_agent_or_an_undeclared_file(tmp_path):
    from caldera.agents.trust import not_told

    # An adapter driver refuses nothing and applies nothing: the finish result says why.
    assert not_told({"instructions": "x", "settings": {}}) == {
        "instructions": {"applied": False, "reason": "adapter mode passes no instructions file"}}
    paths = make_process_agent(tmp_path, "run")
    driver = Running(paths).driver
    assert "declares no instructions file" in driver.check_told({"instructions": "x"})[0]


def test_the_health_check_runs_as_in_adapter_mode(tmp_path):
    import sys as _sys

    extra = (f"health:\n  command: [{json.dumps(_sys.executable)}, -c, \"print('disk fine')\"]\n"
             "  interval_seconds: 10\n")
    paths = make_process_agent(tmp_path, "run", extra=extra)
    with Running(paths) as run:
        run.pid()
        entry = wait_for(lambda: next((e for e in run.driver.report_section()["health"]["entries"]
                                       if e["name"] == "Health check"), None), "the health entry")
        assert entry == {"name": "Health check", "level": "ok", "reason": "disk fine"}


def test_account_must_exist_and_needs_root_for_another_user():
    import pwd

    from caldera.agents.process.launcher import account_ids
    from caldera.agents.process.supervisor import LaunchError

    with pytest.raises(LaunchError, match="no such user"):
        account_ids("no-such-user-caldera")
    assert account_ids(pwd.getpwuid(os.geteuid()).pw_name) is None  # ourselves: nothing to switch
    assert account_ids(None) is None
    if os.geteuid() != 0:
        with pytest.raises(LaunchError, match="not root"):
            account_ids("root")
    else:
        assert account_ids("nobody") == (pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="running the agent as another account needs root (and a system python3)")
def test_the_agent_runs_as_the_manifest_account(tmp_path):
    import pwd
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from process_helpers import FAKE

    root = Path(tempfile.mkdtemp(prefix="caldera-acct-"))  # outside pytest's 0700 tree: nobody must reach it
    try:
        os.chmod(root, 0o755)
        paths = make_process_agent(root, "env", extra="account: nobody\n")
        text = paths.manifest_path.read_text().replace("state: agent\n", f"state: {root / 'agentstate'}\n")
        text = text.replace(json.dumps(sys.executable), "/usr/bin/python3")  # the venv may be out of its reach
        paths.manifest_path.write_text(text)
        for d in (root / "work", root / "config"):
            os.chmod(d, 0o755)
        os.chmod(root / "work" / FAKE.name, 0o644)
        with Running(paths) as run:
            pid = run.pid()
            wait_for(lambda: (root / "agentstate" / "env.json").exists(), "the agent's env dump")
            assert os.stat(f"/proc/{pid}").st_uid == pwd.getpwnam("nobody").pw_uid
            assert os.stat(root / "agentstate").st_uid == pwd.getpwnam("nobody").pw_uid
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_manifest_update_of_mcp_urls_reaches_the_running_agent(tmp_path):
    extra = "mcp:\n  search: {url: 'https://search.example/mcp'}\n"
    paths = make_process_agent(tmp_path, "run", extra=extra)
    with Running(paths) as run:
        pid = run.pid()
        status = paths.state_dir / "agent" / "status.json"
        wait_for(status.exists, "the status file")
        paths.manifest_path.write_text(paths.manifest_path.read_text().replace("search.example", "search2.example"))
        run.driver.refresh_manifest()
        mcp = json.loads((paths.state_dir / "agent" / "mcp.json").read_text())["mcpServers"]
        assert mcp == {"search": {"url": "https://search2.example/mcp"}}
        wait_for(lambda: "hups=1" in status.read_text(), "the SIGHUP")
        assert run.sup.pid() == pid  # told, not restarted
