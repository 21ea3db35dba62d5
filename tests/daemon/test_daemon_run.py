"""The daemon end to end: `caldera run` as a real process against the embedded plane over HTTP."""
import json
import os
import signal
import subprocess
import sys

import pytest
from core_helpers import BOOT, SECRET, install_agent
from daemon_helpers import INSTANCE, Daemon, count, wait_for
from plane_helpers import heartbeats

PlaneServer = pytest.importorskip("caldera.plane.server").PlaneServer


def commands(plane):
    return {c["id"]: c for c in plane.store.commands(INSTANCE)}


def test_register_heartbeat_report_then_commands_run(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: plane.store.reports(INSTANCE), what="first state report")
        assert count(plane, "POST", "/api/v1/agent/register") == 1
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="first heartbeat")
        report = plane.store.reports(INSTANCE, last=True)
        report = report[-1] if isinstance(report, list) else report
        body = report.get("body", report)
        assert body["system_info"]["cpu"]["cores"] >= 1
        assert "current_config_revision_id" in body["runtime"] and "openclaw_pid" in body["runtime"]
        cid = plane.store.enqueue(INSTANCE, "collect_system_info", {})
        bogus = plane.store.enqueue(INSTANCE, "make_coffee", {})
        done = wait_for(lambda: all(commands(plane)[i]["status"] in ("succeeded", "failed") for i in (cid, bogus))
                        and commands(plane), what="both commands finished")
        assert done[cid]["status"] == "succeeded"
        assert done[bogus]["status"] == "failed"
        assert done[bogus]["error_message"] == "unsupported command type: make_coffee"
    finally:
        assert daemon.stop() == 0
    log = daemon.log()
    assert BOOT not in log and SECRET not in log and "agt_sess_" not in log


def test_pending_hint_starts_command_without_waiting_for_poll(caldera_env, tmp_path):
    server = PlaneServer(str(tmp_path / "p.db"), tokens={BOOT: INSTANCE}, heartbeat_interval=1,
                         poll_interval=3600).start()
    install_agent(caldera_env, base_url=server.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(server.store, INSTANCE), what="first heartbeat")
        wait_for(lambda: count(server, "GET", "/api/v1/agent/commands/next") >= 1, what="first poll")
        cid = server.store.enqueue(INSTANCE, "collect_system_info", {})
        # heartbeat interval 1 s; the poll interval is an hour, so only the hint can start it
        # within the wait (no stopwatch here: a slow machine must not fail this)
        wait_for(lambda: commands(server)[cid]["status"] != "pending", what="command dispatched")
    finally:
        daemon.stop()
        server.stop()


def test_401_mid_session_reregisters_once_and_work_continues(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="first heartbeat")
        plane.inject("POST", r"/api/v1/agent/heartbeat$", 401, count=1)
        wait_for(lambda: count(plane, "POST", "/api/v1/agent/register") == 2, what="re-register")
        cid = plane.store.enqueue(INSTANCE, "collect_system_info", {})
        wait_for(lambda: commands(plane)[cid]["status"] == "succeeded", what="command after re-register")
        assert count(plane, "POST", "/api/v1/agent/register") == 2
    finally:
        daemon.stop()


def test_bad_bootstrap_token_does_not_hammer(caldera_env, plane):
    config = install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    (config / "secrets.env").write_text("CALDERA_TOKEN=wrong-token-123456\n")
    daemon = Daemon()
    try:
        wait_for(lambda: count(plane, "POST", "/api/v1/agent/register") >= 1, what="first register")
        threading_wait = __import__("threading").Event()
        threading_wait.wait(4)  # four heartbeat intervals
        assert count(plane, "POST", "/api/v1/agent/register") == 1
        assert count(plane, "POST", "/api/v1/agent/heartbeat") == 0
        state_file = caldera_env / "var" / "demo" / "state.json"
        wait_for(lambda: "invalid agent bootstrap token" in
                 (json.loads(state_file.read_text()).get("connection", {}).get("auth_blocked") or ""),
                 what="the blocked reason in state.json")
        daemon.signal(signal.SIGHUP)  # the operator fixed nothing: one more try, then quiet again
        wait_for(lambda: count(plane, "POST", "/api/v1/agent/register") == 2, what="register after SIGHUP")
    finally:
        daemon.stop()
    assert "wrong-token-123456" not in daemon.log()


