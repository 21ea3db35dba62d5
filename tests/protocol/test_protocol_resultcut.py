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
