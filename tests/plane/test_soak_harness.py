"""The chaos soak's proxy never loses a command by its own hand (bench/soak_plane.py,
docs/reliability.md "Episode kinds"). The plane marks a command dispatched as it answers
`commands/next` and never hands it out again (SPEC §5): from that answer until the runtime
keeps the command durably, a SIGKILL or a cut connection loses it whatever the runtime does,
and the soak's accounting would blame the runtime. `HandOuts.when_quiet` runs the kill and the
port_closed cut only once no answer is on the wire and every command handed out is confirmed
(past 'dispatched' at the plane, or in the runtime's journal or outbox); a poll the proxy
counts after the kill finds its client gone and is not forwarded."""
import json
import random
import socket
import sys
import threading
import types
from pathlib import Path

import pytest
import requests
from plane_helpers import AGENT, BOOT, Agent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import soak_plane  # noqa: E402
from soak_plane import FaultProxy, RecordingPlane, durably_kept  # noqa: E402

WAIT = 30.0  # generous: the machine may be loaded


@pytest.fixture
def soak(tmp_path):
    """A recording plane behind the fault proxy, an agent registered through it, and the
    runtime's state dir the proxy looks at for confirmation."""
    plane = RecordingPlane(tmp_path / "plane.db", tokens={BOOT: 1}).start()
    stop = threading.Event()
    state_dir = tmp_path / "state"
    (state_dir / "outbox").mkdir(parents=True)
    proxy = FaultProxy(("127.0.0.1", plane.port), random.Random(1), stop, durably_kept(plane, state_dir))
    agent = Agent(proxy.url, instance_id=1, agent_id=AGENT)
    assert agent.register().status_code == 200
    try:
        yield plane, proxy, agent, state_dir, stop
    finally:
        stop.set()
        proxy.close()
        plane.stop()


def journal(state_dir: Path, *command_ids: int) -> None:
    """What the runtime's Life.journal writes: state.json's "commands", keyed by the id."""
    doc = {"commands": {str(cid): {"phase": "fetched", "command": {"id": cid}} for cid in command_ids}}
    (state_dir / "state.json").write_text(json.dumps(doc))


def until(condition, what: str) -> None:
    pause = threading.Event()
    for _ in range(int(WAIT / 0.05)):
        if condition():
            return
        pause.wait(0.05)
    raise AssertionError(f"not within {WAIT} s: {what}")


def test_the_port_closed_cut_waits_for_a_trickled_hand_out_to_arrive_and_be_journaled(soak):
    """A commands/next answer trickling over 6 s when the port_closed episode begins: the cut
    waits until the answer arrived and the runtime journaled the command, then the port closes."""
    plane, proxy, agent, state_dir, _ = soak
    cid = plane.store.enqueue(1, "collect_system_info")
    proxy.set_mode("trickle")
    got = {}

    def runtime_poll():
        try:
            got["command"] = agent.next()
            journal(state_dir, got["command"]["id"])
        except (requests.RequestException, AssertionError) as exc:
            got["error"] = exc

    poller = threading.Thread(target=runtime_poll)
    poller.start()
    until(lambda: plane.store.command(1, cid)["status"] == "dispatched", "the plane handed the command out")
    held = proxy.set_mode("port_closed")
    poller.join(WAIT)
    assert got.get("command", {}).get("id") == cid, \
        f"the runtime's poll failed ({got.get('error')!r}); the plane will never hand command {cid} out again"
    assert held is not None and held.unconfirmed == [] and held.on_wire == 0
    with pytest.raises(requests.ConnectionError):  # the cut did happen: the port is closed
        requests.get(proxy.url + "/api/v1/agent/commands/next", timeout=WAIT)


def test_a_poll_the_proxy_counts_only_after_the_kill_is_not_forwarded(soak):
    """A poll the runtime sent before it was killed, which the proxy's handler thread reaches
    only after the kill (scheduled late on a loaded box; the stall below stands in for that):
    its client is gone by then, so the poll is not forwarded and the plane keeps the command
    pending for the next runtime."""
    plane, proxy, agent, _, stop = soak
    cid = plane.store.enqueue(1, "collect_system_info")
    reached, killed = threading.Event(), threading.Event()
    real_begin = proxy.handouts.begin

    def late_begin(*args):
        reached.set()
        killed.wait(WAIT)  # the handler thread runs on only after the soak's kill
        return real_begin(*args)

    proxy.handouts.begin = late_begin
    runtime = socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT)
    runtime.sendall(f"GET /api/v1/agent/commands/next HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {agent.token}\r\n\r\n".encode())
    until(reached.is_set, "the proxy read the poll")

    def kill():  # SIGKILL, and the process has exited: its sockets are closed
        runtime.close()
        killed.set()

    held = proxy.handouts.when_quiet(kill, stop)
    gone = "client gone before its poll"
    until(lambda: proxy.counts.get(gone) or plane.store.command(1, cid)["status"] != "pending",
          "the proxy dealt with the orphaned poll")
    assert plane.store.command(1, cid)["status"] == "pending", \
        "the proxy forwarded the dead runtime's poll: the plane handed the command to nobody"
    assert proxy.counts.get(gone) == 1 and held.unconfirmed == []


