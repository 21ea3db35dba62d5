"""No loop thread dies of an exception (issue 26): each test injects errors into one loop's
body (a full disk, no descriptors left, a bug), then lets it behave, and checks that the thread
is still alive and does its job again. The agent-side loops: tests/agents/test_agents_loop_survival.py,
the run-events poster and codex's stderr reader: tests/backends/, the signal relay: tests/host/."""
import errno
import re
import threading

import pytest
from core_helpers import install_agent, make_parts
from daemon_helpers import wait_for
from fault_helpers import API
from fault_inject_helpers import Faulty, enospc

from caldera.daemon import lanes as lanes_module
from caldera.daemon import run as run_module
from caldera.daemon import sender
from caldera.daemon.lanes import Lanes
from caldera.daemon.reporter import report_loop
from caldera.protocol.command import parse_command
from caldera.skills import store, watcher

WAIT = 30.0  # generous: the loops back off 1 s, then 2 s, between the injected faults


@pytest.fixture
def registered(wire):
    wire.route("POST", API + "/register", json={"success": True, "data": {"session_token": "agt_sess_x1234567"}},
               required=False)
    return wire


@pytest.fixture
def rt(caldera_env, registered):
    install_agent(caldera_env, base_url=registered.url)
    parts = make_parts(with_driver=False)
    yield parts
    parts.wake.shutdown()
    parts.pool.shutdown(wait=False)


@pytest.fixture
def start(rt):
    """start(name, body, *args): the loop in a thread of its own, ended and joined at the end."""
    threads = []

    def start_one(name, body, *args):
        thread = threading.Thread(target=body, name=name, args=args, daemon=True)
        thread.start()
        threads.append(thread)
        return thread

    yield start_one
    rt.wake.shutdown()
    for thread in threads:
        thread.join(WAIT)


def test_reporter_survives_a_status_snapshot_that_cannot_be_written(rt, registered, start):
    """status.json on a full disk: before, the error ended the reporter for good."""
    reports = []
    registered.route("POST", API + "/state/report",
               callback=lambda request: (reports.append(1), (200, {}, '{"success":true}'))[1])
    snapshot = Faulty(lambda: None, times=2)
    thread = start("reporter", report_loop, rt.client, rt.reports, rt.wake, rt.live, lambda: 0.1,
                   rt.redactor, snapshot)
    wait_for(lambda: snapshot.calls >= 3, timeout=WAIT, what="a report after the snapshot's faults")
    sent = len(reports)
    wait_for(lambda: len(reports) > sent, timeout=WAIT, what="the reporter reporting again")
    assert thread.is_alive()


def test_sender_survives_an_outbox_it_cannot_list_and_then_delivers_the_entry(rt, registered, start):
    """No descriptors left (EMFILE): the pass fails, and so did the depth its log line asked
    for, inside the handler: the sender died and the finish stayed undelivered until a restart."""
    finishes = []
    registered.route("POST", re.compile(API + r"/commands/\d+/finish$"),
               callback=lambda request: (finishes.append(request.path), (200, {}, '{"success":true}'))[1])
    rt.outbox.put("finish", {"command_id": 41, "body": {"status": "succeeded"}})
    rt.outbox._names = Faulty(rt.outbox._names, times=2, error=lambda: OSError(errno.EMFILE, "Too many open files"))
    thread = start("sender", sender.sender_loop, rt.client, rt.outbox, rt.wake, rt.live, rt.redactor)
    wait_for(lambda: finishes, timeout=WAIT, what="the finish delivered after the faults")
    assert finishes[0].endswith("/commands/41/finish")
    wait_for(lambda: rt.outbox.depth() == 0, timeout=WAIT, what="the delivered entry gone")
    assert thread.is_alive()


