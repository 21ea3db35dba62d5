"""The one bounded JSON parser for everything the runtime did not write itself.

Adapter answers, status files, control-plane bodies and the plane's request
bodies all come through `loads`: a size cap checked before parsing, a nesting
limit checked before the C decoder sees the text (it recurses, and 20,000
nested arrays end in a RecursionError that would escape any `except
ValueError`), and NaN/Infinity refused (not JSON, and not numbers a report
can carry). A breach is a `JSONLimitError` (a `ValueError`) whose message is a
sentence a person can read: "output nested deeper than 64 levels".

Plain stdlib, and nothing built at import (the regexes compile on first use):
local verbs import it.
"""
from __future__ import annotations

import functools
import json
import re

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

MAX_DEPTH = 64
# Strings (with their escapes) hold no structure; everything left that is not a
# bracket is dropped before the depth walk. An unterminated string runs to the end
# (the decoder refuses it later): so every quote matches and the scan stays linear
# even on hostile input like '"\\"\\"\\"…'.


@functools.cache
def _patterns() -> tuple[re.Pattern[bytes], bytes, re.Pattern[str]]:
    # The string pattern is the "unrolled loop" form: no two ways to match, linear time.
    not_brackets = bytes(b for b in range(256) if b not in b"[]{}")  # a delete table for translate
    return (re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL), not_brackets,
            re.compile("[\ud800-\udfff]"))


def too_deep(raw: bytes, max_depth: int = MAX_DEPTH) -> bool:
    """True when arrays and objects in `raw` nest deeper than `max_depth` (brackets inside
    strings don't count). One walk over the brackets alone, stopping at the first level
    past the limit: 20,000 nested arrays are found after 65 steps."""
    strings, not_brackets = _patterns()[:2]
    level = 0
    for byte in strings.sub(b"", raw).translate(None, not_brackets):
        if byte == 0x5B or byte == 0x7B:  # [ {
            level += 1
            if level > max_depth:
                return True
        else:
            level -= 1
    return False


class JSONLimitError(ValueError):
    """The text is over a limit or not JSON; str() is the sentence to show."""


def _refuse_constant(name: str) -> NoReturn:
    raise JSONLimitError(f"{name} is not a JSON number")


@functools.cache
def _decoder() -> json.JSONDecoder:
    # What json.loads(text, parse_constant=…) builds on every call (a decoder and its C
    # scanner): built once, for every line of a Codex run (docs/performance.md section 5).
    return json.JSONDecoder(parse_constant=_refuse_constant)


def loads(data: str | bytes | bytearray | memoryview, *, max_bytes: int, max_depth: int = MAX_DEPTH,
          what: str = "the JSON") -> Any:
    """Parse `data` (bytes or str) within the limits; JSONLimitError with a sentence otherwise.

    Invalid UTF-8 is refused here too; lone surrogates written as `\\ud800`
    escapes parse (they are valid JSON) and are the caller's to handle where
    text names something (see `text_problem`).
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise JSONLimitError(f"{what} is {len(raw)} bytes, over the {max_bytes}-byte limit")
    # Cheap first: with no more than max_depth brackets in all, nothing can nest deeper.
    if raw.count(b"[") + raw.count(b"{") > max_depth and too_deep(raw, max_depth):
        raise JSONLimitError(f"{what} nested deeper than {max_depth} levels")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONLimitError(f"{what} is not UTF-8 (byte {exc.start})") from None
    try:
        return _decoder().decode(text)
    except RecursionError:  # the depth walk should make this impossible; never let it escape
        raise JSONLimitError(f"{what} nested too deeply") from None
    except JSONLimitError:
        raise
    except json.JSONDecodeError:
        raise  # callers describe the place (two objects, text before the object, …)
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise JSONLimitError(f"{what} is not usable JSON: {exc}") from None


def line_parser(*, max_bytes: int, max_depth: int = MAX_DEPTH,
                what: str = "the JSON") -> Callable[[str], Any]:
    """`loads` for the lines of one stream, cheaper per line and with the same verdicts: a
    function of one line (text decoded from UTF-8 bytes, so it holds no lone surrogate).

    The common line (at most max_depth brackets, characters * 4 within max_bytes, one JSON
    value from the first to the last character) goes straight to the C scanner of the one
    decoder (NaN refused there too); any other line, and any line the scanner refuses, goes
    through `loads`, which raises the sentence (or the JSONDecodeError) a caller expects.
    What `loads` would cost more per line of Codex's stdout: docs/performance.md section 5."""
    # set by JSONDecoder.__init__ (the C scanner), absent from typeshed's JSONDecoder
    scan: Callable[[str, int], tuple[Any, int]] = _decoder().scan_once  # type: ignore[attr-defined]
    most_chars = max_bytes // 4  # a character is at most 4 bytes of UTF-8

    def parse(line: str) -> Any:
        if len(line) <= most_chars and line.count("[") + line.count("{") <= max_depth:
            try:
                value, end = scan(line, 0)
            except (StopIteration, ValueError, RecursionError):  # leading space, not JSON, NaN, …
                pass
            else:
                if end == len(line):
                    return value
        return loads(line, max_bytes=max_bytes, max_depth=max_depth, what=what)

    return parse


def text_problem(value: str) -> str | None:
    """Why `value` is not valid Unicode text (a lone surrogate from a `\\udXXX` escape), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"it holds a lone surrogate (U+{ord(value[exc.start]):04X}) that is not a character"
    return None


def escape_surrogates(text: str) -> str:
    """`text` with every lone surrogate written as its `\\uXXXX` JSON escape (data passes intact)."""
    if text.isascii():
        return text
    return _patterns()[2].sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def dumps_compact(value: Any) -> str:
    """Compact JSON with non-ASCII as UTF-8 text and lone surrogates JSON-escaped, so the result
    always encodes to UTF-8 (argv, files) and decodes back to `value`."""
    return escape_surrogates(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def terminal_safe(text: str) -> str:
    """`text` without the control characters a terminal acts on (escape sequences, carriage
    returns): each shown as \\xNN; newlines and tabs stay. For what an agent, a model or a
    file name put in text that a person's terminal prints."""
    return text.translate(_CONTROL)


def scrub(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD, for text shown to a person."""
    if text.isascii():
        return text
    surrogate = _patterns()[2]
    return surrogate.sub("\ufffd", text) if surrogate.search(text) else text