def test_a_hand_out_holds_the_kill_until_the_journal_keeps_it(soak):
    """A command handed out holds `when_quiet` while state.json does not name it (absent, then
    half-written); once the journal names it the action runs, nothing given up on."""
    plane, proxy, agent, state_dir, stop = soak
    cid = plane.store.enqueue(1, "collect_system_info")
    assert agent.next()["id"] == cid
    looks = []
    confirmed = proxy.handouts._confirmed
    proxy.handouts._confirmed = lambda c: looks.append(c) or confirmed(c)
    ran, result = threading.Event(), {}
    killer = threading.Thread(target=lambda: result.setdefault("held", proxy.handouts.when_quiet(ran.set, stop)))
    killer.start()
    until(lambda: len(looks) >= 2, "when_quiet looked at the state dir")
    assert not ran.is_set(), "the kill went while the command was only on its way to the journal"
    (state_dir / "state.json").write_text('{"commands": {"' + str(cid))  # a write caught half-way
    seen = len(looks)
    until(lambda: len(looks) >= seen + 2, "when_quiet looked at the half-written file")
    assert not ran.is_set(), "a half-written state.json confirmed the command"
    journal(state_dir, cid)
    killer.join(WAIT)
    assert ran.is_set() and result["held"].unconfirmed == []


def test_a_hand_out_is_confirmed_by_the_plane_or_the_outbox_and_named_when_never_confirmed(soak, monkeypatch):
    """Past 'dispatched' at the plane (started), or an outbox item naming it, confirms a command;
    one nothing confirms is given up on at the limit and named in the result."""
    plane, proxy, agent, state_dir, stop = soak
    started = plane.store.enqueue(1, "collect_system_info")
    assert agent.next()["id"] == started
    assert agent.start(started).status_code == 200
    assert proxy.handouts.when_quiet(lambda: None, stop).unconfirmed == []
    outboxed = plane.store.enqueue(1, "settings_get")
    assert agent.next()["id"] == outboxed
    (state_dir / "outbox" / "000000000001-finish.json").write_text(json.dumps({"command_id": outboxed, "body": {}}))
    assert proxy.handouts.when_quiet(lambda: None, stop).unconfirmed == []
    lost = plane.store.enqueue(1, "log_list")
    assert agent.next()["id"] == lost
    monkeypatch.setattr(soak_plane, "KILL_HOLD_LIMIT", 0.5)
    ran = []
    held = proxy.handouts.when_quiet(lambda: ran.append(True), stop)
    assert held.unconfirmed == [lost] and ran == [True]


def _stretch(samples):
    """The soak's kill-free stretch rule over `samples` [(at, rss, threads, fds)] of one pid."""
    import soak  # bench/soak.py (its imports are the harness's own)

    fake = types.SimpleNamespace(plan=types.SimpleNamespace(stretch=(0.0, 600.0)), stretch_at=[0.0, 600.0],
                                 supervisor=types.SimpleNamespace(exits=[]), args=types.SimpleNamespace(short=False),
                                 notes=[], samples=[soak.Sample(at, 7, rss, th, fd) for at, rss, th, fd in samples])
    return soak.Soak._stretch_misses(fake)


def test_the_stretch_rule_reads_floors_so_a_call_in_flight_is_no_leak_and_a_leak_is():
    steady = [(t, 37000, 13, 32) for t in range(60, 600, 2)]
    in_flight = steady[:-1] + [(600, 37100, 13, 38)]  # an adapter call and two connections at the last sample
    assert _stretch(in_flight) == []
    leaking = [(t, 37000, 13, 32 + t // 60) for t in range(60, 600, 2)]  # one fd more each minute
    [miss] = _stretch(leaking)
    assert "open-fd floor 33 -> 41" in miss
    growing = [(t, 30000 + 20 * t, 13, 32) for t in range(60, 600, 2)]
    assert "RSS floor grew" in _stretch(growing)[0]
