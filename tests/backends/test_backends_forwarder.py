"""The Claude Code run's loopback forwarder against a local fake provider: only this run's
token and POST /v1/messages get through, the real key replaces the token, answers stream
back, a long Retry-After is shortened, and a provider that cannot be reached is a 502."""
from __future__ import annotations

import http.client
import json
import socket

from backends_fake_anthropic import FakeAnthropic

from caldera.backends.claude_code.forwarder import RETRY_AFTER_CAP, Forwarder

KEY, TOKEN = "sk-ant-real-key-0123456789", "caldera-run-token-abcdef"


def _post(url: str, path: str = "/v1/messages?beta=true", token: str = TOKEN, body: bytes = b'{"model":"m"}'):
    host, port = url.rsplit("/", 1)[-1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", path, body, {"x-api-key": token, "content-type": "application/json"})
    answer = conn.getresponse()
    data = answer.read()
    conn.close()
    return answer, data


def test_the_token_is_swapped_for_the_key_and_the_answer_streams_back():
    with FakeAnthropic([{"text": "hello"}]) as provider:
        fwd = Forwarder(provider.url, "ANTHROPIC_API_KEY", KEY, TOKEN, note=lambda text: None)
        url = fwd.start()
        try:
            answer, data = _post(url)
        finally:
            fwd.close()
    assert answer.status == 200 and b"message_stop" in data and b"hello" in data
    [seen] = provider.posts
    assert seen["headers"]["x-api-key"] == KEY and TOKEN not in json.dumps(seen["headers"])


def test_anything_but_the_runs_token_and_the_messages_path_is_refused():
    with FakeAnthropic([{"text": "hello"}]) as provider:
        fwd = Forwarder(provider.url, "ANTHROPIC_API_KEY", KEY, TOKEN, note=lambda text: None)
        url = fwd.start()
        try:
            assert _post(url, token="guess")[0].status == 401
            assert _post(url, path="/v1/models")[0].status == 404
            assert _post(url, path="http://elsewhere.invalid/v1/messages")[0].status == 404
        finally:
            fwd.close()
    assert provider.requests == []


def test_a_long_retry_after_is_shortened_and_an_unreachable_provider_is_502():
    with FakeAnthropic([{"status": 429, "headers": {"retry-after": "3600"}}]) as provider:
        fwd = Forwarder(provider.url, "ANTHROPIC_API_KEY", KEY, TOKEN, note=lambda text: None)
        url = fwd.start()
        try:
            answer, _ = _post(url)
        finally:
            fwd.close()
    assert answer.status == 429 and answer.getheader("retry-after") == str(RETRY_AFTER_CAP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    fwd = Forwarder(f"http://127.0.0.1:{closed}", "ANTHROPIC_API_KEY", KEY, TOKEN, note=lambda text: None)
    url = fwd.start()
    try:
        answer, data = _post(url)
    finally:
        fwd.close()
    assert answer.status == 502 and KEY not in data.decode()
