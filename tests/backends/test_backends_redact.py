"""The Redactor's fast path (a trigger pre-check) must still mask every credential shape."""
import base64
import json
import urllib.parse

import pytest

from caldera.redact import MASK, Redactor


@pytest.mark.parametrize("text,secret", [
    ("AUTHORIZATION: Bearer abcdefghijk123", "abcdefghijk123"),
    ('"authorization":"Basic dXNlcjpwYXNzd29yZA=="', "dXNlcjpwYXNzd29yZA=="),
    ("curl -H 'X: BEARER abcdefghijklmnop'", "abcdefghijklmnop"),
    ("key SK-no but sk-proj-ABCDEFGHIJKLMN", "sk-proj-ABCDEFGHIJKLMN"),
    ("session agt_sess_abcdefgh1", "agt_sess_abcdefgh1"),
    ("HTTPS://User:Pa55word@example.com/x", "Pa55word"),
    ("GET /v1?API_KEY=QWERTY123&x=1", "QWERTY123"),
    ("http://h/x;signature=abcdef99", "abcdef99"),
    ('{"Client_Secret": "cs-value-1"}', "cs-value-1"),
    ("PASSWD: hunter2hunter", "hunter2hunter"),
    ("refresh_token=rt-1234567", "rt-1234567"),
])
def test_shapes_are_masked_in_any_case(text, secret):
    out = Redactor().text(text)
    assert secret not in out and MASK in out


def test_plain_lines_pass_unchanged():
    line = '{"method":"item/agentMessage/delta","params":{"itemId":"msg_1","delta":"Hello there"}}'
    assert Redactor(["zzzzzzzz-not-here"]).text(line) == line


def test_known_value_in_every_form():
    value = "line-one-secret\nline-two-secret"
    r = Redactor([value])
    forms = [value, "line-two-secret", base64.b64encode(value.encode()).decode(), json.dumps(value)[1:-1],
             urllib.parse.quote(value, safe="")]
    for form in forms:
        assert r.text(f"x {form} y") == f"x {MASK} y"
