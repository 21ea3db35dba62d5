"""The runtime's loopback forwarder (caldera/backends/forwarder.py) against a local fake
provider: Claude Code's route (only this run's token and POST /v1/messages get through, the
real key replaces the token), answers streamed back, a long Retry-After shortened, a provider
that cannot be reached a 502, long and chunked request bodies streamed through, the provider
reached through HTTPS_PROXY unless NO_PROXY names it (a real CONNECT proxy on loopback, the
provider behind it on TLS); its limits against whoever else reaches the loopback (a cap on
connections, unauthenticated ones first, request heads bounded in size and time, bodies in
silence, close() ending every connection and thread); and the interface another backend's
route uses (a token in the path, placeholders, failures and cuts per tag)."""
from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import ssl
import threading
import time

import pytest
from backends_fake_anthropic import FakeAnthropic
from backends_proxy import PROXIES, ConnectProxy, tls_certificate

from caldera.backends import failures as fk
from caldera.backends import forwarder as fw
from caldera.backends.failures import BackendFailure

KEY, TOKEN = "sk-ant-real-key-0123456789", "caldera-run-token-abcdef"
CAP = 5


def _claude(url: str, key: str = KEY, proxy: fw.Proxy | None = None, notes: list[str] | None = None,
            limits: fw.Limits | None = None) -> fw.Forwarder:
    """A forwarder with Claude Code's route, started."""
    route = fw.TokenRoute(fw.Upstream.parse(url, proxy), TOKEN, ("x-api-key", key), ("/v1/messages",))
    forwarder = fw.Forwarder(route, name="test-forwarder", note=notes.append if notes is not None else None,
                             retry_after_cap=CAP, limits=limits)
    forwarder.start()
    return forwarder


def _post(url: str, path: str = "/v1/messages?beta=true", token: str = TOKEN, body: bytes = b'{"model":"m"}',
          headers: dict | None = None):
    host, port = url.rsplit("/", 1)[-1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body, dict({"x-api-key": token, "content-type": "application/json"},
                                              **(headers or {})))
        answer = conn.getresponse()
        return answer, answer.read()
    finally:
        conn.close()


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name) and t.is_alive()]


def test_the_token_is_swapped_for_the_key_and_the_answer_streams_back():
    with FakeAnthropic([{"text": "hello"}]) as provider:
        fwd = _claude(provider.url)
        try:
            answer, data = _post(fwd.url)
        finally:
            fwd.close()
    assert answer.status == 200 and b"message_stop" in data and b"hello" in data
    [seen] = provider.posts
    assert seen["headers"]["x-api-key"] == KEY and TOKEN not in json.dumps(seen["headers"])
    assert seen["headers"]["accept-encoding"] == "identity"


def test_anything_but_the_runs_token_and_the_messages_path_is_refused():
    with FakeAnthropic([{"text": "hello"}]) as provider:
        fwd = _claude(provider.url)
        try:
            assert _post(fwd.url, token="guess")[0].status == 401
            assert _post(fwd.url, path="/v1/models")[0].status == 404
            assert _post(fwd.url, path="http://elsewhere.invalid/v1/messages")[0].status == 404
        finally:
            fwd.close()
    assert provider.requests == []


def test_a_long_retry_after_is_shortened_and_an_unreachable_provider_is_502():
    with FakeAnthropic([{"status": 429, "headers": {"retry-after": "3600"}}]) as provider:
        fwd = _claude(provider.url)
        try:
            answer, _ = _post(fwd.url)
        finally:
            fwd.close()
    assert answer.status == 429 and answer.getheader("retry-after") == str(CAP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    fwd = _claude(f"http://127.0.0.1:{closed}")
    try:
        answer, data = _post(fwd.url)
    finally:
        fwd.close()
    assert answer.status == 502 and KEY not in data.decode()


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:0", "http://127.0.0.1:port",
                                 "http://127.0.0.1:", "ftp://127.0.0.1"])
def test_an_upstream_no_connection_can_be_made_to_is_refused_with_a_sentence(url):
    with pytest.raises(ValueError, match=r"^(the port of 127\.0\.0\.1 is not a number from 1 to 65535|"
                                         r"an http\(s\) URL with a host is required)$"):
        fw.Upstream.parse(url)


