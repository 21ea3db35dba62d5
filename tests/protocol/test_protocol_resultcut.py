"""Finish results cut as SPEC section 8 says: whole up to 1 MiB, then field by field."""
import json

import pytest

from caldera.plane.validation import check, parse_json_body
from caldera.protocol.payloads import finish_body
from caldera.protocol.resultcut import MAX_DEPTH, RESULT_CAP, SHORT, cut_result, size

AGENT = "caldera-7-adapter"
MIB = 1024 * 1024


def sent(result):
    """The finish body as the client encodes it, decoded as the plane's server decodes it."""
    body = finish_body(AGENT, "succeeded", result, "")
    raw = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    decoded = parse_json_body(raw)
    check("command-finish.schema.json", decoded)
    return decoded["result"], len(json.dumps(body["result"], separators=(",", ":")))


def padded(total, **fields):
    """A result of exactly `total` bytes of JSON: `fields` plus a filler string."""
    doc = {**fields, "filler": ""}
    doc["filler"] = "x" * (total - size(doc))
    assert size(doc) == total
    return doc


def test_just_under_and_at_the_cap_arrive_whole():
    for total in (RESULT_CAP - 1, RESULT_CAP):
        doc = padded(total, status="ok")
        got, _ = sent(doc)
        assert got == doc and "truncated" not in got


def test_just_over_the_cap_is_cut_not_replaced():
    doc = padded(RESULT_CAP + 1, status="succeeded", run_id="run-1")
    got, length = sent(doc)
    assert length <= RESULT_CAP
    assert got["truncated"] is True and got["result_bytes"] == RESULT_CAP + 1
    assert got["status"] == "succeeded" and got["run_id"] == "run-1"
    assert got["filler"] and doc["filler"].startswith(got["filler"]) and got["cut_fields"] == ["filler"]


def test_a_log_tail_keeps_its_end_and_its_last_line_whole():
    lines = [f"line {i:07d} of the agent's log" for i in range(60_000)]  # about 2 MiB
    text = "\n".join(lines) + "\n"
    got, length = sent({"name": "agent.log", "text": text, "truncated": False})
    assert length <= RESULT_CAP and got["truncated"] is True and got["name"] == "agent.log"
    assert text.endswith(got["text"]) and got["text"].endswith(lines[-1] + "\n")
    assert got["text"].split("\n")[0] in lines  # it starts at a line's beginning
    assert size(got["text"]) > RESULT_CAP - 8192  # the room went to the tail, not lost


