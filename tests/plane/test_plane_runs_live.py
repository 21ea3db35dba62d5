"""A code-agent turn watched from the plane while it runs, through a real `caldera run` (issue 40):
`caldera plane turn --follow` shows the started command while it still runs, the plane goes down
mid-turn and, back on the same port, gets every event once; its run list counts what the
finish result counts."""
import json
import subprocess
import sys
import threading
import time

from core_helpers import BOOT
from daemon_helpers import Daemon, wait_for
from plane_turns import command, completed, install, message

from caldera.plane.server import PlaneServer

INSTANCE = 7


def _lines(proc):
    got = []

    def read():
        for line in proc.stdout:
            got.append((time.monotonic(), json.loads(line)))

    threading.Thread(target=read, daemon=True).start()
    return got


def _seen(got, pred):
    return next((t for t, doc in got if pred(doc)), None)


def test_a_turn_followed_live_survives_the_plane_going_down(caldera_env, tmp_path):
    plane = PlaneServer(str(tmp_path / "p.db"), tokens={BOOT: INSTANCE}, heartbeat_interval=1, poll_interval=1).start()
    port = plane.port
    on_turn = [message(1, "looking"), command("c1", "make test"), {"sleep": 2.5},
               command("c1", "make test", "12 passed\n"), *[message(n) for n in range(2, 30)], {"sleep": 1.5},
               *[message(n) for n in range(30, 60)], completed()]
    workspace = install(caldera_env, tmp_path, plane.url, INSTANCE, on_turn)
    daemon = Daemon()
    follower = None
    try:
        wait_for(lambda: plane.store.agents()[0]["agent_id"], what="the agent registered")
        follower = subprocess.Popen(
            [sys.executable, "-m", "caldera.cli", "plane", "turn", "--db", str(tmp_path / "p.db"), "--instance",
             str(INSTANCE), "--workspace", str(workspace), "--follow", "--json", "run the tests"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        got = _lines(follower)
        started = wait_for(lambda: _seen(got, lambda d: d.get("data", {}).get("status") == "started"), timeout=30,
                           what="the started command at the follower")
        assert _seen(got, lambda d: d.get("type") == "command_output") is None  # the tool still runs
        plane.stop()  # down while the command runs, ends, and the messages after it come
        threading.Event().wait(4.0)
        back = time.time()
        plane = PlaneServer(str(tmp_path / "p.db"), port=port, tokens={BOOT: INSTANCE}, heartbeat_interval=1,
                            poll_interval=1).start()
        assert follower.wait(timeout=60) == 0, follower.stderr.read()
        output_at = _seen(got, lambda d: d.get("type") == "command_output")
        assert output_at - started >= 1.0  # seen at the start, not at the command's end (it ran 2.5 s)
        # the terminal event ended the follow; the finish comes through the runtime's outbox
        result = wait_for(lambda: plane.store.commands(INSTANCE)[-1]["result"], timeout=30, what="the finish")
        run_id = result["run_id"]
        seqs = [doc["seq"] for _, doc in got[1:]]
        assert got[0][1]["run_id"] == run_id and seqs == list(range(1, result["events_total"] + 1))
        (row,) = plane.store.runs(INSTANCE)
        assert row["events"] == row["events_total"] == result["events_total"] >= 60 and row["status"] == "completed"
        assert plane.store.run_events(INSTANCE, run_id, limit=1000) == [doc for _, doc in got[1:]]
        output_seq = next(doc["seq"] for _, doc in got if doc.get("type") == "command_output")
        (when,) = plane.store._read("SELECT received_at FROM run_events WHERE seq=?", (output_seq,))
        assert when["received_at"] >= back  # made while the plane was down, posted once it was back
    finally:
        if follower is not None:
            follower.kill()
            follower.communicate()
        daemon.stop()
        plane.stop()


def test_a_plane_without_the_route_is_asked_once_and_the_log_says_so_once(caldera_env, tmp_path):
    """ClawManager answers 404 (empty body) on the run-events route: the runtime's first run asks,
    no later run does, the daemon's log says it once, and both runs complete."""
    from plane_helpers import InjectingPlane

    from caldera.backends.poster import NO_ROUTE_SENTENCE

    plane = InjectingPlane(str(tmp_path / "p.db"), tokens={BOOT: INSTANCE}, heartbeat_interval=1,
                           poll_interval=1).start()
    plane.inject("POST", r"/runs/[^/]+/events$", 404, count=1000, body=b"")
    workspace = install(caldera_env, tmp_path, plane.url, INSTANCE, [message(1, "hi"), completed()])
    daemon = Daemon()
    try:
        ids = [plane.store.enqueue(INSTANCE, "agent_run", {"run_id": f"r{n}", "prompt": "hi",
                                                           "workspace": str(workspace)}) for n in (1, 2)]
        wait_for(lambda: [c["status"] for c in plane.store.commands(INSTANCE) if c["id"] in ids]
                 == ["succeeded", "succeeded"], timeout=30, what="both runs completed")
    finally:
        daemon.stop()
        plane.stop()
    assert plane.count("POST", r"/runs/[^/]+/events$") == 1
    assert daemon.log().count(NO_ROUTE_SENTENCE) == 1