def test_kill9_with_queued_finishes_delivers_all_runs_none_twice(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    plane.inject("POST", r"/commands/\d+/finish$", 503, count=10_000)
    daemon = Daemon()
    ids = [plane.store.enqueue(INSTANCE, "collect_system_info", {}) for _ in range(3)]
    outbox = caldera_env / "var" / "demo" / "outbox"
    # real items only: a `.NNN-finish.json.XXXX.tmp` is a finish still being written
    wait_for(lambda: outbox.is_dir() and len([n for n in os.listdir(outbox) if n.endswith("-finish.json")
                                              and n[0].isdigit()]) == 3,
             timeout=20, what="three finishes queued")
    daemon.kill9()
    plane.clear_faults()  # the outage is over
    daemon = Daemon()
    try:
        wait_for(lambda: all(commands(plane)[i]["status"] == "succeeded" for i in ids), timeout=20,
                 what="every finish delivered")
        starts = count(plane, "POST", f"/api/v1/agent/commands/{ids[0]}/start")
        assert starts == 1  # executed once: never re-run after the restart
    finally:
        daemon.stop()


def test_report_once_twice_in_parallel(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAWMANAGER_",))}
    cmd = [sys.executable, "-m", "caldera.cli", "report", "--once", "--agent", "demo", "--deadline", "20"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    second = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out1, err1 = first.communicate(60)
    out2, err2 = second.communicate(60)
    assert first.returncode == 0 and second.returncode == 0, (err1, err2)
    assert len(plane.store.reports(INSTANCE)) >= 2
    state = json.loads((caldera_env / "var" / "demo" / "state.json").read_text())  # not torn
    assert state["connection"]["last_error"] is None
    for text in (out1, err1, out2, err2):
        assert BOOT.encode() not in text


def test_report_once_beside_the_daemon_exits_0_without_registering(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="daemon running")
        registers = count(plane, "POST", "/api/v1/agent/register")
        done = subprocess.run([sys.executable, "-m", "caldera.cli", "report", "--once", "--agent", "demo"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "daemon" in done.stdout
        assert count(plane, "POST", "/api/v1/agent/register") == registers
    finally:
        daemon.stop()


def test_outage_agent_keeps_running_and_recovers(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="first heartbeat")
        cid = plane.store.enqueue(INSTANCE, "collect_system_info", {})
        plane.inject("*", r"/commands/\d+/finish$|/heartbeat$|/state/report$", 503, count=100_000)
        wait_for(lambda: commands(plane)[cid]["status"] == "running", what="command started before the outage bites")
        stop = __import__("threading").Event()
        stop.wait(4)
        assert daemon.proc.poll() is None  # the runtime never gives up on the agent
        failures = plane.count("POST", r"/heartbeat$", status=503)
        assert 1 <= failures <= 4  # backing off (1, 2, 5 s ...), not hammering at 1 s
        heartbeats_before = len(heartbeats(plane.store, INSTANCE))
        plane.clear_faults()
        wait_for(lambda: commands(plane)[cid]["status"] == "succeeded", timeout=20, what="finish after outage")
        wait_for(lambda: len(heartbeats(plane.store, INSTANCE)) > heartbeats_before, timeout=20,
                 what="heartbeats after outage")
    finally:
        assert daemon.stop() == 0
    assert "last successful was" in daemon.log()


def test_sigterm_drains_and_second_signal_cancels(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="first heartbeat")
    finally:
        daemon.signal(signal.SIGTERM)
        assert daemon.proc.wait(30) == 0
    assert "stopped" in daemon.log()
    daemon.stop()  # closes its stderr file (the process has exited)
