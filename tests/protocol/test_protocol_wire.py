"""The `wire` fixture's fake plane (fault_helpers.FaultPlane, strict) as http.client sees it:
the client the plane's Transport moves to (issue 41) pools one keep-alive connection."""
import http.client
import re

import pytest


def test_the_wire_answers_what_is_registered_in_order_on_one_kept_connection(wire):
    wire.route("POST", "/echo", callback=lambda seen: (207, {"X-Seen": seen.headers["x-trace"]}, seen.body))
    wire.route("GET", re.compile(r"/items/\d+$"), status=201, json={"n": 1})
    wire.route("GET", re.compile(r"/items/\d+$"), status=404, body="gone")
    conn = http.client.HTTPConnection("127.0.0.1", wire.server.server_address[1], timeout=10)
    try:
        conn.request("POST", "/echo", body=iter([b"a", b"bc"]), headers={"X-Trace": "t1"})  # chunked
        answer = conn.getresponse()
        assert (answer.status, answer.read(), answer.getheader("X-Seen")) == (207, b"abc", "t1")
        answers = []
        for number in (1, 2, 3):
            conn.request("GET", f"/items/{number}")
            answer = conn.getresponse()
            answers.append((answer.status, answer.read()))
        assert answers == [(201, b'{"n": 1}'), (404, b"gone"), (404, b"gone")]  # the last one stays
        conn.request("GET", "/nothing")
        answer = conn.getresponse()
        assert answer.status == 599 and b"no route for GET /nothing" in answer.read()
    finally:
        conn.close()
    assert [(seen.method, seen.path, seen.status) for seen in wire.seen()] == [
        ("POST", "/echo", 207), ("GET", "/items/1", 201), ("GET", "/items/2", 404), ("GET", "/items/3", 404),
        ("GET", "/nothing", 599)]
    assert [seen.path for seen in wire.unmatched] == ["/nothing"]
    wire.unmatched.clear()  # asked for here: the fixture would fail the test on it


def test_a_dropped_request_is_closed_without_an_answer(wire):
    wire.route("POST", "/gone", drop=True)
    conn = http.client.HTTPConnection("127.0.0.1", wire.server.server_address[1], timeout=10)
    try:
        conn.request("POST", "/gone", body=b"{}")
        with pytest.raises(http.client.RemoteDisconnected):
            conn.getresponse()
    finally:
        conn.close()
    assert [(seen.path, seen.status, seen.body) for seen in wire.seen()] == [("/gone", 0, b"{}")]
