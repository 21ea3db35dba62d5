"""Codex's most frequent stdout line, checked without being built: `item/agentMessage/delta`.

The assistant's text streams as one notification per token or so (the most frequent line
of a busy turn: docs/performance.md section 5), all of one shape (codex-notes section 4;
the key order is what Codex 0.169.0 writes):

    {"method":"item/agentMessage/delta","params":{"threadId":"…","turnId":"…","itemId":"…","delta":"…"},"emittedAtMs":N}

Nothing consumes them: the normaliser takes the message from `item/completed` (the deltas
can miss a chunk), so the Dispatcher only has to know the line is valid JSON within issue
14's limits, and then leaves it out of the batch (the run log has it already).
`unused_delta` decides that with a regular expression spelled in JSON's own grammar:
strings without raw control characters and with only JSON's escapes, an integer without
leading zeros, nothing else. A line it matches is one `json` parses (depth 2, no NaN,
within the length given); any other line (another shape, key order, spacing) goes
through the bounded parser as before. Cheaper than the C decoder (by how much:
docs/performance.md section 5).
"""
from __future__ import annotations

import functools
import re

METHOD = "item/agentMessage/delta"
_PREFIX = '{"method":"' + METHOD + '","params":{'
# A JSON string, "unrolled" (one way to match, linear): plain characters, then any number
# of (escape, plain characters).
_STRING = r'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"'


@functools.cache
def _shape() -> re.Pattern[str]:
    # Compiled on first use: only a Codex run needs it.
    return re.compile(re.escape(_PREFIX) + f'"threadId":{_STRING},"turnId":{_STRING},"itemId":{_STRING},'
                      f'"delta":{_STRING}' + r'\},"emittedAtMs":(?:0|[1-9][0-9]{0,15})\}')


def unused_delta(line: str, max_chars: int) -> bool:
    """True when `line` is an agentMessage delta of the usual shape, valid JSON, at most
    `max_chars` long: a line to log and drop. False for every other line (parse it)."""
    return line.startswith(_PREFIX) and len(line) <= max_chars and _shape().fullmatch(line) is not None
