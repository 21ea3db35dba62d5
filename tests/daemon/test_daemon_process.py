"""Process mode end to end: `caldera run` as a real process against the embedded plane,
the v1 slots in heartbeats and reports, start/stop/restart_openclaw, the CLI through the
control socket, and SIGTERM stopping the agent first."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from core_helpers import BOOT, SECRET, install_agent
from daemon_helpers import INSTANCE, Daemon, wait_for
from plane_helpers import heartbeats

FAKE = Path(__file__).resolve().parent.parent / "agents" / "process_agents" / "fake_agent.py"
MANIFEST = """\
name: {name}
version: "1.0.0"
runtime:
  type: process
  command: [{python}, {agent}, run]
  workdir: .
  stop_timeout_seconds: 5
status: status.json
state: agent
secrets: [OTHER_SECRET]
"""


def _install(root, plane):
    config = install_agent(root, base_url=plane.url if plane else "http://127.0.0.1:9", instance_id=INSTANCE,
                           manifest=MANIFEST.format(name="demo", python=json.dumps(sys.executable),
                                                    agent=json.dumps(str(FAKE))))
    return config


def _cli(*args):
    env = {k: v for k, v in os.environ.items()}
    return subprocess.run([sys.executable, "-m", "caldera.cli", *args, "--agent", "demo"], env=env,
                          capture_output=True, text=True, timeout=120)


def _last(plane, kind="reports"):
    if kind == "reports":
        item = plane.store.reports(INSTANCE, last=True)
    else:
        item = heartbeats(plane.store, INSTANCE, last=True)
    return item["body"] if item else {}


def _finished(plane, cid):
    cmd = plane.store.command(INSTANCE, cid)
    return cmd if cmd["status"] in ("succeeded", "failed") else None


def _alive(pid):
    from caldera.host.proc import proc_stat

    stat = proc_stat(pid)
    return stat is not None and stat["state"] not in ("Z", "X")


def test_the_v1_slots_and_the_three_commands(caldera_env, plane):
    _install(caldera_env, plane)
    daemon = Daemon()
    try:
        report = wait_for(lambda: (b := _last(plane)) and isinstance(b["runtime"].get("openclaw_pid"), int) and b,
                          timeout=30, what="a report with the agent's pid")
        pid = report["runtime"]["openclaw_pid"]
        assert report["runtime"]["runtime_pid"] == pid and _alive(pid)
        assert report["runtime"]["openclaw_version"] in ("fake-2.0", "1.0.0")
        beat = wait_for(lambda: (b := _last(plane, "heartbeats")) and b["summary"].get("openclaw_pid") == pid and b,
                        timeout=30, what="a heartbeat with the pid")
        assert beat["summary"]["runtime_pid"] == pid
        assert report["health"]["agent_process"]["pid"] == pid
        import urllib.request

        page = wait_for(lambda: (t := urllib.request.urlopen(plane.url + "/", timeout=10).read().decode())
                        and f"pid {pid}" in t and t, timeout=30, what="the pid on the plane's status page")
        assert f"pid {pid}</span>" in page
        status_shown = page[page.find(f"pid {pid}") - 40:page.find(f"pid {pid}")]
        assert "status running" in status_shown or "status starting" in status_shown, status_shown
        # never a report that says stopped (or error) while it carries a pid: status and pid change together
        for item in plane.store.reports(INSTANCE):
            rt = item["body"]["runtime"]
            assert rt["openclaw_pid"] is None or rt["openclaw_status"] in ("starting", "running"), rt

        cid = plane.store.enqueue(INSTANCE, "stop_openclaw", {})
        done = wait_for(lambda: _finished(plane, cid), timeout=30, what="stop_openclaw")
        assert done["status"] == "succeeded" and not _alive(pid)
        wait_for(lambda: _last(plane)["runtime"]["openclaw_status"] == "stopped"
                 and _last(plane)["runtime"]["openclaw_pid"] is None, timeout=30, what="a stopped report")

        cid = plane.store.enqueue(INSTANCE, "start_openclaw", {})
        done = wait_for(lambda: _finished(plane, cid), timeout=30, what="start_openclaw")
        second = done["result"]["pid"]
        assert done["status"] == "succeeded" and second != pid and _alive(second)

        cid = plane.store.enqueue(INSTANCE, "restart_openclaw", {})
        done = wait_for(lambda: _finished(plane, cid), timeout=30, what="restart_openclaw")
        third = done["result"]["pid"]
        assert done["status"] == "succeeded" and third not in (pid, second) and not _alive(second)

        # the host's CLI reaches the same daemon through the control socket
        paused = _cli("pause")
        assert paused.returncode == 0, paused.stderr
        assert not _alive(third)
        status = _cli("status", "--json")
        assert json.loads(status.stdout)["process"]["hold"] == "paused"
        resumed = _cli("resume")
        assert resumed.returncode == 0 and "Pause lifted" in resumed.stdout
        fourth = json.loads(_cli("status", "--json").stdout)["process"]["pid"]
        assert _alive(fourth)
    finally:
        assert daemon.stop() == 0
    assert not _alive(fourth)  # SIGTERM to caldera run stopped the agent first
    final = _last(plane)["runtime"]  # ... and the final report says so, not the last running section
    assert final["openclaw_status"] == "stopped" and final["openclaw_pid"] is None, final
    log = daemon.log()
    assert "stopping the agent" in log and BOOT not in log and SECRET not in log
    agent_log = (Path(os.environ["CALDERA_STATE_DIR"]) / "demo" / "logs" / "agent.log").read_text()
    assert "agent up" in agent_log


def test_the_cli_without_a_daemon_says_so_and_exits_1(caldera_env):
    _install(caldera_env, None)
    for verb in (["pause"], ["run-now"], ["log"]):
        done = _cli(*verb)
        assert done.returncode == 1
        assert "no caldera runtime is running for agent demo" in done.stderr


def test_adapter_mode_refuses_the_openclaw_commands(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        cid = plane.store.enqueue(INSTANCE, "restart_openclaw", {})
        done = wait_for(lambda: _finished(plane, cid), timeout=30, what="restart_openclaw")
        assert done["status"] == "failed" and "only in process mode" in done["error_message"]
    finally:
        daemon.stop()


def test_inside_a_clawmanager_instance_with_no_caldera_variable(caldera_env, plane, tmp_path):
    """Only what ClawManager injects (CLAWMANAGER_*, the gateway), the persistent dir present:
    state under it, runtime_type reported, the gateway bound to the agent and redacted.
    (CALDERA_CONFIG_DIR only points the test at its temporary /etc/caldera.)"""
    config = Path(os.environ["CALDERA_CONFIG_DIR"]) / "agents" / "demo"
    config.mkdir(parents=True)
    (config / "caldera.agent.yaml").write_text(
        MANIFEST.format(name="demo", python=json.dumps(sys.executable), agent=json.dumps(str(FAKE)))
        .replace("secrets: [OTHER_SECRET]\n", "bindings: [llm_gateway]\n").replace(", run]", ", env]"))
    persistent = tmp_path / "config-mount"
    persistent.mkdir()
    key = "sk-gateway-0123456789abcdef"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_", "OPENAI_"))}
    env.update(CALDERA_CONFIG_DIR=os.environ["CALDERA_CONFIG_DIR"], CLAWMANAGER_AGENT_ENABLED="true",
               CLAWMANAGER_AGENT_BASE_URL=plane.url, CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN=BOOT,
               CLAWMANAGER_AGENT_INSTANCE_ID=str(INSTANCE), CLAWMANAGER_AGENT_PROTOCOL_VERSION="v1",
               CLAWMANAGER_AGENT_PERSISTENT_DIR=str(persistent), CLAWMANAGER_AGENT_RUNTIME_TYPE="hermes",
               CLAWMANAGER_LLM_BASE_URL="http://gateway.local/api/v1/gateway/llm", CLAWMANAGER_LLM_API_KEY=key,
               CLAWMANAGER_LLM_MODEL='["auto","gw-model"]', OPENAI_MODEL="auto")
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        runtime = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    state = persistent / "caldera-agent"
    try:
        report = wait_for(lambda: (b := _last(plane)) and isinstance(b["runtime"].get("openclaw_pid"), int) and b,
                          timeout=30, what="a report with the pid")
        assert report["agent_id"] == f"hermes-{INSTANCE}-main" and report["runtime"]["runtime_type"] == "hermes"
        env_file = state / "agent" / "env.json"
        wait_for(lambda: env_file.exists() and env_file.stat().st_size, timeout=30, what="the agent's env")
        seen = json.loads(env_file.read_text())
        assert seen["CLAWMANAGER_LLM_API_KEY"] == key == seen["OPENAI_API_KEY"]
        # the default model as OPENAI_MODEL, the catalogue only under its own name (issue 34)
        assert seen["OPENAI_MODEL"] == "auto" and seen["CLAWMANAGER_LLM_MODEL"] == '["auto","gw-model"]'
        # the platform's gateway (its URL as the server builds it: ClawManager's own rule): gateway
        assert report["runtime"]["llm_config_status"] == "gateway"
        assert report["runtime"]["llm_provider_base_url"] == "http://gateway.local/api/v1/gateway/llm"
        assert seen["CALDERA_AGENT_STATE_DIR"] == str(state / "agent")
        assert "CLAWMANAGER_AGENT_BOOTSTRAP_TOKEN" not in seen and BOOT not in json.dumps(seen)
        assert (state / "session.json").exists() and (state / "logs" / "agent.log").exists()
    finally:
        runtime.send_signal(signal.SIGTERM)
        runtime.wait(60)
    everything = json.dumps([r["body"] for r in plane.store.reports(INSTANCE)]) + log.read_text()
    assert key not in everything and BOOT not in everything


def test_report_once_reports_the_recorded_agent_and_starts_nothing(caldera_env, plane):
    """Cron's report --once does not supervise: it reports what state.json and /proc say and
    refuses start_openclaw with a sentence (the daemon runs the agent)."""
    from caldera.host.proc import proc_stat

    _install(caldera_env, plane)
    state = Path(os.environ["CALDERA_STATE_DIR"]) / "demo"
    state.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        record = {"pid": child.pid, "start_time": proc_stat(child.pid)["start_time"], "restarts": 2,
                  "started_at": "2026-01-01T00:00:00Z"}
        (state / "state.json").write_text(json.dumps({"agent_process": record}))
        cid = plane.store.enqueue(INSTANCE, "start_openclaw", {})
        done = _cli("report", "--once", "--deadline", "20")
        assert done.returncode == 0, done.stderr
        body = plane.store.reports(INSTANCE)[0]["body"]
        assert body["runtime"]["openclaw_pid"] == child.pid == body["runtime"]["runtime_pid"]
        assert body["runtime"]["openclaw_status"] == "running"
        assert body["health"]["agent_process"]["restarts"] == 2
        finished = plane.store.command(INSTANCE, cid)
        assert finished["status"] == "failed" and "the daemon (caldera run) runs the agent" in finished["error_message"]
    finally:
        child.kill()
        child.wait()


def test_kill9_of_caldera_run_then_a_new_one_never_runs_two_agents(caldera_env, plane):
    _install(caldera_env, plane)
    state_file = Path(os.environ["CALDERA_STATE_DIR"]) / "demo" / "state.json"
    daemon = Daemon()
    try:
        first = wait_for(lambda: json.loads(state_file.read_text()).get("agent_process", {}).get("pid")
                         if state_file.exists() else None, timeout=30, what="the first agent")
        # fully up (it printed, then wrote its status file): a survivor still starting would print into
        # the dead runtime's pipe and die of SIGPIPE on its own, which is fine but not this test
        status = state_file.parent / "agent" / "status.json"
        wait_for(lambda: _alive(first) and status.exists(), timeout=30, what="the first agent up")
    finally:
        daemon.kill9()  # the runtime's group only: the agent has its own session and survives
    assert _alive(first)
    daemon = Daemon()
    try:
        second = wait_for(lambda: (p := json.loads(state_file.read_text()).get("agent_process", {}).get("pid"))
                          and p != first and p, timeout=30, what="the second agent")
        assert not _alive(first) and _alive(second)
        report = wait_for(lambda: (b := _last(plane)) and b["runtime"].get("openclaw_pid") == second and b,
                          timeout=30, what="a report with the second pid")
        reasons = [e["reason"] for e in report["health"]["entries"]]
        assert any(f"agent (pid {first}) was still running; it was stopped" in r for r in reasons), \
            (reasons, daemon.log())
    finally:
        assert daemon.stop() == 0
    assert not _alive(second)


def test_a_reload_restarts_the_agent_with_the_new_secret_never_two(caldera_env, plane):
    config = _install(caldera_env, plane)
    text = (config / "caldera.agent.yaml").read_text().replace(", run]", ", env]")
    (config / "caldera.agent.yaml").write_text(text)
    state = Path(os.environ["CALDERA_STATE_DIR"]) / "demo"
    env_file = state / "agent" / "env.json"
    daemon = Daemon()
    try:
        wait_for(lambda: env_file.exists() and env_file.stat().st_size, timeout=30, what="the agent's env")
        first = json.loads((state / "state.json").read_text())["agent_process"]["pid"]
        assert json.loads(env_file.read_text())["OTHER_SECRET"] == SECRET
        (config / "secrets.env").write_text(f"CALDERA_TOKEN={BOOT}\nOTHER_SECRET=reloaded-secret-4411\n")
        env_file.unlink()
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: env_file.exists() and env_file.stat().st_size, timeout=60, what="the agent restarted")
        assert json.loads(env_file.read_text())["OTHER_SECRET"] == "reloaded-secret-4411"
        second = json.loads((state / "state.json").read_text())["agent_process"]["pid"]
        assert second != first and not _alive(first) and _alive(second)
        assert daemon.proc.poll() is None  # the same runtime process (re-exec keeps the PID)
    finally:
        assert daemon.stop() == 0
    assert not _alive(second)
    assert "reloaded-secret-4411" not in daemon.log()
