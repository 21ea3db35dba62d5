"""A command's life (caldera/daemon/life.py): one test per step of its table, an illegal step
refused, and a kill -9 after each persisted state followed by a restart that finishes the
command exactly once at the plane."""
import errno
import threading
import types

import pytest

from caldera.daemon import life as life_module
from caldera.daemon import sender
from caldera.daemon.executor import Executor
from caldera.daemon.life import INTERRUPTED, STEPS, IllegalTransition, Life, State
from caldera.host.statefile import StateFile
from caldera.protocol.client import NotFound, Retryable
from caldera.protocol.command import parse_command
from caldera.protocol.handlers import Bound
from caldera.protocol.outbox import Outbox
from caldera.redact import Redactor


class Plane:
    """The control plane as the life sees it: what it was sent, per command."""

    def __init__(self, start_error=None):
        self.starts, self.finishes, self.start_error = [], [], start_error

    def start_command(self, command_id, body):
        if self.start_error is not None:
            raise self.start_error
        self.starts.append(command_id)

    def finish_command(self, command_id, body):
        self.finishes.append((command_id, body["status"], body.get("error_message")))

    def within(self, deadline):
        import contextlib

        return contextlib.nullcontext()


def handler_of(ran):
    def bind(call) -> Bound:
        if call.command.type == "boom":
            def boom(payload):
                raise RuntimeError("a handler bug")
            return boom
        return lambda payload: ran.append(call.command.id) or {"ok": True}

    return bind


class Runtime:
    """One runtime's life on a state dir; `restart()` is a new process on the same files."""

    def __init__(self, state_dir, plane):
        self.dir, self.plane, self.ran = state_dir, plane, []
        self.restart()

    def restart(self):
        self.state = StateFile(self.dir / "state.json")
        self.outbox = Outbox(self.dir / "outbox")
        self.runs = types.SimpleNamespace(queued=[], forgotten=[])
        runs = types.SimpleNamespace(queue=self.runs.queued.append, forget=self.runs.forgotten.append)
        self.life = Life(agent_id="a", client=self.plane, state=self.state, outbox=self.outbox, redactor=Redactor(),
                         executor=Executor(client=self.plane, bind=handler_of(self.ran)), report_now=lambda: None,
                         runs=runs)
        return self

    def send(self):
        sender.flush(self.plane, self.outbox, threading.Event())

    def journal(self):
        return self.state.get("commands") or {}


@pytest.fixture
def rt(tmp_path):
    return Runtime(tmp_path, Plane())


def raw(number, command_type="pause", **payload):
    return {"id": number, "command_type": command_type, "payload": payload}


def taken(rt, plane_object):
    """What the poller does with a fetched command: parsed, handed to its life; the command
    to hand to a lane, or None."""
    command = parse_command(plane_object)
    return command if rt.life.take(command) else None


def raised(exc):
    """`exc` as a bug leaves it: raised, with its traceback (the place the finish names)."""
    try:
        raise exc
    except type(exc) as caught:
        return caught


# ------------------------------------------------------------------ one test per step

def test_fetched_to_journaled_writes_the_plane_object_and_announces_a_run(rt):
    command = taken(rt, raw(1, "agent_run", run_id="r1", prompt="hi"))
    assert rt.journal()["1"]["phase"] == "fetched" and rt.journal()["1"]["command"] == raw(1, "agent_run", run_id="r1",
                                                                                          prompt="hi")
    assert rt.life.states == {"1": State.JOURNALED} and rt.runs.queued == ["r1"] and command.id == 1


