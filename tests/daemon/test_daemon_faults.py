"""The daemon and report --once against a hanging or failing plane (issue 13), and the
state-report floor, the oversized command and one-shot retries inside commands.

The bounds given to `wait()` are generous ceilings (before issue 13 these took 88 s and
30 s): they fail only when the stop is not bounded at all, never on a slow machine."""
import json
import signal
import subprocess
import sys
import threading

import pytest
from core_helpers import command_context, install_agent, make_parts
from daemon_helpers import Daemon, wait_for
from fault_helpers import API, FaultPlane

from caldera.daemon.reporter import ReportFloor

INSTANCE = 7


@pytest.fixture
def plane():
    plane = FaultPlane().start()
    yield plane
    plane.stop()


def test_sigterm_ends_run_while_the_server_hangs(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: plane.seen(r"/heartbeat$"), what="first heartbeat")
        plane.fault(r"/(heartbeat|state/report|commands/next|finish|inventory)$", hang=True, times=None)
        plane.commands.append({"id": 1, "command_type": "health_check", "payload": {}})
        wait_for(lambda: [r for r in plane.seen(r"/(state/report|commands/next)$")][-1:], what="a hanging call")
        daemon.signal(__import__("signal").SIGTERM)
        assert daemon.proc.wait(25) == 0
    finally:
        daemon.stop()
    assert "stopped" in daemon.log()