def test_a_long_request_body_is_streamed_upstream_whole():
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]}).encode()
    with FakeAnthropic([{"text": "long"}]) as provider:
        fwd = _claude(provider.url)
        try:
            answer, _ = _post(fwd.url, body=body)
            again, _ = _post(fwd.url)  # the forwarder still serves after it
        finally:
            fwd.close()
    assert answer.status == 200 and again.status == 200
    assert provider.posts[0]["body"].encode() == body


@pytest.mark.parametrize("size", [5000, 3 * 1024 * 1024], ids=["small", "large"])
def test_a_chunked_request_body_is_forwarded_whole(size):
    """A small one with a Content-Length, a large one chunked as it comes (never held whole)."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "y" * size}]}).encode()
    with FakeAnthropic([{"text": "ok"}]) as provider:
        fwd = _claude(provider.url)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", fwd.port, timeout=30)
            conn.request("POST", "/v1/messages", body=iter([body[:100], body[100:]]),
                         headers={"x-api-key": TOKEN, "Accept-Encoding": "gzip, br"}, encode_chunked=True)
            assert conn.getresponse().status == 200
            conn.close()
        finally:
            fwd.close()
    [seen] = provider.posts
    assert seen["body"].encode() == body and seen["headers"]["accept-encoding"] == "identity"
    assert ("content-length" in seen["headers"]) == (size < fw.SMALL_BODY)


def test_a_failing_request_is_named_in_the_run_log_and_never_printed_with_what_it_failed_on(capfd):
    # A key http.client refuses as a header value: its ValueError quotes the value whole.
    # (plan_provider refuses such a key before any run; this is the forwarder's own guard.)
    bad_key = KEY + "\nsecond-line"
    notes: list[str] = []
    with FakeAnthropic([{"text": "never"}]) as provider:
        fwd = _claude(provider.url, key=bad_key, notes=notes)
        try:
            with pytest.raises((http.client.HTTPException, OSError)):
                _post(fwd.url)  # the connection drops: the CLI reports the provider unavailable
        finally:
            fwd.close()
    printed = capfd.readouterr()
    assert KEY not in printed.err + printed.out
    assert notes and notes[-1].startswith("forwarder: a request failed: ValueError at ") and KEY not in notes[-1]
    assert provider.requests == []


# -- limits: whoever else reaches the loopback (the review's M1) ---------------------------------

def _half_sent(port: int, n: int) -> list[socket.socket]:
    """n connections that each send half a request head and stop."""
    out = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
        out.append(sock)
    return out


def _ended(socks: list[socket.socket], within: float = 20.0) -> list[socket.socket]:
    """The sockets the forwarder closed (EOF or reset), waiting up to `within` s for each to
    come (a liveness bound: the test waits for an outcome, it does not time one)."""
    ended: list[socket.socket] = []
    waiting = list(socks)
    deadline = time.monotonic() + within
    while waiting and time.monotonic() < deadline:
        readable, _, _ = select.select(waiting, [], [], max(0.0, min(0.5, deadline - time.monotonic())))
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                waiting.remove(sock)
                ended.append(sock)
    return ended


def _settled(name: str, at_most: int) -> list[threading.Thread]:
    """The threads named `name` once at most `at_most` are left (a dropped connection's
    thread ends just after its socket is shut), or as they are after a while."""
    deadline, tick = time.monotonic() + 20, threading.Event()
    while len(_threads(name)) > at_most and time.monotonic() < deadline:
        tick.wait(0.05)
    return _threads(name)


def test_unauthenticated_connections_are_capped_the_oldest_dropped_and_close_ends_every_one():
    """60 connections that never finish their head (fewer than the listen backlog: a flood
    beyond it only waits on the kernel): the forwarder keeps the newest `unauthenticated` of
    them (each a thread) and closes the rest at once; close() then ends those and every
    thread of the forwarder."""
    with FakeAnthropic([{"text": "hello"}]) as provider:
        fwd = _claude(provider.url)
        socks = _half_sent(fwd.port, 60)
        try:
            ended = _ended(socks[:-fw.Limits.unauthenticated])  # all but the newest are dropped
            assert len(ended) == 60 - fw.Limits.unauthenticated
            assert len(_settled("test-forwarder-conn", fw.Limits.unauthenticated)) == fw.Limits.unauthenticated
            assert _post(fwd.url)[0].status == 200  # the run's own requests still get through
        finally:
            fwd.close()
        try:
            assert len(_ended(socks[-fw.Limits.unauthenticated:])) == fw.Limits.unauthenticated
            assert _threads("test-forwarder") == [] and fwd.abandoned == 0
        finally:
            for sock in socks:
                sock.close()


def test_connections_over_the_cap_are_closed_at_once():
    limits = fw.Limits(connections=4, unauthenticated=8)
    with FakeAnthropic([{"text": "hello"}]) as provider:
        fwd = _claude(provider.url, limits=limits)
        socks = _half_sent(fwd.port, 10)
        try:
            assert len(_ended(socks[4:])) == 6  # the first 4 are kept (under the cap of unauthenticated)
            assert len(_settled("test-forwarder-conn", 4)) == 4
        finally:
            fwd.close()
            for sock in socks:
                sock.close()


def test_a_request_head_over_its_size_cap_is_refused_without_reading_on():
    """Header lines the standard library would take one by one (each under its 64 KiB line
    limit, 100 of them: 6.4 MB held per connection before the token was even looked at)."""
    with FakeAnthropic([{"text": "never"}]) as provider:
        fwd = _claude(provider.url)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", fwd.port, timeout=30)
            conn.putrequest("POST", "/v1/messages")
            for i in range(3):
                conn.putheader(f"x-pad-{i}", "p" * 40_000)
            conn.putheader("x-api-key", TOKEN)
            conn.putheader("content-length", "0")
            conn.endheaders()
            assert conn.getresponse().status == 431
            conn.close()
        finally:
            fwd.close()
    assert provider.requests == []


def test_a_head_or_a_body_that_stalls_is_dropped():
    limits = fw.Limits(head_seconds=0.3, body_idle=0.3)
    with FakeAnthropic([{"text": "never"}]) as provider:
        fwd = _claude(provider.url, limits=limits)
        [head] = _half_sent(fwd.port, 1)
        body = socket.create_connection(("127.0.0.1", fwd.port), timeout=30)
        try:
            body.sendall(f"POST /v1/messages HTTP/1.1\r\nx-api-key: {TOKEN}\r\ncontent-length: 100\r\n\r\n"
                         "{\"model\"".encode())
            assert len(_ended([head, body])) == 2
        finally:
            fwd.close()
            head.close()
            body.close()
    # The body was streamed as it came and stopped with the client: never a whole request.
    assert [len(p["body"]) for p in provider.requests] in ([], [len('{"model"')])


# -- what another backend's route looks like (OpenCode's needs) ----------------------------------

class PathRoute:
    """A route token in the path (`/r/<token>/…`), placeholders in header values replaced by
    the secrets they stand for, the answer's failures kept per session header."""

    def __init__(self, upstream: fw.Upstream, token: str, placeholders: dict[str, str]):
        self.upstream, self.prefix, self.placeholders = upstream, f"/r/{token}/", placeholders

    def __call__(self, req: fw.Incoming) -> fw.Outgoing:
        if not req.target.startswith(self.prefix):
            raise fw.Refusal(404, "caldera_forwarder", "no such route")
        headers = {}
        for name, value in req.headers:
            for placeholder, secret in self.placeholders.items():
                value = value.replace(placeholder, secret)
            headers[name] = value
        return fw.Outgoing(self.upstream, self.upstream.base_path + "/" + req.target[len(self.prefix):], headers,
                           tag=req.header("x-session-id") or "")


