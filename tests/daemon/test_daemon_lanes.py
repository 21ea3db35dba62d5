"""Controls never wait behind slow work: pause, resume, settings_get … run in the controls
lane, in the order they came, while a slow log_get holds the main lane."""
from core_helpers import install_agent
from daemon_helpers import INSTANCE, Daemon, wait_for
from plane_helpers import heartbeats

from caldera.daemon.lanes import MAIN_BACKLOG, Lanes, lane_of
from caldera.protocol.command import parse_command

# `log NAME` holds until the test writes `release` (at most 15 s); the rest answer at once.
SLOW_LOG_ADAPTER = r"""
import json, os, sys, time
verb = sys.argv[1:]
with open("calls.log", "a") as fh:
    fh.write(" ".join(verb) + "\n")
if verb == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
elif verb in (["pause"], ["resume"], ["run-now"]):
    print(json.dumps({"message": verb[0] + " done"}))
elif verb[:2] == ["settings", "get"]:
    print(json.dumps({"values": {}}))
elif verb[:2] == ["log", "--list"]:
    print(json.dumps({"logs": [{"name": "agent"}]}))
elif verb[:1] == ["log"]:
    for _ in range(150):
        if os.path.exists("release"):
            break
        time.sleep(0.1)
    print("the last line of the log")
else:
    sys.exit(2)
"""


def _status(plane, cid):
    return {c["id"]: c for c in plane.store.commands(INSTANCE)}[cid]


def test_a_pause_queued_behind_a_slow_log_get_runs_at_once_and_controls_keep_their_order(
        caldera_env, plane):
    config = install_agent(caldera_env, base_url=plane.url)
    (config / "adapter.py").write_text(SLOW_LOG_ADAPTER)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="heartbeat")
        slow = plane.store.enqueue(INSTANCE, "log_get", {"name": "agent"}, timeout_seconds=60)
        wait_for(lambda: _status(plane, slow)["status"] == "running", what="log_get running")
        # "running" at the plane comes with the start, before the adapter is called: wait until
        # the adapter really holds the log, so that the controls are queued behind it.
        calls_log = config / "calls.log"
        wait_for(lambda: calls_log.exists() and "log agent" in calls_log.read_text().splitlines(),
                 what="the adapter holding the log")
        controls = [plane.store.enqueue(INSTANCE, kind) for kind in ("pause", "resume", "settings_get", "log_list")]
        # A bounded wait, well under the 15 s the log_get holds: 2 s + the adapter's time + the poll.
        wait_for(lambda: all(_status(plane, c)["status"] == "succeeded" for c in controls), what="controls done")
        assert _status(plane, slow)["status"] == "running"  # the controls did not wait for it
        calls = [line for line in calls_log.read_text().splitlines() if line != "status"]
        assert calls[calls.index("pause"):] [:4] == ["pause", "resume", "settings get", "log --list"]
        finished = [_status(plane, c)["finished_at"] for c in controls]
        assert finished == sorted(finished)
        (config / "release").write_text("")
        wait_for(lambda: _status(plane, slow)["status"] == "succeeded", what="log_get done")
        assert _status(plane, slow)["result"]["text"].endswith("the last line of the log\n")
    finally:
        daemon.stop()


def test_which_lane_a_command_takes():
    def lane(kind, local=False):
        return lane_of(parse_command({"id": 1, "command_type": kind}, local=local))

    assert [lane(k) for k in ("pause", "resume", "run_now", "settings_get", "settings_set", "log_list",
                              "agent_interrupt")] == ["controls"] * 7
    assert [lane(k) for k in ("log_get", "collect_skill_package", "collect_system_info")] == ["main"] * 3
    assert lane("agent_run") == "runs" and lane("apply_config_revision", local=True) == "main"


class _Blocked:
    """A life whose commands hold until released."""

    def __init__(self):
        import threading

        self.release, self.ran = threading.Event(), []

    def run(self, command, cancel):
        self.ran.append(command.type)
        self.release.wait(10)


def test_the_poller_keeps_fetching_into_a_bounded_main_backlog():
    executor = _Blocked()
    lanes = Lanes(executor, on_idle=lambda: None)  # type: ignore[arg-type]
    lanes.start()
    try:
        assert lanes.ready()
        lanes.submit(parse_command({"id": 1, "command_type": "log_get"}))
        assert lanes.ready()  # one main command running: the next may be fetched
        lanes.submit(parse_command({"id": 2, "command_type": "collect_system_info"}))
        assert lanes.ready()  # one waits beside it: a control behind it is still fetched
        for cid in range(3, 2 + MAIN_BACKLOG):
            lanes.submit(parse_command({"id": cid, "command_type": "health_check"}))
        assert not lanes.ready()  # the backlog is full: the plane holds the rest
        assert not lanes.idle()
    finally:
        executor.release.set()
        assert lanes.close(timeout=10)
    assert lanes.idle() and executor.ran[:2] == ["log_get", "collect_system_info"]
    assert len(executor.ran) == 1 + MAIN_BACKLOG


def test_a_pause_behind_a_slow_log_get_and_another_main_command_runs_at_once(caldera_env, plane):
    """The plane hands commands out in order: [log_get running, collect_system_info waiting,
    pause] used to leave the pause unfetched until the log_get ended."""
    config = install_agent(caldera_env, base_url=plane.url)
    (config / "adapter.py").write_text(SLOW_LOG_ADAPTER)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, INSTANCE), what="heartbeat")
        slow = plane.store.enqueue(INSTANCE, "log_get", {"name": "agent"}, timeout_seconds=60)
        wait_for(lambda: _status(plane, slow)["status"] == "running", what="log_get running")
        info = plane.store.enqueue(INSTANCE, "collect_system_info")
        pause = plane.store.enqueue(INSTANCE, "pause")
        wait_for(lambda: _status(plane, pause)["status"] == "succeeded", what="pause done")
        assert _status(plane, slow)["status"] == "running"  # the pause did not wait for it
        (config / "release").write_text("")
        wait_for(lambda: _status(plane, info)["status"] == "succeeded", what="system info done")
        assert _status(plane, slow)["status"] == "succeeded"
    finally:
        daemon.stop()
