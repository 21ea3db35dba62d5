"""The Claude Code run's loopback forwarder against a local fake provider: only this run's
token and POST /v1/messages get through, the real key replaces the token, answers stream
back, a long Retry-After is shortened, a provider that cannot be reached is a 502, a long
request is streamed through, and the provider is reached through HTTPS_PROXY unless
NO_PROXY names it (a real CONNECT proxy on loopback, the provider behind it on TLS)."""
from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl

import pytest
from backends_fake_anthropic import FakeAnthropic
from backends_proxy import ConnectProxy, tls_certificate

from caldera.backends import failures as fk
from caldera.backends.claude_code import config as cc
from caldera.backends.claude_code.forwarder import RETRY_AFTER_CAP, Forwarder
from caldera.backends.failures import BackendFailure

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


# -- HTTPS_PROXY / NO_PROXY (SPEC section 3: honoured as requests honours them) -----------

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
              "NO_PROXY", "REQUEST_METHOD")


@pytest.fixture
def no_proxies(monkeypatch):
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def tls_provider(tmp_path, no_proxies):
    """A fake provider speaking HTTPS as `provider.test` (a name that resolves nowhere: only a
    proxy's tunnel reaches it), its certificate trusted through SSL_CERT_FILE."""
    cert, key = tls_certificate(tmp_path, "provider.test")
    no_proxies.setenv("SSL_CERT_FILE", str(cert))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    with FakeAnthropic([{"text": "via the tunnel"}], tls=server) as provider:
        yield provider


def test_the_provider_is_reached_through_https_proxy_with_its_credentials_and_never_sees_the_key(
        tls_provider, no_proxies):
    with ConnectProxy(tls_provider.httpd.server_address[1]) as proxy:
        no_proxies.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://squid:pa%40ss@"))
        no_proxies.setenv("NO_PROXY", "localhost,.internal.example")
        chosen = cc.upstream_proxy("https://provider.test")
        assert chosen is not None and chosen.shown == f"127.0.0.1:{proxy.httpd.server_address[1]}"
        fwd = Forwarder("https://provider.test", "ANTHROPIC_API_KEY", KEY, TOKEN, note=lambda text: None,
                        proxy=chosen)
        url = fwd.start()
        try:
            answer, data = _post(url)
        finally:
            fwd.close()
    assert answer.status == 200 and b"via the tunnel" in data, data
    [(target, headers)] = proxy.connects
    assert target == "provider.test:443"
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"squid:pa@ss").decode()
    assert KEY not in json.dumps(headers) and KEY.encode() not in bytes(proxy.sent)  # inside TLS only
    [seen] = tls_provider.posts
    assert seen["headers"]["x-api-key"] == KEY
    assert "pa@ss" in chosen.secrets and chosen.authorization in chosen.secrets  # handed to the Redactor


def test_no_proxy_and_the_proxy_choice_follow_requests(no_proxies):
    no_proxies.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert cc.upstream_proxy("https://api.anthropic.com") == cc.Proxy("proxy.example", 3128)
    no_proxies.setenv("https_proxy", "proxy.lower.example:8080")  # lower case first, scheme added as requests does
    assert cc.upstream_proxy("https://api.anthropic.com") == cc.Proxy("proxy.lower.example", 8080)
    for no_proxy in ("api.anthropic.com", ".anthropic.com", "anthropic.com", "example.org, api.anthropic.com", "*"):
        no_proxies.setenv("NO_PROXY", no_proxy)
        assert cc.upstream_proxy("https://api.anthropic.com") is None, no_proxy
    no_proxies.setenv("NO_PROXY", "10.0.0.0/8")  # a CIDR for an address
    assert cc.upstream_proxy("https://10.1.2.3") is None
    assert cc.upstream_proxy("https://11.1.2.3") == cc.Proxy("proxy.lower.example", 8080)
    no_proxies.setenv("no_proxy", "other.example")  # lower case first here too
    assert cc.upstream_proxy("https://api.anthropic.com") == cc.Proxy("proxy.lower.example", 8080)
    no_proxies.delenv("https_proxy")
    no_proxies.delenv("HTTPS_PROXY")
    no_proxies.setenv("ALL_PROXY", "http://all.example:1080")
    assert cc.upstream_proxy("https://api.anthropic.com") == cc.Proxy("all.example", 1080)


def test_a_loopback_provider_is_reached_directly_and_an_unsupported_proxy_is_refused(no_proxies):
    # A proxy elsewhere cannot reach this host's loopback, and the key would travel in clear.
    with FakeAnthropic([{"text": "direct"}]) as provider, ConnectProxy(provider.httpd.server_address[1]) as proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            no_proxies.setenv(name, proxy.url)
        assert cc.upstream_proxy(provider.url) is None
        assert cc.upstream_proxy("https://localhost:8443") is None
        fwd = Forwarder(provider.url, "ANTHROPIC_API_KEY", KEY, TOKEN, note=lambda text: None,
                        proxy=cc.upstream_proxy(provider.url))
        url = fwd.start()
        try:
            answer, data = _post(url)
        finally:
            fwd.close()
        assert answer.status == 200 and b"direct" in data
        assert proxy.connects == [] and proxy.others == []
    for bad in ("https://proxy.example:3128", "socks5://proxy.example:1080"):
        no_proxies.setenv("HTTPS_PROXY", bad)
        with pytest.raises(BackendFailure) as caught:
            cc.upstream_proxy("https://api.anthropic.com")
        assert caught.value.kind == fk.BACKEND_FAILED and "http:// proxy" in caught.value.message


def test_a_long_request_body_is_streamed_upstream_whole(no_proxies):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]}).encode()
    with FakeAnthropic([{"text": "long"}]) as provider:
        fwd = Forwarder(provider.url, "ANTHROPIC_API_KEY", KEY, TOKEN, note=lambda text: None)
        url = fwd.start()
        try:
            answer, _ = _post(url, body=body)
            again, _ = _post(url)  # the forwarder still serves after it
        finally:
            fwd.close()
    assert answer.status == 200 and again.status == 200
    assert provider.posts[0]["body"].encode() == body


def test_a_failing_request_is_named_in_the_run_log_and_never_printed_with_what_it_failed_on(capfd):
    # A key http.client refuses as a header value: its ValueError quotes the value whole.
    # (plan_provider refuses such a key before any run; this is the forwarder's own guard.)
    bad_key = KEY + "\nsecond-line"
    notes: list[str] = []
    with FakeAnthropic([{"text": "never"}]) as provider:
        fwd = Forwarder(provider.url, "ANTHROPIC_API_KEY", bad_key, TOKEN, note=notes.append)
        url = fwd.start()
        try:
            with pytest.raises((http.client.HTTPException, OSError)):
                _post(url)  # the connection drops: the CLI reports the provider unavailable
        finally:
            fwd.close()
    printed = capfd.readouterr()
    assert KEY not in printed.err + printed.out
    assert notes and notes[-1].startswith("forwarder: a request failed: ValueError at ") and KEY not in notes[-1]
    assert provider.requests == []