def test_a_route_of_another_shape_failures_per_tag_and_a_cut():
    with FakeAnthropic([{"status": 503}, {"stall": 120}]) as provider:
        route = PathRoute(fw.Upstream.parse(provider.url), "tok123", {"PLACEHOLDER-1": KEY})
        fwd = fw.Forwarder(route, name="test-forwarder", error_body=fw.openai_error)
        fwd.start()
        try:
            answer, data = _post(fwd.url, path="/v1/messages")
            assert answer.status == 404 and json.loads(data) == {"error": {"message": "no such route",
                                                                            "type": "caldera_forwarder"}}
            answer, _ = _post(fwd.url, path="/r/tok123/v1/messages", token="PLACEHOLDER-1",
                              headers={"x-session-id": "ses_a"})
            assert answer.status == 503 and provider.posts[0]["headers"]["x-api-key"] == KEY
            failure = fwd.last_failure("ses_a")
            assert failure is not None and failure.status == 503 and "HTTP 503" in failure.message
            box: dict = {}

            def stalled_request() -> None:
                try:
                    _post(fwd.url, path="/r/tok123/v1/messages", headers={"x-session-id": "ses_b"})
                except http.client.IncompleteRead as exc:
                    box["cut"] = exc

            stalled = threading.Thread(target=stalled_request)
            stalled.start()
            while len(provider.posts) < 2 and stalled.is_alive():
                stalled.join(0.05)
            fwd.cut("ses_b")  # a silent provider: the request ends now, not after the upstream timeout
            stalled.join(30)
            # The head and the first event came; the client sees the body cut short (no last chunk).
            assert not stalled.is_alive() and b"message_start" in box["cut"].partial
            failure = fwd.last_failure("ses_b")
            assert failure is not None and failure.status is None and "cut by the runtime" in failure.message
        finally:
            fwd.close()


