"""A command the plane handed out and the runtime never journaled (issue 41: the 1,136th of a
10,000-command run at a load of 40-80 stayed `dispatched`, never started). ClawManager hands
a command out once and never again (shared/clawmanager-notes.md, "GET /commands/next"), so
every way between the plane's `next` answer and `Life.take` that drops the answer loses the
command for good. The poller (daemon/poller.py) drops it on any `CalderaError` of
`client.next_command`; these tests drive that fetch against the embedded plane.

`Transport.request` discarded an answer it had read whole when the request's deadline watch
fired after the read and before its check ("answer cut short"). A JSON answer that parsed is
complete (a cut envelope does not parse), so only a raw or streamed answer needs that check
now; a `next` that got no whole answer is logged as a warning naming the possible loss.
"""
import threading
import time
import types

import pytest

from caldera.daemon.executor import Executor
from caldera.daemon.life import Life
from caldera.daemon.poller import fetch_one, poll_once
from caldera.host.statefile import StateFile
from caldera.protocol.client import ControlPlaneClient, CutShort, Retryable, Transport
from caldera.protocol.outbox import Outbox
from caldera.protocol.retry import Backoff
from caldera.redact import Redactor

PlaneServer = pytest.importorskip("caldera.plane.server").PlaneServer
BOOT = "boot-token-for-lost-next-1234"


@pytest.fixture
def plane(tmp_path):
    server = PlaneServer(str(tmp_path / "plane.db"), tokens={BOOT: 1}).start()
    yield server
    server.stop()


def connect(plane, tmp_path):
    """A client with a session of the plane's, and a life on a state dir of its own."""
    token = plane.store.register(1, {"agent_id": "lost-next", "agent_version": "t", "protocol_version": "v1"},
                                 None)["session_token"]
    auth = types.SimpleNamespace(bootstrap_token=BOOT, agent_id=None, token=lambda: token, renew=lambda old: token)
    client = ControlPlaneClient(Transport(plane.url), auth)
    life = Life(agent_id="lost-next", client=client, state=StateFile(tmp_path / "state.json"),
                outbox=Outbox(tmp_path / "outbox"), redactor=Redactor(),
                executor=Executor(client=client, bind=lambda call: lambda payload: {}), report_now=lambda: None)
    return client, life


def plane_command(plane, command_id):
    return next(c for c in plane.store.commands(1) if c["id"] == command_id)


def test_a_next_answer_read_whole_is_kept_when_the_deadline_fires_just_after(plane, tmp_path, monkeypatch):
    client, life = connect(plane, tmp_path)
    command_id = plane.store.enqueue(1, "collect_system_info", {}, 60)
    answer = Transport._answer

    def read_then_deadline(self, *args, **kwargs):
        data = answer(self, *args, **kwargs)  # the whole answer is read and parsed ...
        self.watches.current().fire("deadline")  # ... then the request's timer fires (a loaded machine)
        return data

    monkeypatch.setattr(Transport, "_answer", read_then_deadline)
    try:
        command = fetch_one(client, life)
    except Retryable as exc:
        command = None
        dropped = str(exc)
    else:
        dropped = ""
    assert plane_command(plane, command_id)["status"] == "dispatched"  # the plane gave it out, once
    assert command is not None and command.id == command_id, f"the command was dropped: {dropped}"
    assert str(command_id) in (life.state.get("commands") or {})


def test_a_next_answer_later_than_the_deadline_leaves_the_command_dispatched_for_good(plane, tmp_path, monkeypatch):
    """What no client can mend: the plane dispatched the command and its answer came after
    the request's deadline. The command stays dispatched and is never offered again (as in
    ClawManager): the protocol's limit, documented in docs/performance.md, section 10."""
    client, life = connect(plane, tmp_path)
    command_id = plane.store.enqueue(1, "collect_system_info", {}, 60)
    dispatch = plane.store.next_command

    def slow_after_dispatch(*args, **kwargs):
        handed = dispatch(*args, **kwargs)
        threading.Event().wait(1.0)  # a saturated plane: committed, the answer not written yet
        return handed

    monkeypatch.setattr(plane.store, "next_command", slow_after_dispatch)
    with client.within(time.monotonic() + 0.3), pytest.raises(CutShort):
        fetch_one(client, life)
    monkeypatch.setattr(plane.store, "next_command", dispatch)
    assert fetch_one(client, life) is None  # never offered again
    command = plane_command(plane, command_id)
    assert command["status"] == "dispatched" and not command.get("started_at")
    assert not life.state.get("commands")


def test_a_poll_that_got_no_whole_answer_says_a_command_may_be_lost(plane, tmp_path, monkeypatch, caplog):
    """The daemon's log is the one place such a loss can be seen: a warning, not the quiet
    debug line of a plane that is down."""
    client, life = connect(plane, tmp_path)
    plane.store.enqueue(1, "collect_system_info", {}, 60)
    dispatch = plane.store.next_command

    def slow_after_dispatch(*args, **kwargs):
        handed = dispatch(*args, **kwargs)
        threading.Event().wait(1.0)
        return handed

    monkeypatch.setattr(plane.store, "next_command", slow_after_dispatch)
    lanes = types.SimpleNamespace(ready=lambda: True)
    live = types.SimpleNamespace(tick=lambda name: None)
    wake = types.SimpleNamespace(stop=threading.Event())
    auth = types.SimpleNamespace(info=None)
    with client.within(time.monotonic() + 0.3):
        delay = poll_once(client, auth, life, lanes, wake, live, Backoff())
    assert delay > 0
    warned = [r for r in caldera_records(caplog) if r.levelname == "WARNING"]
    assert warned and "is lost" in warned[0].getMessage()


def caldera_records(caplog):
    return [r for r in caplog.records if r.name.startswith("caldera")]
