"""The run-events poster (issue 40): batches bounded in size and rate, every event delivered
once in seq order after the plane was away (memory full: the rest read back from the run log),
delivery after the turn ended, and a plane without the route asked once per client."""
import threading
import time

import pytest
from daemon_helpers import wait_for

from caldera.backends import poster as poster_mod
from caldera.backends.events import EventSink
from caldera.backends.poster import EventPoster, plane_takes_events
from caldera.backends.runlog import RunLog
from caldera.protocol.client import NotFound, Retryable
from caldera.protocol.retry import Backoff
from caldera.redact import Redactor

WAIT = 20.0


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    """A refused post is tried again after 0.1 s here, not after the runtime's 1, 2, 5… s."""
    monkeypatch.setattr(poster_mod, "Backoff", lambda: Backoff(steps=(0.1,), jitter=0))


class Plane:
    """post_run_events: refused (503) while `away` is set, else kept with the time it came."""

    def __init__(self, away=False):
        self.away = threading.Event()
        if away:
            self.away.set()
        self.posts, self.refused = [], 0
        self.lock = threading.Lock()

    def post_run_events(self, run_id, body):
        if self.away.is_set():
            self.refused += 1
            raise Retryable(503, "plane is away")
        with self.lock:
            self.posts.append((time.monotonic(), body["events"]))

    def seqs(self):
        with self.lock:
            return [e["seq"] for _, events in self.posts for e in events]


def _turn(tmp_path, client, count, text="x", **poster_args):
    """`count` events through a real sink and run log, the poster listening; returns the poster."""
    log = RunLog(tmp_path / "run-r1.log", Redactor())
    poster = EventPoster(client, "caldera-7-main", "r1", lambda text: None, log_file=tmp_path / "run-r1.log",
                         **poster_args)
    sink = EventSink("r1", Redactor(), log, [poster])
    for n in range(count - 1):
        sink.emit("assistant_message", {"text": f"{text} {n}"})
    sink.emit("terminal_status", {"status": "completed", "failure_kind": None})
    return poster, log


def test_batches_are_bounded_in_count_and_rate(tmp_path):
    plane = Plane()
    poster, log = _turn(tmp_path, plane, 1000)
    log.close()
    poster.close(timeout=WAIT)
    assert plane.seqs() == list(range(1, 1001))
    sizes = [len(events) for _, events in plane.posts]
    assert max(sizes) <= poster_mod.BATCH_EVENTS and len(sizes) >= 1000 / poster_mod.BATCH_EVENTS
    gaps = [b[0] - a[0] for a, b in zip(plane.posts, plane.posts[1:], strict=False)]
    assert min(gaps) >= poster_mod.GAP_SECONDS * 0.9, gaps


def test_a_batch_stays_under_its_byte_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(poster_mod, "BATCH_BYTES", 4096)
    plane = Plane()
    poster, log = _turn(tmp_path, plane, 30, text="y" * 500)
    log.close()
    poster.close(timeout=WAIT)
    assert plane.seqs() == list(range(1, 31))
    assert max(len(events) for _, events in plane.posts) <= 8  # ~560 bytes each: 7 fit in 4 KiB


def test_a_plane_away_during_the_turn_gets_every_event_once_in_order(tmp_path, monkeypatch):
    """Memory keeps 50; the other 250 are read back from the run log once the plane is back."""
    monkeypatch.setattr(poster_mod, "MAX_PENDING", 50)
    plane = Plane(away=True)
    poster, log = _turn(tmp_path, plane, 300)
    assert len(poster.pending) == 50 and poster.spilled
    wait_for(lambda: plane.refused >= 1, timeout=WAIT, what="the poster trying the away plane")
    log.close()
    plane.away.clear()
    poster.close(timeout=WAIT)
    assert plane.seqs() == list(range(1, 301)) and poster.dropped == 0


def test_a_plane_back_after_the_turn_still_gets_the_events(tmp_path, monkeypatch):
    monkeypatch.setattr(poster_mod, "MAX_PENDING", 10)
    plane = Plane(away=True)
    poster, log = _turn(tmp_path, plane, 50)
    log.close()
    poster.close(timeout=0.3)  # the handler returns; the poster goes on in the background
    assert poster.thread.is_alive() and plane.seqs() == []
    plane.away.clear()
    wait_for(lambda: plane.seqs() == list(range(1, 51)), timeout=WAIT, what="every event after the plane came back")
    poster.thread.join(WAIT)
    assert not poster.thread.is_alive()


def test_a_run_id_used_again_sends_only_its_own_events(tmp_path, monkeypatch):
    """The run log of a run id used before holds the old run's events first: never read back."""
    monkeypatch.setattr(poster_mod, "MAX_PENDING", 5)
    old = RunLog(tmp_path / "run-r1.log", Redactor())
    EventSink("r1", Redactor(), old).emit("assistant_message", {"text": "the old run"})
    old.close()
    plane = Plane(away=True)
    poster, log = _turn(tmp_path, plane, 20, text="new")
    log.close()
    plane.away.clear()
    poster.close(timeout=WAIT)
    texts = [e["data"].get("text") for _, events in plane.posts for e in events]
    assert plane.seqs() == list(range(1, 21)) and "the old run" not in texts


