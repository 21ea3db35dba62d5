"""The batched stdout path (issue 16): chunked reads, one inbox item per chunk, same records."""
import io
import json
import queue

from caldera.backends import failures as fk
from caldera.backends.codex import Dispatcher, handle_batch, pump_stdout
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


def _drain(inbox):
    items = []
    while True:
        kind, msg = inbox.get_nowait()
        if kind == "eof":
            return items
        items.extend(msg if kind == "batch" else [(kind, msg)])


def test_lines_split_across_reads_arrive_whole_and_in_order(tmp_path):
    msgs = [{"method": "item/agentMessage/delta", "params": {"delta": "x" * n}} for n in range(50)]
    data = b"".join(json.dumps(m).encode() + b"\n" for m in msgs) + b'{"method": "last"}'  # no final newline
    inbox = queue.Queue()
    log = RunLog(tmp_path / "run.log", Redactor())
    pump_stdout(_Chunks(data, 37), Dispatcher(inbox, log))
    log.close()
    got = _drain(inbox)
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
        def notification(self, method, params):
            seen.append(method)

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
