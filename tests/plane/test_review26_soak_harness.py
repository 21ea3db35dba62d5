"""Review of issue 26 (hostile reviewer): the soak harness itself can lose a command.

The port_closed episode cuts every open connection (FaultProxy._close). A commands/next
answer still on the wire then (a trickle episode's 6 s relay, or a plain relay in progress)
was already handed out by the plane, which never hands it out again: the command is left
'dispatched' by the harness's hand, and the accounting blames the runtime ("still
'dispatched' at the plane after the calm tail"). Nothing in the harness keeps the episode
switch out of that window (HandOuts.when_quiet guards only the SIGKILL)."""
import random
import sys
import threading
from pathlib import Path

import requests
from plane_helpers import AGENT, BOOT, Agent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from soak_plane import FaultProxy, RecordingPlane  # noqa: E402


def test_a_port_closed_episode_after_a_trickle_loses_a_handed_out_command(tmp_path):
    plane = RecordingPlane(tmp_path / "plane.db", tokens={BOOT: 1}).start()
    stop = threading.Event()
    proxy = FaultProxy(("127.0.0.1", plane.port), random.Random(1), stop)
    try:
        agent = Agent(proxy.url, instance_id=1, agent_id=AGENT)
        assert agent.register().status_code == 200
        cid = plane.store.enqueue(1, "collect_system_info")
        proxy.set_mode("trickle")
        got = {}

        def poll():
            try:
                got["command"] = agent.next()
            except (requests.RequestException, AssertionError) as exc:
                got["error"] = exc

        poller = threading.Thread(target=poll)
        poller.start()
        # the plane answered (dispatched) and the trickle is on the wire: the next episode begins
        deadline = threading.Event()
        for _ in range(200):
            if plane.store.command(1, cid)["status"] == "dispatched":
                break
            deadline.wait(0.05)
        proxy.set_mode("port_closed")
        poller.join(30)
        proxy.set_mode("healthy")
        assert "command" in got, f"the runtime's poll failed ({got.get('error')!r}); the plane marked command " \
            f"{cid} {plane.store.command(1, cid)['status']!r} and will never hand it out again"
    finally:
        stop.set()
        proxy.close()
        plane.stop()


def test_a_kill_between_the_poll_leaving_the_runtime_and_the_proxy_counting_it_loses_a_command(tmp_path):
    """HandOuts.when_quiet counts a hand-out from `begin()`, which the proxy calls only after it
    has read and classified the request. A poll the runtime already sent but the proxy's handler
    thread has not yet counted (scheduling, a loaded 2-core box) is invisible to it: the kill
    goes ahead, the proxy then forwards the orphaned poll, the plane hands the command out to
    a dead socket. The stall below stands in for that handler thread being scheduled late."""
    plane = RecordingPlane(tmp_path / "plane.db", tokens={BOOT: 1}).start()
    stop = threading.Event()
    proxy = FaultProxy(("127.0.0.1", plane.port), random.Random(1), stop)
    killed = threading.Event()
    real_begin = proxy.handouts.begin

    def late_begin():
        killed.wait(10)  # the handler thread runs only after the soak decided to kill
        real_begin()

    proxy.handouts.begin = late_begin
    try:
        agent = Agent(proxy.url, instance_id=1, agent_id=AGENT)
        assert agent.register().status_code == 200
        cid = plane.store.enqueue(1, "collect_system_info")
        got = {}

        def poll():  # the runtime's poller; its process is killed while the poll is in the proxy
            try:
                got["command"] = agent.next()
            except (requests.RequestException, AssertionError) as exc:
                got["error"] = exc

        poller = threading.Thread(target=poll)
        poller.start()
        threading.Event().wait(0.3)  # the request has left the runtime
        proxy.handouts.when_quiet(lambda: (got.setdefault("killed", True), agent.http.close(), killed.set()), stop)
        poller.join(30)
        assert plane.store.command(1, cid)["status"] == "pending", \
            "the kill was not held: the plane handed the command out after the runtime died"
    finally:
        killed.set()
        stop.set()
        proxy.close()
        plane.stop()