def _path_forwarder(upstream: fw.Upstream, limits: fw.Limits | None = None) -> fw.Forwarder:
    fwd = fw.Forwarder(PathRoute(upstream, "tok123", {"PLACEHOLDER-1": KEY}), name="test-forwarder",
                       error_body=fw.openai_error, limits=limits)
    fwd.start()
    return fwd


def test_an_upstream_urls_credentials_go_as_basic_auth_unless_the_route_sends_an_authorization():
    with FakeAnthropic([{"text": "ok"}]) as provider:
        upstream = fw.Upstream.parse(provider.url.replace("http://", "http://us%40er:pa%3Ass@"))
        assert "pa:ss" not in repr(upstream) and upstream.authorization not in repr(upstream)
        assert {upstream.authorization, "pa:ss", "pa%3Ass"} <= set(upstream.secrets)  # for the Redactor
        assert upstream.shown == provider.url[len("http://"):]
        fwd = _path_forwarder(upstream)
        try:
            assert _post(fwd.url, path="/r/tok123/v1/messages")[0].status == 200
            assert _post(fwd.url, path="/r/tok123/v1/messages", headers={"Authorization": "Bearer PLACEHOLDER-1"}
                         )[0].status == 200
        finally:
            fwd.close()
    first, second = provider.posts
    assert first["headers"]["authorization"] == "Basic " + base64.b64encode(b"us@er:pa:ss").decode()
    assert second["headers"]["authorization"] == f"Bearer {KEY}"


