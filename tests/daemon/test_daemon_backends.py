"""Every backend through the command path (issue 39, item 1): `caldera plane enqueue` queues an
`agent_run` for each profile on a real loopback plane, the daemon (`caldera run`) fetches it and
runs one turn of the real CLI against that backend's local fake provider (backends_drivers.py),
whose model runs a command; the plane gets one finish: `succeeded`, result `completed` with the
command's output. The projection's key reaches no plane row and no daemon log line.

One turn per backend; a CLI that is not installed skips (CALDERA_REQUIRE_<BACKEND>=1: fails).
"""
import json
import shutil
import subprocess
import sys

import pytest
from backends_drivers import CANARY, DRIVERS, close_all, ready
from core_helpers import BOOT, install_agent
from daemon_helpers import INSTANCE, Daemon, wait_for
from plane_helpers import heartbeats

PlaneServer = pytest.importorskip("caldera.plane.server").PlaneServer
TURN = 120.0  # the finish's upper bound: OpenCode's first turn starts its server (7 s measured)


@pytest.fixture(scope="module", autouse=True)
def _drivers_closed():
    yield
    close_all()


@pytest.fixture(params=sorted(DRIVERS), ids=sorted(DRIVERS))
def driver(request):
    """(the driver, its CLI's path): read before caldera_env clears every CALDERA_* variable."""
    return ready(request.param)


def enqueue(db, payload) -> int:
    """`caldera plane enqueue` (its schema check included): the command's id."""
    done = subprocess.run([sys.executable, "-m", "caldera.cli", "plane", "enqueue", "--db", str(db), "--instance",
                           str(INSTANCE), "agent_run", "--payload", json.dumps(payload), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["id"]


def test_agent_run_from_the_plane_completes_with_the_commands_output(driver, caldera_env, tmp_path):
    driver, binary = driver
    db = tmp_path / "plane.db"
    plane = PlaneServer(str(db), tokens={BOOT: INSTANCE}, heartbeat_interval=1, poll_interval=1).start()
    workspace = tmp_path / "workspaces" / "one"
    workspace.mkdir(parents=True)
    script = [driver.command("echo from-the-agent-$((6 * 7))"), driver.text("done")]
    daemon = None
    try:
        with driver.provider(script) as provider:
            made = driver.projection(tmp_path / "made", provider.url, CANARY)
            env = dict(driver.env(binary), CALDERA_WORKSPACE_ROOTS=str(tmp_path / "workspaces"))
            config = install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE,
                                   extra_env="".join(f"{k}={v}\n" for k, v in env.items()))
            shutil.copytree(made / driver.profile, config / "secrets" / driver.profile)
            daemon = Daemon()
            wait_for(lambda: heartbeats(plane.store, INSTANCE), what="heartbeat")
            run_id = f"r-{driver.profile}"
            cid = enqueue(db, {"run_id": run_id, "prompt": "Run the command", "workspace": str(workspace),
                               "backend_profile": driver.profile, "execution_policy": {"timeout_seconds": 90}})
            finished = wait_for(lambda: _finished(plane, cid), timeout=TURN, step=0.2, what="the run's finish")
            posts = list(provider.posts)
            rows = json.dumps(plane.store.commands(INSTANCE))
    finally:
        if daemon is not None:
            daemon.stop()
        plane.stop()
    result = finished["result"]
    assert finished["status"] == "succeeded" and finished["finish_count"] == 1, json.dumps(finished)[-3000:]
    assert result["run_id"] == run_id and result["status"] == "completed", result
    outputs = [e["data"]["output"] for e in result["events"] if e["type"] == "command_output"]
    assert any("from-the-agent-42" in out for out in outputs), result["events"]
    assert len(posts) == 2 and "from-the-agent-42" in posts[1]["body"]  # the model got the output
    assert driver.key_seen(posts[0]) == CANARY  # the projection's key was used, and went nowhere else
    assert CANARY not in rows + daemon.log()


def _finished(plane, cid):
    command = {c["id"]: c for c in plane.store.commands(INSTANCE)}[cid]
    return command if command["status"] in ("succeeded", "failed") else None