def test_a_512_kib_log_tail_arrives_whole():
    text = ("a log line\n" * (512 * 1024 // 11 + 1))[-512 * 1024:]
    got, _ = sent({"name": "agent.log", "text": text, "truncated": True})
    assert got["text"] == text


def test_an_agent_run_keeps_its_short_fields_and_the_longest_string_is_cut_first():
    doc = {"status": "failed", "run_id": "r-9", "failure_kind": "timeout", "log_path": "/var/log/run.log",
           "summary": "s" * 300_000, "output": "o\n" * 600_000, "small": "kept" * 100}
    got, length = sent(doc)
    assert length <= RESULT_CAP
    for key in ("status", "run_id", "failure_kind", "log_path", "small"):
        assert got[key] == doc[key]
    assert got["summary"] == doc["summary"]  # the longer one gave the room
    assert "output" in got["cut_fields"] and got["output"]


def test_two_huge_strings_share_the_room():
    got, length = sent({"a": "a" * (2 * MIB), "b": "b" * (3 * MIB)})
    assert length <= RESULT_CAP and abs(len(got["a"]) - len(got["b"])) <= 2
    assert len(got["a"]) > RESULT_CAP // 2 - 4096


def test_many_small_items_keep_the_first_ones():
    doc = {"status": "succeeded", "items": [f"skill-{i}" for i in range(200_000)]}
    got, length = sent(doc)
    assert length <= RESULT_CAP and got["status"] == "succeeded" and got["truncated"] is True
    assert got["items"] == doc["items"][:len(got["items"])] and len(got["items"]) > 50_000
    assert got["cut_fields"][0].startswith("items[")


def test_a_huge_object_of_short_fields_keeps_the_short_top_level_ones():
    doc = {f"k{i}": i for i in range(200_000)}
    doc["status"] = "succeeded"
    got, length = sent(doc)
    assert length <= RESULT_CAP and got["truncated"] is True and got["k0"] == 0


def test_deep_nesting_becomes_a_note_the_decoder_takes():
    deep: dict = {"leaf": 1}
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = {"d": deep}
    got, _ = sent({"status": "ok", "tree": deep})
    assert got["status"] == "ok" and got["truncated"] is True
    node, levels = got["tree"], 1
    while isinstance(node, dict):
        node, levels = node["d"], levels + 1
    assert levels == MAX_DEPTH and "nested deeper" in node


@pytest.mark.parametrize("char", ["é", "漢", "😀"])
def test_non_ascii_is_cut_on_a_character_boundary(char):
    text = char * (RESULT_CAP // 2)  # escaped, 6 or 12 bytes a character: far over the cap
    got, length = sent({"text": text, "note": char})
    assert length <= RESULT_CAP and got["note"] == char
    assert got["text"] and set(got["text"]) == {char}  # only whole characters
    assert size(got["text"]) > RESULT_CAP - 8192


def test_short_strings_are_never_cut_even_when_long_ones_are():
    doc = {"long": "L" * (2 * MIB), "edge": "e" * (SHORT - 2)}
    got = cut_result(doc)
    assert got["edge"] == doc["edge"] and size(got) <= RESULT_CAP


def test_non_finite_numbers_and_non_json_values_still_arrive():
    got, _ = sent({"load": float("nan"), "t": (1, 2), "o": object})
    assert got["load"] is None and got["t"] == [1, 2] and isinstance(got["o"], str)


def _count_dumps(monkeypatch):
    """How many json.dumps calls the cut makes (a count, not a time)."""
    import caldera.protocol.resultcut as rc
    calls = [0]
    real = rc.json.dumps

    def counting(*args, **kwargs):
        calls[0] += 1
        assert calls[0] < 1000, "a dump per item or per pass: the cut is not linear"
        return real(*args, **kwargs)

    monkeypatch.setattr(rc.json, "dumps", counting)
    return calls


def test_many_small_lists_are_cut_in_a_few_passes(monkeypatch):
    """40,000 small lists took about an hour (a re-walk and a dump per list per pass)."""
    doc = {"status": "ok", "xs": [[i, "ab", 3] for i in range(40_000)], "ys": [[1] * 5 for _ in range(40_000)]}
    calls = _count_dumps(monkeypatch)
    got, length = sent(doc)
    assert length <= RESULT_CAP and got["truncated"] is True and got["status"] == "ok"
    assert got["xs"] == doc["xs"][:len(got["xs"])] and len(got["xs"]) > 30_000
    assert calls[0] < 100  # was one dump per list per pass


def test_small_strings_are_not_dumped_one_by_one(monkeypatch):
    doc = {"s": ["a"] * 500_000, "t": [{"k": "v"} for _ in range(50_000)]}
    calls = _count_dumps(monkeypatch)
    got, length = sent(doc)
    assert length <= RESULT_CAP and got["s"] == ["a"] * len(got["s"])
    assert calls[0] < 100


def test_a_huge_dict_keeps_its_first_keys_in_order():
    doc = {"m": {f"key-{i}": i for i in range(100_000)}}
    got, length = sent(doc)
    assert length <= RESULT_CAP and len(got["m"]) > 50_000
    assert list(got["m"]) == list(doc["m"])[:len(got["m"])]
    assert got["cut_fields"] == [f"m{{{len(got['m'])}:100000}}"]


def test_named_fields_survive_many_short_top_level_fields():
    doc = {f"f{i:05d}-" + "x" * 20: "v" * 10 for i in range(40_000)}
    doc.update(status="failed", run_id="r-1", failure_kind="timeout", log_path="/var/log/run.log")
    got, length = sent(doc)
    assert length <= RESULT_CAP
    assert (got["status"], got["run_id"], got["failure_kind"], got["log_path"]) == (
        "failed", "r-1", "timeout", "/var/log/run.log")
    assert length > RESULT_CAP * 0.9  # the full target is used, not half of it


def test_cut_paths_are_bounded_and_the_body_stays_under_the_cap():
    inner = {f"s{j}": "y" * 30_000 for j in range(60)}
    for i in range(20):
        inner = {f"k{i}" * 50: inner}
    got, length = sent(inner)
    assert length <= RESULT_CAP and got["truncated"] is True
    assert all(len(p) <= 200 for p in got["cut_fields"])
    assert len(json.dumps(got["cut_fields"])) <= 4096 // 2 + 2
    assert got["cut_fields_left_out"] == 60 - len(got["cut_fields"])


@pytest.mark.parametrize("key_chars", [2 * MIB, 9 * MIB])
def test_a_huge_key_is_dropped_not_sent(key_chars):
    got, length = sent({"status": "ok", "x" * key_chars: 1})
    assert length <= RESULT_CAP and got["status"] == "ok" and got["truncated"] is True
    assert "9000000" in got["cut_fields"][0] or str(key_chars) in got["cut_fields"][0]