def test_a_provider_silent_in_its_tls_handshake_is_given_up_at_the_connect_timeout_or_cut_at_once():
    """The provider's socket is tracked from its TCP connection on, before the TLS handshake
    (or a proxy's CONNECT): `cut` reaches it there too; and connecting has its own timeout,
    not the 300 s an answer may stay silent."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the kernel's backlog), never speaks
        upstream = fw.Upstream.parse(f"https://127.0.0.1:{silent.getsockname()[1]}")
        fwd = _path_forwarder(upstream, fw.Limits(connect_seconds=0.5))
        try:
            answer, data = _post(fwd.url, path="/r/tok123/v1/messages", headers={"x-session-id": "ses_t"})
        finally:
            fwd.close()
        assert answer.status == 502 and "timed out" in json.loads(data)["error"]["message"]
        fwd = _path_forwarder(upstream, fw.Limits(connect_seconds=120))
        box: dict = {}
        waiting = threading.Thread(target=lambda: box.update(out=_post(
            fwd.url, path="/r/tok123/v1/messages", headers={"x-session-id": "ses_c"})))
        waiting.start()
        try:
            deadline, tick = time.monotonic() + 20, threading.Event()
            while waiting.is_alive() and time.monotonic() < deadline:
                fwd.cut("ses_c")  # again until it lands: the socket is tracked once TCP has connected
                tick.wait(0.05)
            waiting.join(10)
        finally:
            fwd.close()
    assert not waiting.is_alive() and box["out"][0].status == 502
    failure = fwd.last_failure("ses_c")
    assert failure is not None and failure.message.endswith("cut by the runtime")


def test_a_target_no_url_may_hold_is_refused_and_never_quoted_with_the_upstreams_path():
    """A request line with a control character is 400; a target http.client refuses (here the
    route's: a base path with a space) is a 502 that does not quote it (the path holds a key)."""
    with FakeAnthropic([{"text": "never"}]) as provider:
        fwd = _path_forwarder(fw.Upstream.parse(f"{provider.url}/k/{KEY} x"))
        sock = socket.create_connection(("127.0.0.1", fwd.port), timeout=30)
        try:
            sock.sendall(b"POST /r/tok123/v1/\x01messages HTTP/1.1\r\ncontent-length: 0\r\n\r\n")
            line = sock.recv(65536).split(b"\r\n", 1)[0]
            answer, data = _post(fwd.url, path="/r/tok123/v1/messages")
        finally:
            sock.close()
            fwd.close()
    assert line.startswith(b"HTTP/1.1 400 ")
    assert answer.status == 502 and KEY not in data.decode() and "not a valid URL" in data.decode()
    assert provider.requests == []


# -- HTTPS_PROXY / NO_PROXY (SPEC section 3: honoured as requests honours them) -----------



@pytest.fixture
def no_proxies(monkeypatch):
    for name in PROXIES:
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
        chosen = fw.upstream_proxy("https://provider.test")
        assert chosen is not None and chosen.shown == f"127.0.0.1:{proxy.httpd.server_address[1]}"
        fwd = _claude("https://provider.test", proxy=chosen)
        try:
            answer, data = _post(fwd.url)
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
    assert fw.upstream_proxy("https://api.anthropic.com") == fw.Proxy("proxy.example", 3128)
    no_proxies.setenv("https_proxy", "proxy.lower.example:8080")  # lower case first, scheme added as requests does
    assert fw.upstream_proxy("https://api.anthropic.com") == fw.Proxy("proxy.lower.example", 8080)
    for no_proxy in ("api.anthropic.com", ".anthropic.com", "anthropic.com", "example.org, api.anthropic.com", "*"):
        no_proxies.setenv("NO_PROXY", no_proxy)
        assert fw.upstream_proxy("https://api.anthropic.com") is None, no_proxy
    no_proxies.setenv("NO_PROXY", "10.0.0.0/8")  # a CIDR for an address
    assert fw.upstream_proxy("https://10.1.2.3") is None
    assert fw.upstream_proxy("https://11.1.2.3") == fw.Proxy("proxy.lower.example", 8080)
    no_proxies.setenv("no_proxy", "other.example")  # lower case first here too
    assert fw.upstream_proxy("https://api.anthropic.com") == fw.Proxy("proxy.lower.example", 8080)
    no_proxies.delenv("https_proxy")
    no_proxies.delenv("HTTPS_PROXY")
    no_proxies.setenv("ALL_PROXY", "http://all.example:1080")
    assert fw.upstream_proxy("https://api.anthropic.com") == fw.Proxy("all.example", 1080)


def test_a_loopback_provider_is_reached_directly_and_an_unsupported_proxy_is_refused(no_proxies):
    # A proxy elsewhere cannot reach this host's loopback, and the key would travel in clear.
    with FakeAnthropic([{"text": "direct"}]) as provider, ConnectProxy(provider.httpd.server_address[1]) as proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            no_proxies.setenv(name, proxy.url)
        assert fw.upstream_proxy(provider.url) is None
        assert fw.upstream_proxy("https://localhost:8443") is None
        fwd = _claude(provider.url, proxy=fw.upstream_proxy(provider.url))
        try:
            answer, data = _post(fwd.url)
        finally:
            fwd.close()
        assert answer.status == 200 and b"direct" in data
        assert proxy.connects == [] and proxy.others == []
    for bad in ("https://proxy.example:3128", "socks5://proxy.example:1080"):
        no_proxies.setenv("HTTPS_PROXY", bad)
        with pytest.raises(BackendFailure) as caught:
            fw.upstream_proxy("https://api.anthropic.com")
        assert caught.value.kind == fk.BACKEND_FAILED and "http:// proxy" in caught.value.message


def test_a_body_with_both_framings_is_read_chunked_and_the_connection_closed_after():
    """RFC 9112: Transfer-Encoding wins over a Content-Length beside it (Bun has been seen to
    send both), and the connection is not kept (what follows could be smuggled)."""
    body = b'{"model":"m","pad":"' + b"z" * 300 + b'"}'
    with FakeAnthropic([{"text": "ok"}]) as provider:
        fwd = _claude(provider.url)
        sock = socket.create_connection(("127.0.0.1", fwd.port), timeout=30)
        try:
            sock.sendall(f"POST /v1/messages HTTP/1.1\r\nx-api-key: {TOKEN}\r\ncontent-length: 5\r\n"
                         f"transfer-encoding: chunked\r\n\r\n{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        finally:
            sock.close()
            fwd.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in answer
    assert provider.posts[0]["body"].encode() == body


def _session_post(fwd: fw.Forwarder, session: str, body: bytes = b'{"model":"m","stream":true}'):
    return _post(fwd.url, path="/r/tok123/v1/messages", token="PLACEHOLDER-1", body=body,
                 headers={"x-session-id": session})


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
def test_an_answer_cut_short_of_its_length_is_a_cut_and_failures_count_in_a_row(stream):
    """A provider that drops the connection mid-answer (its Content-Length not reached): the
    client sees the answer cut short at once (it was relayed as whole before, on a kept
    connection: the client waited 60 s for the rest), the failure is kept, and the tag's
    streak counts such failures in a row until a whole answer ends it."""
    body = json.dumps({"model": "m", "stream": stream}).encode()
    script = [{"drop": True}, {"status": 503}, {"text": "fine"}, {"drop": True}]
    with FakeAnthropic(script) as provider:
        fwd = _path_forwarder(fw.Upstream.parse(provider.url))
        try:
            started = time.monotonic()
            with pytest.raises(http.client.IncompleteRead):
                _session_post(fwd, "ses_a", body)
            assert time.monotonic() - started < 5
            failure = fwd.last_failure("ses_a")
            assert failure is not None and failure.status is None and "broke off" in failure.message
            assert fwd.streak("ses_a") == 1
            assert _session_post(fwd, "ses_a", body)[0].status == 503 and fwd.streak("ses_a") == 2
            assert _session_post(fwd, "ses_a", body)[0].status == 200 and fwd.streak("ses_a") == 0
            with pytest.raises(http.client.IncompleteRead):
                _session_post(fwd, "ses_a", body)
            assert fwd.streak("ses_a") == 1 and fwd.streak("ses_other") == 0
        finally:
            fwd.close()


def test_a_provider_silent_after_its_answers_head_is_seen_as_silent():
    with FakeAnthropic([{"stall": 60, "silent": True}]) as provider:
        fwd = _path_forwarder(fw.Upstream.parse(provider.url))
        box: dict = {}

        def request() -> None:
            try:
                _session_post(fwd, "ses_s")
            except (http.client.HTTPException, OSError) as exc:
                box["error"] = exc

        thread = threading.Thread(target=request)
        try:
            assert fwd.silence("ses_s") == 0.0
            thread.start()
            stop = threading.Event()
            while not provider.posts and not stop.wait(0.05):
                pass
            stop.wait(1.0)
            silent = fwd.silence("ses_s")
            assert 0.8 < silent < 10 and fwd.silence("ses_other") == 0.0
            fwd.cut("ses_s")  # what a turn does at its stall bound
            thread.join(10)
            assert not thread.is_alive() and fwd.silence("ses_s") == 0.0 and fwd.streak("ses_s") == 1
        finally:
            provider.stop.set()
            fwd.close()
