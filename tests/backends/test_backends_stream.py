"""The batched stdout path (issue 16): chunked reads, one inbox item per chunk, same records."""
import io
import json
import queue

from caldera.backends import failures as fk
from caldera.backends.codex.appserver import Channel, Dispatcher, pump_stdout
from caldera.backends.codex.backend import handle_batch
from caldera.backends.runlog import RunLog
from caldera.redact import MASK, Redactor


class _Chunks(io.RawIOBase):
    """A pipe that returns at most `size` bytes a read, so lines straddle reads."""

    def __init__(self, data: bytes, size: int):
        self.data, self.size = data, size

    def readable(self):
        return True

    def read1(self, n=-1):
        out, self.data = self.data[:min(n, self.size)], self.data[min(n, self.size):]
        return out


def test_lines_split_across_reads_arrive_whole_and_in_order(tmp_path):
    msgs = [{"method": "item/agentMessage/delta", "params": {"delta": "x" * n}} for n in range(50)]
    data = b"".join(json.dumps(m).encode() + b"\n" for m in msgs) + b'{"method": "last"}'  # no final newline
    log = RunLog(tmp_path / "run.log", Redactor())
    channel = Channel(log)
    pump_stdout(_Chunks(data, 37), channel.reader_end)  # fewer blocks than the channel holds
    got = _channel_items(channel)
    log.close()
    assert [m for _, m in got] == [*msgs, {"method": "last"}]
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert len(lines) == 51 and all(" s2c {" in line for line in lines)


def test_a_bad_line_is_a_fatal_after_the_lines_before_it():
    inbox = queue.Queue()
    Dispatcher(inbox, None).block(b'{"method": "a"}\nnot json\n{"method": "b"}\n\r\n')
    items = []
    while not inbox.empty():
        items.append(inbox.get_nowait())
    assert [k for k, _ in items] == ["batch", "fatal", "batch"]
    assert items[1][1].kind == fk.BACKEND_JSON_PARSE_ERROR
    assert [m["method"] for _, m in items[0][1] + items[2][1]] == ["a", "b"]


def test_a_response_is_released_after_what_came_before_it():
    inbox = queue.Queue()
    dispatcher = Dispatcher(inbox, None)
    slot = dispatcher.expect(7)
    dispatcher.block(b'{"method": "before"}\n{"id": 7, "result": {}}\n')
    assert slot.event.is_set() and slot.message == {"id": 7, "result": {}}
    assert inbox.get_nowait() == ("batch", [("notification", {"method": "before"})])


def test_handle_batch_stops_at_turn_completed():
    seen = []

    class Norm:
        def handler_for(self, method):
            return lambda params: seen.append(method)

    batch = [("notification", {"method": "a"}), ("request", {"method": "ask", "id": 1}),
             ("notification", {"method": "turn/completed", "params": {"turn": {}}}), ("notification", {"method": "z"})]
    asked = []
    done = handle_batch(batch, Norm(), asked.append)
    assert done["method"] == "turn/completed" and seen == ["a"] and asked == [{"method": "ask", "id": 1}]


def test_text_lines_redacts_each_line_as_text_does():
    r = Redactor(["hunter2-secret-value"])
    lines = ['{"authorization": "Bearer abcdefghijklmnop"}', "plain line", "pw hunter2-secret-value here",
             "url https://user:pass@example.com/x", '{"api_key": "k-123456789"}', "token=abc tokenUsage",
             "https://h/p?token=zzz&x=1", "nothing at all"]
    assert r.text_lines(lines) == "\n".join(r.text(line) for line in lines)
    assert MASK in r.text_lines(lines) and "hunter2" not in r.text_lines(lines)


def _channel_items(channel):
    items = []
    while True:
        kind, msg = channel.next(timeout=1)
        if kind == "eof":
            return items
        items.extend(msg if kind == "batch" else [(kind, msg)])