def test_sender_keeps_an_entry_it_failed_to_send(rt, registered, start):
    """A bug in the delivery (not the plane's answer): the entry stays and goes out later."""
    finishes = []
    registered.route("POST", re.compile(API + r"/commands/\d+/finish$"),
               callback=lambda request: (finishes.append(request.path), (200, {}, '{"success":true}'))[1])
    rt.outbox.put("finish", {"command_id": 42, "body": {"status": "succeeded"}})
    rt.client.finish_command = Faulty(rt.client.finish_command, times=2, error=lambda: RuntimeError("a bug"))
    thread = start("sender", sender.sender_loop, rt.client, rt.outbox, rt.wake, rt.live, rt.redactor)
    wait_for(lambda: rt.client.finish_command.calls >= 3 and rt.outbox.depth() == 0, timeout=WAIT,
             what="the entry delivered after the faults")
    assert len(finishes) == 1 and thread.is_alive()


class FailingLife:
    """run() raises for the first `times` commands (having settled them itself, as Life.run
    does: tests/daemon/test_daemon_life.py), then records the ones it runs."""

    def __init__(self, times):
        self.left, self.ran, self.settled = times, [], []

    def run(self, command, cancel):
        if self.left > 0:
            self.left -= 1
            self.settled.append(command.id)
            raise enospc()
        self.ran.append(command.id)


def command(number, command_type="pause"):
    return parse_command({"id": number, "command_type": command_type, "payload": {}})


def test_a_lane_survives_failing_commands_says_so_once_and_runs_the_next(monkeypatch, caplog):
    monkeypatch.setattr(lanes_module, "LANE_BACKOFF", (0.05,), raising=False)  # quick backoff
    executor = FailingLife(times=3)
    lanes = Lanes(executor, on_idle=lambda: None)  # type: ignore[arg-type]
    lanes.start()
    try:
        for number in (1, 2, 3, 4):
            lanes.submit(command(number))
        wait_for(lambda: executor.ran == [4], timeout=WAIT, what="the command after the failing ones")
        wait_for(lanes.ready, timeout=WAIT, what="the lanes ready again")  # no pending count lost
        assert lanes.idle()
        lanes.submit(command(5))
        wait_for(lambda: executor.ran == [4, 5], timeout=WAIT, what="the lane still running commands")
    finally:
        assert lanes.close(timeout=WAIT)
    # The same error three times: one line with its traceback, not three (a full disk would repeat it
    # for every command); each command is still named once.
    assert caplog.text.count("Traceback") == 1
    assert executor.settled == [1, 2, 3]


def test_skills_watcher_survives_a_failed_recovery_and_publishes_after(rt, registered, start, monkeypatch):
    """The swap recovery before the first scan raised outside any handler: no watcher, no inventory."""
    inventories = []
    registered.route("POST", API + "/skills/inventory", required=False,
               callback=lambda request: (inventories.append(1), (200, {}, '{"success":true}'))[1])
    recover = Faulty(store.recover, times=2)
    monkeypatch.setattr(store, "recover", recover)
    thread = start("skills", watcher.skills_loop, rt.publisher, rt.wake, rt.live)
    wait_for(lambda: recover.calls >= 3, timeout=WAIT, what="the recovery tried again")
    wait_for(lambda: any(name.endswith("-inventory.json") for name in rt.outbox._names()), timeout=WAIT,
             what="an inventory queued after the faults")
    assert thread.is_alive()


class OneHup:
    """The daemon's Signals as the main loop sees it: one SIGHUP, then a SIGTERM."""

    def __init__(self):
        self.count, self.hups = 0, 1

    def wait(self, timeout):
        pass

    def take_hup(self):
        if self.hups:
            self.hups -= 1
            return True
        self.count = 1  # the reload was handled: stop now
        return False


def test_the_main_loop_survives_a_reload_that_raises(rt, monkeypatch):
    """A bug in SIGHUP's re-read ended the main thread, and with it the daemon."""
    reread = Faulty(lambda parts: False, times=1, error=lambda: RuntimeError("a bug in the reload"))
    monkeypatch.setattr(run_module, "reread", reread)
    assert run_module._run_local(rt, OneHup()) == 0
    assert reread.calls == 1