def test_fetched_to_refused_finishes_straight_at_the_plane_and_runs_nothing(rt, monkeypatch):
    monkeypatch.setattr(rt.state, "update", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    assert taken(rt, raw(2)) is None
    [(cid, status, error)] = rt.plane.finishes
    assert (cid, status) == (2, "failed") and error.startswith("not run: the runtime could not record the command")
    assert rt.life.states == {} and rt.plane.starts == [] and rt.ran == []


def test_journaled_to_started_marks_executing_and_sends_the_start(rt):
    command = taken(rt, raw(3))
    seen = {}

    def run_handler(cmd, cancel=None, deadline=None):  # what the plane and the journal say once started
        seen.update(phase=rt.journal()["3"]["phase"], starts=list(rt.plane.starts), state=rt.life.states["3"])
        return "succeeded", {}, ""

    object.__setattr__(rt.life, "executor", types.SimpleNamespace(run_handler=run_handler))
    assert rt.life.run(command) == "succeeded"
    assert seen == {"phase": "executing", "starts": [3], "state": State.RUNNING}


def test_started_to_finished_when_the_plane_refuses_the_start_runs_nothing(tmp_path):
    rt = Runtime(tmp_path, Plane(start_error=NotFound(404, "no such command", from_server=True)))
    command = taken(rt, raw(4))
    assert rt.life.run(command) == "failed" and rt.ran == []
    [(_, item)] = list(rt.outbox.items())
    assert item["body"]["error_message"].startswith("the control plane does not know this command")


def test_running_to_finished_to_finish_queued_records_the_finish_then_drops_the_entry(rt):
    command = taken(rt, raw(5, "agent_run", run_id="r5", prompt="hi", workspace="/w"))
    assert rt.life.run(command) == "succeeded" and rt.ran == [5]
    [(_, item)] = list(rt.outbox.items())
    assert item["kind"] == "finish" and item["body"]["status"] == "succeeded"
    assert rt.journal() == {} and rt.life.states == {} and rt.runs.forgotten == ["r5"]
    assert rt.state.get("recent_commands")[0]["id"] == 5


def test_finish_queued_to_delivered_records_the_id_before_the_item_goes(rt):
    rt.life.run(taken(rt, raw(6)))
    order = []
    real_record, real_done = rt.outbox.record_delivered, rt.outbox.done
    rt.outbox.record_delivered = lambda name, cid: order.append(("record", cid)) or real_record(name, cid)
    rt.outbox.done = lambda name: order.append(("done", name)) or real_done(name)
    rt.send()
    assert order[0] == ("record", "6") and order[1][0] == "done"
    assert rt.plane.finishes == [(6, "succeeded", "")] and rt.outbox.depth() == 0 and rt.outbox.has_finish(6)


def test_a_delivered_record_the_full_disk_refuses_keeps_the_finish_unsent(rt, monkeypatch):
    rt.life.run(taken(rt, raw(7)))
    monkeypatch.setattr(rt.outbox, "_write_delivered", lambda ids: (_ for _ in ()).throw(OSError(errno.ENOSPC, "x")))
    rt.send()
    assert rt.outbox.has_finish(7) and len(rt.outbox._names()) == 1 and rt.outbox.names_in_send_order() == []


@pytest.mark.parametrize("where", ["fetched", "journaled", "started", "running", "finished", "finish queued"])
def test_any_live_state_to_settled_after_a_fault_finishes_once(rt, where, monkeypatch):
    """A bug in each live state: one failed finish (or the one already recorded), the entry gone."""
    command = parse_command(raw(8))
    bug = raised(RuntimeError("a bug"))
    if where == "fetched":
        rt.life.states["8"] = State.FETCHED
    elif where != "journaled":
        rt.life.journal(command)
        steps = {"started": [State.STARTED], "running": [State.STARTED, State.RUNNING],
                 "finished": [State.STARTED, State.RUNNING, State.FINISHED],
                 "finish queued": [State.STARTED, State.RUNNING, State.FINISHED]}[where]
        for target in steps:
            rt.life._move(command, target)
        if where == "finish queued":
            rt.life._put_finish(command, "succeeded", {"ok": True}, "")
            rt.life.states["8"] = State.FINISH_QUEUED
    rt.life.fault(command, bug)
    rt.send()
    [(cid, status, error)] = rt.plane.finishes
    assert cid == 8 and rt.journal() == {} and rt.life.states == {}
    if where == "finish queued":
        assert status == "succeeded"  # its own finish, never a second
    else:
        assert status == "failed" and error.startswith("internal error in the runtime: RuntimeError at")


def test_a_fault_the_full_disk_refuses_leaves_the_command_to_the_next_start(rt, monkeypatch, caplog):
    command = taken(rt, raw(9))
    monkeypatch.setattr(rt.outbox, "put", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    rt.life.fault(command, RuntimeError("a bug"))  # never raises
    assert "command 9 could not be settled (OSError); it stays in the journal" in caplog.text
    assert "9" in rt.journal()


def test_the_step_table_is_the_docstrings_and_an_illegal_step_is_an_error(rt):
    doc = life_module.__doc__
    for source, target in STEPS:
        named = "any live -> settled" if target is State.SETTLED else f"{source.value} -> {target.value}"
        assert named in doc
    command = taken(rt, raw(10))
    with pytest.raises(IllegalTransition, match="command 10: journaled -> finish queued"):
        rt.life._move(command, State.FINISH_QUEUED)
    rt.life.run(command)
    with pytest.raises(IllegalTransition, match="command 10: journaled -> running"):  # gone: the journal's
        rt.life._move(command, State.RUNNING)


def test_a_command_fetched_again_while_alive_is_not_run_twice(rt):
    taken(rt, raw(11))
    assert taken(rt, raw(11)) is None and rt.life.states == {"11": State.JOURNALED}


# ------------------------------------------------------------------ a kill -9 after each persisted state

class Killed(BaseException):
    """The process ends here: nothing after it runs (no `except Exception` catches it)."""


def kill(rt, real):
    def die(*args):
        raise Killed
    return die


def after(rt, real):
    def die(self, *args):
        real(self, *args)
        raise Killed
    return die


def after_delivery(rt, real):
    """The sender delivers the queued finish at once; the process dies before the journal's last write."""
    def die(*args):
        rt.send()
        raise Killed
    return die


CRASHES = {  # the persisted state -> the method that dies right after it is written, and how
    "journaled": ("_announce", kill),
    "started": ("_send_start", kill),
    "finish queued": ("_after_finish", kill),
    "finish queued, entry gone": ("_journal_remove", after),
    "delivered": ("_after_finish", after_delivery),
}


@pytest.mark.parametrize("crash", CRASHES)
def test_a_kill_after_each_persisted_state_then_a_restart_finishes_exactly_once(rt, crash, monkeypatch):
    method, dies = CRASHES[crash]
    with monkeypatch.context() as m:
        m.setattr(Life, method, dies(rt, getattr(Life, method)))
        with pytest.raises(Killed):
            rt.life.run(taken(rt, raw(12, "collect_system_info")))
    rt.restart()
    for command in rt.life.recover():
        rt.life.run(command)
    rt.send()
    rt.restart().send()  # and once more: nothing is sent again
    assert [f[0] for f in rt.plane.finishes] == [12] and rt.journal() == {} and rt.outbox.depth() == 0
    if crash == "started":  # began, no result: settled, never run again
        assert rt.plane.finishes[0][1:] == ("failed", INTERRUPTED) and rt.ran == []
    else:
        assert rt.plane.finishes[0][1] == "succeeded" and rt.ran == [12]  # ran once, before the kill or after
    assert len(rt.plane.starts) <= 1


def test_a_kill_after_a_fault_settled_it_then_a_restart_finishes_exactly_once(rt, monkeypatch):
    command = taken(rt, raw(13, "boom"))
    with monkeypatch.context() as m:
        m.setattr(Life, "_journal_remove", kill(rt, None))  # the failed finish is in the outbox, the entry not yet gone
        with pytest.raises(Killed):
            rt.life.fault(command, RuntimeError("a bug"))
    rt.restart()
    assert rt.life.recover() == []
    rt.send()
    assert [f[:2] for f in rt.plane.finishes] == [(13, "failed")] and rt.journal() == {}


def test_a_kill_after_a_refusal_leaves_nothing_to_finish_again(rt, monkeypatch):
    rt.plane.finish_command = lambda cid, body: (_ for _ in ()).throw(Retryable(None, "away"))
    monkeypatch.setattr(rt.state, "update", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    taken(rt, raw(14))  # the outbox took the refused finish (its own disk had space)
    rt.restart()
    assert rt.life.recover() == []
    rt.plane.finish_command = Plane.finish_command.__get__(rt.plane)
    rt.send()
    assert [f[:2] for f in rt.plane.finishes] == [(14, "failed")]


def test_a_step_of_run_that_raises_is_settled_by_run_and_the_lane_sees_the_error(rt, monkeypatch):
    monkeypatch.setattr(Life, "_send_start", lambda self, command: (_ for _ in ()).throw(RuntimeError("a bug")))
    command = taken(rt, raw(15))
    with pytest.raises(RuntimeError, match="a bug"):  # for the lane's guard: logged, backed off
        rt.life.run(command)
    rt.send()
    [(cid, status, error)] = rt.plane.finishes
    assert (cid, status) == (15, "failed") and error.startswith("internal error in the runtime: RuntimeError at")
    assert rt.journal() == {} and rt.life.states == {}


def test_a_fault_after_the_finish_is_queued_is_known_here_without_asking_the_outbox(rt, monkeypatch):
    monkeypatch.setattr(Life, "_remember", lambda *a: (_ for _ in ()).throw(RuntimeError("a bug after the finish")))
    monkeypatch.setattr(rt.outbox, "has_finish", lambda cid: pytest.fail("the life holds it: no look needed"))
    with pytest.raises(RuntimeError):
        rt.life.run(taken(rt, raw(16)))
    rt.send()
    assert [f[:2] for f in rt.plane.finishes] == [(16, "succeeded")] and rt.journal() == {}