def test_a_plane_without_the_route_is_asked_once_per_client(tmp_path):
    class NoRoute:
        calls = 0

        def post_run_events(self, run_id, body):
            NoRoute.calls += 1
            raise NotFound(404, "")

    client, notes = NoRoute(), []
    first = EventPoster(client, "caldera-7-main", "r1", notes.append)
    first({"seq": 1})
    first.close(timeout=WAIT)
    assert NoRoute.calls == 1 and not plane_takes_events(client)
    assert notes == [poster_mod.NO_ROUTE_SENTENCE]
    assert plane_takes_events(NoRoute())  # another client (another runtime) asks again


@pytest.mark.parametrize("size", [1, 250])
def test_events_arrive_while_the_turn_runs(tmp_path, size):
    """A tool call reaches the plane while the turn goes on (nothing waits for the end)."""
    plane = Plane()
    log = RunLog(tmp_path / "run-r1.log", Redactor())
    poster = EventPoster(plane, "caldera-7-main", "r1", lambda text: None, log_file=tmp_path / "run-r1.log")
    sink = EventSink("r1", Redactor(), log, [poster])
    for n in range(size):
        sink.emit("assistant_message", {"text": f"{n}"})
    sink.emit("tool_call", {"tool": "command", "command": "sleep 600", "status": "started"})
    wait_for(lambda: size + 1 in plane.seqs(), timeout=5, what="the started tool call at the plane")
    sink.emit("terminal_status", {"status": "completed", "failure_kind": None})
    log.close()
    poster.close(timeout=WAIT)
    assert plane.seqs() == list(range(1, size + 3))


def _listening(tmp_path, plane):
    """A run log and a sink with the poster listening: (poster, log, sink)."""
    log = RunLog(tmp_path / "run-r1.log", Redactor())
    poster = EventPoster(plane, "caldera-7-main", "r1", lambda text: None, log_file=tmp_path / "run-r1.log")
    return poster, log, EventSink("r1", Redactor(), log, [poster])


def _end_with_the_plane_back(plane, poster, log, sink):
    """The turn's end, then the plane back: the poster delivers what waited and stops."""
    sink.emit("terminal_status", {"status": "completed", "failure_kind": None})
    log.close()
    plane.away.clear()
    poster.close(timeout=WAIT)


def test_a_line_longer_than_the_read_cap_does_not_stop_the_read_back(tmp_path, monkeypatch):
    """A backend's stdout line of 300 KiB (no event) among the spilled events: skipped to its
    newline, and every event after it still reaches the plane."""
    monkeypatch.setattr(poster_mod, "MAX_PENDING", 5)
    plane = Plane(away=True)
    poster, log, sink = _listening(tmp_path, plane)
    for n in range(19):
        sink.emit("assistant_message", {"text": f"{n}"})
        if n == 8:
            log.write("s2c", "A" * (300 * 1024))
    _end_with_the_plane_back(plane, poster, log, sink)
    assert plane.seqs() == list(range(1, 21)) and poster.dropped == 0


def test_a_long_line_still_being_written_is_read_once_it_is_whole(tmp_path):
    path = tmp_path / "run-r1.log"
    start = b"2026 event " + b'{"seq": 1, "data": "' + b"x" * (poster_mod.LOG_LINE_MAX + 10)
    path.write_bytes(start)
    assert poster_mod._read_events(path, 0, 0, 10) == ([], 0)
    with open(path, "ab") as fh:
        fh.write(b'"}\n2026 event {"seq": 2}\n')
    found, offset = poster_mod._read_events(path, 0, 0, 10)
    assert [e["seq"] for e in found] == [2] and offset == path.stat().st_size  # the long one skipped


def test_memory_holds_a_bounded_number_of_bytes(tmp_path, monkeypatch):
    """Big events (64 KiB diffs) spill to the run log past MAX_PENDING_BYTES, not only past
    MAX_PENDING events; all of them still arrive."""
    monkeypatch.setattr(poster_mod, "MAX_PENDING_BYTES", 256 * 1024)
    plane = Plane(away=True)
    poster, log, sink = _listening(tmp_path, plane)
    for n in range(20):
        sink.emit("diff", {"diff": f"{n}" + "d" * 64 * 1024, "bytes": 65536})
    assert poster.spilled and len(poster.pending) <= 5 and poster.pending_bytes < 6 * 66 * 1024
    _end_with_the_plane_back(plane, poster, log, sink)
    assert plane.seqs() == list(range(1, 22)) and poster.dropped == 0


def test_the_read_back_never_follows_a_symlink(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text('2026 event {"seq": 1, "data": "not the run log"}\n')
    (tmp_path / "run-r1.log").symlink_to(secret)
    assert poster_mod._read_events(tmp_path / "run-r1.log", 0, 0, 10) == ([], 0)
