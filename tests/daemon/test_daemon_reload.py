"""`systemctl reload` = SIGHUP: the daemon re-reads agent.env and secrets.env, logs the names
that changed (never values) and restarts itself in place (same PID); local mode too."""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from core_helpers import BOOT, install_agent
from daemon_helpers import INSTANCE, Daemon, count, wait_for
from plane_helpers import heartbeats


def test_unconfigured_agent_stays_local_and_a_reload_connects_it_in_place(caldera_env, plane):
    config = install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    (config / "agent.env").write_text("# not configured yet\n")
    daemon = Daemon()
    try:
        wait_for(lambda: "staying local" in daemon.log(), what="local mode")
        assert daemon.proc.poll() is None  # waits, does not exit (no crash loop under systemd)
        (config / "agent.env").write_text(
            f"CALDERA_AGENT_ENABLED=true\nCALDERA_BASE_URL={plane.url}\nCALDERA_INSTANCE_ID={INSTANCE}\n")
        daemon.signal(signal.SIGHUP)
        # The restarted process imports and registers anew: on a loaded machine that is
        # more than the usual few seconds.
        wait_for(lambda: heartbeats(plane.store, INSTANCE), timeout=30, what="heartbeat after the reload")
        assert daemon.proc.poll() is None  # the same process (execv keeps the PID)
    finally:
        assert daemon.stop() == 0
    log = daemon.log()
    assert "reload: changed CALDERA_AGENT_ENABLED, CALDERA_BASE_URL, CALDERA_INSTANCE_ID" in log
    assert plane.url not in log.split("reload: changed", 1)[1].splitlines()[0]  # names, not values
    assert BOOT not in log


def test_reload_of_a_changed_secret_names_it_and_hides_its_value(caldera_env, plane):
    config = install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        _reload_with_a_new_secret(config, daemon, plane)
        wait_for(lambda: "stopped; restarting with the new configuration" in daemon.log(), what="the restart")
        before = len(heartbeats(plane.store, INSTANCE))
        wait_for(lambda: len(heartbeats(plane.store, INSTANCE)) > before, timeout=30,
                 what="heartbeats after the reload (a restarted process)")
    finally:
        assert daemon.stop() == 0
    log = daemon.log()
    assert "reload: changed NEW_SECRET, OTHER_SECRET" in log
    assert "reload-canary-93b1" not in log


def test_reload_without_change_or_with_a_broken_file_keeps_running(caldera_env, plane):
    config = install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="first heartbeat")
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: "unchanged" in daemon.log(), what="the no-change reload")
        (config / "agent.env").write_text("CALDERA_AGENT_ENABLED=maybe\n")
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: "keeping the running configuration" in daemon.log(), what="the refused reload")
        before = count(plane, "POST", "/api/v1/agent/heartbeat")
        wait_for(lambda: count(plane, "POST", "/api/v1/agent/heartbeat") > before, what="heartbeats go on")
    finally:
        assert daemon.stop() == 0
    assert "CALDERA_AGENT_ENABLED" in daemon.log()  # the sentence names the variable
    assert "restarting in place" not in daemon.log()


def test_status_snapshot_is_written_for_users_without_access(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    snapshot = caldera_env / "var" / "demo" / "status.json"
    try:
        wait_for(snapshot.exists, what="status.json")
        assert snapshot.stat().st_mode & 0o777 == 0o644
        wait_for(lambda: b'"Ready"' in snapshot.read_bytes(), what="the adapter's status in the snapshot")
    finally:
        assert daemon.stop() == 0
    assert BOOT.encode() not in snapshot.read_bytes()
    doc = json.loads(snapshot.read_text())
    assert doc["daemon_pid"] == daemon.proc.pid and doc["outbox"]["items"] == 0


@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0, 2.5])
def test_a_stop_during_a_reload_stops_the_daemon(caldera_env, plane, delay):
    # `systemctl reload` then `systemctl stop`: the SIGTERM may come while the old process
    # stops, while it execs, or while the new one starts. Once it was counted by the old
    # process and exec'd away, and the restarted daemon ran on until SIGKILL.
    config = install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        _reload_with_a_new_secret(config, daemon, plane)
        threading.Event().wait(delay)
    finally:
        code = daemon.stop()
    assert code == 0  # on its own, gracefully: not killed after the helper's 30 s
    assert "INFO caldera.daemon: stopped" in daemon.log()


def _reload_with_a_new_secret(config, daemon, plane) -> None:
    """Once the daemon heartbeats: a new secret in secrets.env, SIGHUP, and the reload seen
    deciding to restart in place."""
    wait_for(lambda: heartbeats(plane.store, INSTANCE), what="first heartbeat")
    (config / "secrets.env").write_text(f"CALDERA_TOKEN={BOOT}\nNEW_SECRET=reload-canary-93b1\n")
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "reload: changed NEW_SECRET" in daemon.log(), what="the reload")


def test_a_restart_in_place_runs_the_program_as_it_was_started(caldera_env, tmp_path):
    """Started by its console script from a directory holding one named `caldera` (a clone
    in $HOME): the restart after a reload runs the same script, not `python -m caldera.cli`,
    which would find that directory first and die ("cannot import name … from 'caldera'")."""
    config = install_agent(caldera_env)
    (config / "agent.env").write_text("# local: no control plane\n")
    script = tmp_path / "bin" / "caldera"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom caldera.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    home = tmp_path / "home"
    (home / "caldera").mkdir(parents=True)  # a clone's top: no __init__.py, a namespace package for -m
    (home / "caldera" / "README.md").write_text("a clone\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_"))}
    env.update(CALDERA_CONFIG_DIR=os.environ["CALDERA_CONFIG_DIR"], CALDERA_STATE_DIR=os.environ["CALDERA_STATE_DIR"])
    log = tmp_path / "daemon.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([str(script), "run", "--agent", "demo"], cwd=home, env=env, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=sink, start_new_session=True)
    try:
        wait_for(lambda: "staying local" in log.read_text(), what="local mode")
        (config / "agent.env").write_text("# local: no control plane\nSOME_SETTING=1\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: log.read_text().count("staying local") == 2 or proc.poll() is not None, timeout=60,
                 what="the restarted daemon's first line")
        assert proc.poll() is None, log.read_text()  # the same process, restarted and running
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, log.read_text()
    assert "restarting" in log.read_text() and "cannot import" not in log.read_text()
