"""The one bounded JSON parser: depth, size, constants, and the lone-surrogate helpers."""
import json

import pytest

from caldera.host import jsonlimits as jl


def depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw`, brackets inside strings not
    counted: a plain byte walk, the oracle `jsonlimits.too_deep` is checked against."""
    level = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            level += 1
            deepest = max(deepest, level)
        elif byte in b"]}":
            level -= 1
    return deepest


def test_depth_ignores_brackets_inside_strings():
    assert depth(b'{"a": [1, {"b": "[[[\\"[{"}]}') == 3
    assert depth(b'"[[[[" ') == 0 and depth(b"[[]]") == 2


def test_sixty_four_levels_parse_sixty_five_do_not():
    ok = b"[" * 64 + b"]" * 64
    assert jl.loads(ok, max_bytes=1024) == json.loads(ok)
    with pytest.raises(jl.JSONLimitError, match="output nested deeper than 64 levels"):
        jl.loads(b"[" * 65 + b"]" * 65, max_bytes=1024, what="output")


def test_twenty_thousand_levels_are_a_sentence_not_a_recursion_error():
    with pytest.raises(jl.JSONLimitError, match="nested deeper than 64 levels"):
        jl.loads(b'{"a":' + b"[" * 20000 + b"]" * 20000 + b"}", max_bytes=1 << 20)


def test_hostile_quote_chains_and_unterminated_strings_are_refused_not_hung():
    hostile = b"[" * 70 + b'"\\"' * 100000  # an unterminated string of escaped quotes
    with pytest.raises(ValueError):
        jl.loads(hostile, max_bytes=1 << 20)


def test_size_cap_nan_and_utf8():
    with pytest.raises(jl.JSONLimitError, match="over the 10-byte limit"):
        jl.loads(b'{"a": "0123456789"}', max_bytes=10)
    with pytest.raises(jl.JSONLimitError, match="NaN is not a JSON number"):
        jl.loads(b"[NaN]", max_bytes=100)
    with pytest.raises(jl.JSONLimitError, match="not UTF-8"):
        jl.loads(b'["\xff"]', max_bytes=100)
    with pytest.raises(json.JSONDecodeError):  # callers describe the place themselves
        jl.loads(b"{} {}", max_bytes=100)


def test_lone_surrogates_refused_in_names_escaped_in_data_scrubbed_for_people():
    assert jl.text_problem("ok €") is None and "U+D800" in jl.text_problem("a\ud800")
    data = {"note": "a\ud800€"}
    text = jl.dumps_compact(data)
    assert text == '{"note":"a\\ud800€"}' and json.loads(text) == data
    text.encode("utf-8")  # always encodable
    assert jl.scrub("x\udfffy") == "x\ufffdy" and jl.scrub("plain") == "plain"


@pytest.mark.parametrize("doc", [b"[" * 64 + b"]" * 64, b"[" * 65 + b"]" * 65, b'{"a":[{"b":[]},[[[]]]]}',
                                 b'[{"x": "]]]]"}, [[' + b'"[["' + b"]]]", b"[1, 2] [3]", b"[[[[}}}}"])
def test_the_fast_check_agrees_with_the_depth_walk(doc):
    assert jl.too_deep(doc, 64) == (depth(doc) > 64) or not json_ok(doc)
    assert jl.too_deep(doc, 2) == (depth(doc) > 2) or not json_ok(doc)


def json_ok(doc) -> bool:
    try:
        json.loads(doc)
    except ValueError:
        return False
    return True



_LINES = ['{"method":"a","params":{"x":[1,2.5,-3e4,true,null]}}', ' {"a":1}', '{"a":1} ', '{"a":1}{"b":2}',
          '[NaN]', '{"a":Infinity}', '{"a":-Infinity}', '[' * 64 + ']' * 64, '[' * 65 + ']' * 65,
          '{"a":' + '[' * 20000 + ']' * 20000 + '}', '{"n":' + '7' * 5000 + '}', '{"a":"' + 'x' * 300 + '"}',
          '{"a":"\\ud800"}', '{"a":"tab\there"}', '"just a string"', 'not json', '', '{"a":1', '{"a":"\\q"}']


@pytest.mark.parametrize("line", _LINES)
def test_the_line_parser_gives_the_verdicts_of_loads(line):
    """The per-line fast path (Codex stdout) accepts, refuses and words a refusal as loads does."""
    parse = jl.line_parser(max_bytes=256, what="line")

    def verdict(fn):
        try:
            return "ok", fn(line)
        except ValueError as exc:
            return type(exc).__name__, str(exc)

    assert verdict(parse) == verdict(lambda text: jl.loads(text, max_bytes=256, what="line"))
