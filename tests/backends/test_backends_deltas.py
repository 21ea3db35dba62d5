"""The agentMessage-delta shortcut (issue 16): a line is dropped unparsed only when json
would parse it (within issue 14's limits) and nothing would use it."""
import json
import queue
import random

import pytest

from caldera.backends import failures as fk
from caldera.backends.codex.appserver import Dispatcher
from caldera.backends.codex.deltas import METHOD, unused_delta
from caldera.backends.codex.normalize import Normalizer
from caldera.backends.events import EventSink
from caldera.redact import Redactor

T, U = "01a23b05-b33b-7642-9c5b-4a2166fcfa5a", "01a23b05-b35a-7683-ae79-e0518c2ed772"


def delta_line(delta: str, emitted="1796286559362") -> str:
    params = json.dumps({"threadId": T, "turnId": U, "itemId": "msg_1", "delta": delta}, separators=(",", ":"))
    return f'{{"method":"{METHOD}","params":{params},"emittedAtMs":{emitted}}}'


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@pytest.mark.parametrize("delta", ["Hello ", "", 'quote " back \\ slash / tab \t nl \n', "é ü 😀 \u2028", "\ud800"])
def test_the_usual_lines_are_recognised(delta):
    line = delta_line(delta)
    assert unused_delta(line, 1 << 20) and json.loads(line)["params"]["delta"] == delta


@pytest.mark.parametrize("line", [
    delta_line("x").replace('"x"', '"a\x01b"'),  # a raw control character: not JSON
    delta_line("x").replace('"x"', '"a\\qb"'),  # an escape JSON does not have
    delta_line("x").replace('"x"', '"a\\u12"'),  # a short \u escape
    delta_line("x", emitted="01"), delta_line("x", emitted="NaN"), delta_line("x", emitted="-1"),
    delta_line("x", emitted="1.5"), delta_line("x") + " ", " " + delta_line("x"), delta_line("x") + "{}",
    delta_line("x").replace('"itemId"', '"itemId" '), delta_line("x").replace(',"delta"', ',"extra":1,"delta"'),
    delta_line("x").replace('"x"', '["x"]'), delta_line("x").replace("agentMessage", "commandExecution"),
    delta_line("x" * 200),  # over the length it is given below
])
def test_other_lines_go_to_the_parser(line):
    assert not unused_delta(line, 300)


def test_mutated_lines_are_dropped_only_when_json_parses_them():
    rng = random.Random(16)
    base = delta_line('ok "quoted" \\ and \n more é')
    alphabet = '"\\{}[]:,0123456789abcdefnrtu/ -\x00\x1f\x7fé😀'
    dropped = 0
    for _ in range(4000):
        line = list(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(line))
            action = rng.randrange(3)
            if action == 0:
                line.insert(at, rng.choice(alphabet))
            elif action == 1:
                del line[at]
            else:
                line[at] = rng.choice(alphabet)
        text = "".join(line)
        if unused_delta(text, 1 << 20):
            dropped += 1
            value = json.loads(text)  # raises if the shortcut took a line that is not JSON
            assert value["method"] == METHOD and depth(value) == 2
    assert dropped > 100  # the mutations inside the values were taken (the test tests something)


def test_nothing_would_have_used_them():
    assert Normalizer(EventSink("r", Redactor())).handler_for(METHOD) is None


def test_a_run_dispatcher_drops_them_keeps_the_rest_in_order_and_refuses_a_broken_one():
    inbox = queue.Queue()
    dispatcher = Dispatcher(inbox, None, skip_unused=True)
    lines = [delta_line("a"), '{"method":"one"}', delta_line("b"), '{"method":"two"}',
             delta_line("c").replace('"c"', '"c\x01"')]
    dispatcher.block("\n".join(lines).encode())
    items = [inbox.get_nowait() for _ in range(inbox.qsize())]
    assert [k for k, _ in items] == ["batch", "fatal"]
    assert [m["method"] for _, m in items[0][1]] == ["one", "two"]
    assert items[1][1].kind == fk.BACKEND_JSON_PARSE_ERROR
