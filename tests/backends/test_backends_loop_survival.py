"""No loop thread dies of an exception (issue 26): the run-events poster and codex's stderr
reader keep doing their job after injected errors."""
import errno
import io
import threading
from collections import deque

from daemon_helpers import wait_for

from caldera.backends.codex.appserver import pump_stderr
from caldera.backends.poster import EventPoster

WAIT = 30.0


class FlakyClient:
    """post_run_events raises `times` times (an error that is not the plane's answer), then takes."""

    def __init__(self, times):
        self.left, self.calls, self.posted = times, 0, []

    def post_run_events(self, run_id, body):
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise RuntimeError("a bug in the transport")
        self.posted.extend(body["events"])


def test_run_events_poster_survives_an_error_and_posts_the_kept_batch():
    """Before, only the plane's answers (ApiError) were caught: anything else ended the poster,
    and no event of the run reached the plane after it."""
    notes = []
    client = FlakyClient(times=2)
    poster = EventPoster(client, "caldera-7-main", "r1", notes.append)  # type: ignore[arg-type]
    try:
        poster({"seq": 1})
        wait_for(lambda: client.calls >= 1, timeout=WAIT, what="the first post tried")
        poster({"seq": 2})
        wait_for(lambda: client.posted == [{"seq": 1}, {"seq": 2}], timeout=WAIT,
                 what="the kept events posted after the faults")
        assert poster.thread.is_alive()
        poster({"seq": 3})
        wait_for(lambda: client.posted[-1:] == [{"seq": 3}], timeout=WAIT, what="the poster posting again")
    finally:
        poster.close(timeout=WAIT)
    assert client.calls >= 4 and not poster.thread.is_alive()


class FullDiskRunLog:
    def __init__(self, times):
        self.left, self.lines, self.notes = times, [], []

    def write(self, channel, text):
        if self.left > 0:
            self.left -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        self.lines.append(text)

    def note(self, text):
        self.notes.append(text)


def test_codex_stderr_reader_drains_to_the_end_when_the_run_log_cannot_be_written():
    """A run log on a full disk stopped the stderr reader before: codex then blocked on a full
    stderr pipe for the rest of its turn."""
    runlog = FullDiskRunLog(times=2)
    tail: deque[str] = deque()
    stream = io.BytesIO(b"one\ntwo\nthree\nfour\n")
    thread = threading.Thread(target=pump_stderr, args=(stream, tail, runlog), daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()
    assert stream.read() == b""  # read to the end
    assert list(tail) == ["one", "two", "three", "four"]
    assert runlog.lines == ["three", "four"]  # the run log took what it could once the disk did