def test_the_channel_parses_on_the_consumer_side_in_order_and_redacts_across_reads(tmp_path):
    """The run path: the reader thread hands bytes over, the turn loop's side parses. A secret
    cut by a read, its JSON-escaped form and a credential behind "=" are masked in the run log;
    a response is routed, and what came before it stays in order."""
    secret = 'pass"word\nsecond-line-of-it'  # travels JSON-escaped: pass\"word\nsecond…
    log = RunLog(tmp_path / "run.log", Redactor([secret]))
    channel = Channel(log)
    slot = channel.dispatcher.expect(3)
    msgs = [{"method": "item/agentMessage/delta", "params": {"delta": f"part {n} " + secret}} for n in range(30)]
    msgs.insert(10, {"method": "x", "params": {"url": "https://h/p?x=1&sig=abcdef012345"}})
    data = b"".join(json.dumps(m).encode() + b"\n" for m in msgs) + b'{"id": 3, "result": {}}\n'
    pump_stdout(_Chunks(data, 29), channel.reader_end)  # 29-byte reads: every secret straddles one
    got = _channel_items(channel)
    log.close()
    assert [m for _, m in got] == msgs and slot.event.is_set() and slot.message == {"id": 3, "result": {}}
    text = (tmp_path / "run.log").read_text()
    assert "pass\\\"word" not in text and "second-line-of-it" not in text and "abcdef012345" not in text
    assert text.count(MASK) == 31


def test_the_channel_fails_waiting_requests_at_eof_after_routing_the_rest():
    channel = Channel(None)
    answered, unanswered = channel.dispatcher.expect(1), channel.dispatcher.expect(2)
    pump_stdout(_Chunks(b'{"id": 1, "result": {"ok": true}}\nnot json\n', 8), channel.reader_end)
    assert not answered.event.is_set()  # nothing is parsed in the reader thread
    kinds = []
    while not kinds or kinds[-1] != "eof":
        kinds.append(channel.next(timeout=1)[0])
    assert kinds == ["fatal", "eof"] and answered.message == {"id": 1, "result": {"ok": True}}
    assert unanswered.event.is_set() and unanswered.message is None


def test_a_full_channel_holds_the_reader_back_until_read_or_closed():
    """Memory stays flat: the reader waits on a full hand-over (and codex on its pipe)
    instead of queueing without bound; closing the channel lets a waiting reader end."""
    import threading

    from caldera.backends.codex.appserver import Handoff

    handoff = queue.Queue(1)
    end = Handoff(handoff, None)
    reader = threading.Thread(target=pump_stdout, args=(_Chunks(b'{"a":1}\n{"b":2}\n{"c":3}\n', 8), end))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and handoff.qsize() == 1  # one block over, the reader waits with the next
    assert handoff.get_nowait() == ("raw", b'{"a":1}')
    end.closed.set()
    reader.join(10)
    assert not reader.is_alive()


def test_close_returns_while_a_process_outside_the_group_holds_stdout(tmp_path):
    # A command codex ran may `setsid` out of the process group: the group's SIGKILL misses
    # it, and it keeps codex's stdout and stderr open. close() used to close the streams
    # under the blocked readers and wait as long as that process lived.
    import os
    import signal
    import threading

    from caldera.backends.codex.appserver import AppServer

    pidfile = tmp_path / "escaped.pid"
    # The escaped process writes its pid once it is out of the group; codex's stand-in waits for it.
    script = (f"setsid sh -c 'echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 60' & "
              f"while [ ! -s {pidfile} ]; do sleep 0.05; done; exit 0")
    redactor = Redactor([])
    log = RunLog(tmp_path / "run.log", redactor)
    server = AppServer(["sh", "-c", script], {"PATH": os.environ["PATH"]}, str(tmp_path), log, redactor)
    server.start()
    try:
        assert server.returncode(10) == 0  # the stand-in is gone; the escaped process holds the pipes
        closer = threading.Thread(target=server.close, kwargs={"grace": 0.5}, daemon=True)
        closer.start()
        closer.join(20)  # bounds a failure only; it returns in about 2 s (the readers' join)
        assert not closer.is_alive(), "close() waited for the escaped process"
        log.close()
        assert "still held open by a process outside the CLI's group" in (tmp_path / "run.log").read_text()
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    # The readers close() left behind end at the escaped process's death; their streams
    # are closed here, not left to the garbage collector (a ResourceWarning, an error here).
    for thread in server.threads:
        thread.join(10)
    server.proc.stdout.close()
    server.proc.stderr.close()


class _Buggy(io.RawIOBase):
    def readable(self):
        return True

    def read1(self, n=-1):
        raise RuntimeError("a bug holding sk-not-for-the-finish")


def test_a_bug_in_the_stdout_reader_ends_the_turn_named_by_type_never_by_message():
    channel = Channel(None)
    pump_stdout(_Buggy(), channel.reader_end)
    kind, failure = channel.next(timeout=1)[:2]
    assert kind == "fatal" and "RuntimeError at test_backends_stream.py:" in str(failure)
    assert "sk-not-for-the-finish" not in str(failure)
    assert channel.next(timeout=1)[0] == "eof"