def test_status_json_after_a_stop_shows_what_the_final_flush_left(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    away = plane.fault(r"/inventory$", status=503, times=None)
    snapshot = caldera_env / "var" / "demo" / "status.json"
    daemon = Daemon()
    try:
        wait_for(lambda: plane.seen(r"/inventory$"), what="a refused inventory")
        wait_for(lambda: snapshot.exists() and json.loads(snapshot.read_text())["outbox"]["items"] == 1,
                 what="the kept inventory in status.json")
        with plane._lock:
            plane.faults.remove(away)
        daemon.signal(signal.SIGTERM)
        assert daemon.proc.wait(25) == 0
    finally:
        daemon.stop()
    assert json.loads(snapshot.read_text())["outbox"]["items"] == 0  # delivered by the final flush


def test_report_once_returns_by_its_deadline_while_the_server_trickles(caldera_env, plane):
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    plane.fault(r"/heartbeat$", size=2000, body=b'{"success":true,"data":{}}', trickle=0.2, times=None)
    env = {k: v for k, v in __import__("os").environ.items()}
    proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "report", "--once", "--agent", "demo",
                             "--deadline", "3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and b"not delivered" in err


# ------------------------------------------------------------------ 6. one 2 s floor for every report

class Waits(threading.Event):
    def __init__(self):
        super().__init__()
        self.asked = []

    def wait(self, timeout=None):
        self.asked.append(timeout)
        return False


class Clock:
    def __init__(self):
        self.now, self.calls = 100.0, 0

    def __call__(self):
        self.calls += 1
        return self.now


class Client:
    def __init__(self, clock, gate=None):
        self.bodies, self.clock, self.gate = [], clock, gate

    def state_report(self, body):
        if self.gate is not None:
            self.gate.wait(10)
            self.clock.now += 1  # delivered after the second caller arrived
        self.bodies.append(body)


def test_the_floor_spaces_every_report_2_s_apart():
    clock = Clock()
    floor, client, waits = ReportFloor(clock=clock), Client(clock), Waits()
    assert floor.send(client, lambda: {"n": 1}, waits) == ({"n": 1}, True)
    clock.now += 0.5
    floor.send(client, lambda: {"n": 2}, waits)
    assert waits.asked == [pytest.approx(1.5)]  # the second waited out the floor
    clock.now += 5
    floor.send(client, lambda: {"n": 3}, waits)
    assert waits.asked == [pytest.approx(1.5)] and len(client.bodies) == 3


def test_a_report_asked_for_while_another_is_sent_takes_that_one():
    clock, gate = Clock(), threading.Event()
    floor, client = ReportFloor(clock=clock), Client(clock, gate)
    first = threading.Thread(target=floor.send, args=(client, lambda: {"n": 1}, threading.Event()))
    first.start()
    wait_for(lambda: floor.last_body is not None, what="first report being sent")
    result, calls = {}, clock.calls
    second = threading.Thread(target=lambda: result.update(
        r=floor.send(client, lambda: {"n": 2}, Waits(), coalesce=True)))
    second.start()
    wait_for(lambda: clock.calls > calls, what="the second caller arrived")
    gate.set()
    first.join(10)
    second.join(10)
    assert result["r"] == ({"n": 1}, False) and client.bodies == [{"n": 1}]  # coalesced: one report


def test_a_burst_of_collect_system_info_is_answered_by_one_report_without_waiting(caldera_env):
    """The floor limits reports, not commands: within 2 s of a report, the next
    collect_system_info/health_check takes it (and asks the reporter for a fresh one)."""
    from caldera.daemon import builtin

    install_agent(caldera_env)
    parts = make_parts(with_driver=False)
    clock = Clock()
    waits = Waits()
    object.__setattr__(parts.reports, "floor", ReportFloor(clock=clock))
    client = Client(clock)
    ctx = command_context(builtin.BuiltinCall, "collect_system_info", cancel=waits, client=client,
                          reports=parts.reports, report_soon=parts.wake.report_soon)
    for _ in range(3):
        assert builtin.collect_system_info(ctx, {})["report_delivered"] is True
        assert builtin.health_check(ctx, {})["report_delivered"] is True
        clock.now += 0.3
    assert waits.asked == [] and len(client.bodies) == 1  # six answers, one report, no wait
    assert parts.wake.report.is_set()  # the reporter sends a fresh one once the floor allows
    clock.now += 2.0
    builtin.collect_system_info(ctx, {})
    assert waits.asked == [] and len(client.bodies) == 2  # past the floor: a report of its own
    parts.pool.shutdown(wait=False)


# ------------------------------------------------------------------ 5. an oversized command is finished failed

def test_a_command_too_large_to_read_is_finished_failed(caldera_env):
    from caldera.daemon.executor import Executor
    from caldera.daemon.life import Life
    from caldera.protocol.command import parse_command

    install_agent(caldera_env)
    parts = make_parts(with_driver=False)

    class StartOk:
        def start_command(self, cid, body):
            pass

    life = Life(agent_id="a", client=StartOk(), state=parts.state, outbox=parts.outbox, redactor=parts.redactor,
                executor=Executor(client=StartOk(), bind=None), report_now=lambda: None)
    stub = parse_command({"id": 12, "command_type": "settings_set"}, too_large="over 8388608 bytes")
    life.journal(stub)
    assert life.run(stub) == "failed"
    [item] = [i for _, i in parts.outbox.items() if i["kind"] == "finish"]
    assert item["command_id"] == 12 and item["body"]["error_message"].startswith("payload too large")
    parts.pool.shutdown(wait=False)


def test_the_poller_journals_an_oversized_command(caldera_env, plane):
    from caldera.daemon.life import life_for
    from caldera.daemon.poller import fetch_one
    from caldera.protocol.client import NEXT_CAP

    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    parts = make_parts(with_driver=False)
    plane.fault(API + "/commands/next$", size=NEXT_CAP + 10,
                body=b'{"success":true,"data":{"command":{"id":77,"command_type":"log_get","payload":{"x":"')
    executor = life_for(parts)
    command = fetch_one(parts.client, executor)
    assert command.id == 77 and "77" in parts.state.get("commands")
    assert command.refusal.startswith("payload too large") and command.payload == {}
    [again] = executor.recover()  # after a restart, the journal still knows it was too large
    assert again.id == 77 and again.refusal == command.refusal
    parts.pool.shutdown(wait=False)


def test_a_report_built_before_a_change_does_not_answer_a_command(caldera_env):
    """pause (or install_skill) then collect_system_info within 2 s: the answer was the report
    built before the pause. A change bumps the generation; read-only commands do not."""
    from caldera.daemon import builtin

    install_agent(caldera_env)
    parts = make_parts(with_driver=False)
    clock, waits = Clock(), Waits()
    object.__setattr__(parts.reports, "floor", ReportFloor(clock=clock, generation=parts.wake.generation))
    client = Client(clock)
    ctx = command_context(builtin.BuiltinCall, "collect_system_info", cancel=waits, client=client,
                          reports=parts.reports, report_soon=parts.wake.report_soon)
    builtin.collect_system_info(ctx, {})
    clock.now += 0.3
    builtin.health_check(ctx, {})  # read-only: the recent report answers it
    assert len(client.bodies) == 1
    parts.wake.report_now()  # what a pause or an install_skill does
    clock.now += 0.3
    builtin.collect_system_info(ctx, {})
    assert len(client.bodies) == 2  # a report of its own, built after the change
    assert waits.asked == [pytest.approx(1.4)]  # it waited out the floor (a Waits never blocks)
    parts.pool.shutdown(wait=False)


def test_read_only_commands_do_not_make_the_recent_report_stale():
    from caldera.daemon.life import READ_ONLY

    assert {"health_check", "collect_system_info", "log_list", "settings_get"} <= READ_ONLY
    assert not {"pause", "resume", "install_skill", "settings_set", "apply_config_revision"} & READ_ONLY


def test_a_finish_being_answered_when_the_stop_comes_reaches_the_plane_once(caldera_env, plane):
    """The stop lets a request that is being answered finish before it interrupts the rest: a
    finish the plane had taken, cut off before its answer, stayed in the outbox and the final
    flush sent it a second time (issue 35's CI saw a finish twice at an `apt-get remove`)."""
    install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE)
    daemon = Daemon()
    try:
        wait_for(lambda: plane.seen(r"/heartbeat$"), what="first heartbeat")
        plane.fault(r"/commands/1/finish$", delay=0.5)  # taken at once, answered half a second later
        plane.commands.append({"id": 1, "command_type": "health_check", "payload": {}})
        wait_for(lambda: plane.seen(r"/commands/1/finish$"), what="the finish at the plane")
        daemon.signal(signal.SIGTERM)  # while its answer is on the way
        assert daemon.proc.wait(25) == 0
    finally:
        daemon.stop()
    assert len(plane.seen(r"/commands/1/finish$")) == 1, daemon.log()[-3000:]
