"""The control-plane client against real loopback servers: the fault plane
(fault_helpers.FaultPlane) for the protocol's answers, scripted raw answers
(rawhttp_helpers.RawServer) for what no well-behaved server sends, a live CONNECT proxy
and a TLS plane with a certificate made at test time (backends_proxy)."""
import base64
import json
import ssl
import threading
import time

import pytest
from backends_proxy import PROXIES, ConnectProxy, tls_certificate
from fault_helpers import API, FaultPlane
from proxy_helpers import ForwardProxy, dead_port
from rawhttp_helpers import RawServer, answer, count_connections

from caldera.protocol.client import (
    BODY_CAP,
    ControlPlaneClient,
    Forbidden,
    Invalid,
    NotFound,
    Retryable,
    TooLarge,
    Transport,
    Unaccepted,
)
from caldera.protocol.session import Auth, AuthBlocked, SessionFile
from caldera.redact import Redactor

FIRST, SECOND = "agt_sess_fault_1", "agt_sess_fault_2"  # the fault plane's sessions, in order
ERROR = b'{"success":false,"error":"%s"}'


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    """No proxy or CA variable of the host's reaches a test unless the test sets it."""
    for name in (*PROXIES, "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def plane():
    plane = FaultPlane().start()
    yield plane
    plane.stop()


def make(plane_url, tmp_path, **transport):
    client = ControlPlaneClient(Transport(plane_url, **transport), None)
    client.auth = Auth(bootstrap_token="boot-token-xyz", session_file=SessionFile(tmp_path / "session.json",
                                                                                  plane_url, 7),
                       register=lambda: client.register({"instance_id": 7}), redactor=Redactor())
    return client


def auths(plane):
    return [r.headers.get("Authorization") for r in plane.requests]


# ------------------------------------------------------------------ the protocol's answers

def test_envelope_and_bare_objects_and_bearer(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/commands/next$", body=json.dumps({"command": {"id": 3, "command_type": "x"}}).encode())
    assert client.heartbeat({})["has_pending_command"] is False
    assert client.next_command() == ({"id": 3, "command_type": "x"}, None)
    assert auths(plane) == ["Bearer boot-token-xyz", f"Bearer {FIRST}", f"Bearer {FIRST}"]
    assert plane.requests[1].headers["User-Agent"].startswith("caldera/")
    saved = json.loads((tmp_path / "session.json").read_text())
    assert saved["session_token"] == FIRST
    assert oct((tmp_path / "session.json").stat().st_mode & 0o777) == "0o600"


def test_a_netrc_entry_for_the_plane_never_replaces_the_bearer_token(plane, tmp_path, monkeypatch):
    """A client that applies ~/.netrc to a request without auth of its own would send its
    Basic credentials instead of the session token."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("machine 127.0.0.1 login someone password netrc-password\n"
                                 "default login d password d\n")
    (home / ".netrc").chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("NETRC", raising=False)
    make(plane.url, tmp_path).heartbeat({})
    assert auths(plane) == ["Bearer boot-token-xyz", f"Bearer {FIRST}"]


def test_next_command_null_means_idle(plane, tmp_path):
    assert make(plane.url, tmp_path).next_command() == (None, None)


def test_401_renews_once_and_retries(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/heartbeat$", status=401, body=ERROR % b"expired")
    client.heartbeat({})
    assert auths(plane) == ["Bearer boot-token-xyz", f"Bearer {FIRST}", "Bearer boot-token-xyz", f"Bearer {SECOND}"]
    assert plane.registrations == 2


def test_concurrent_401s_register_once(plane, tmp_path):
    client = make(plane.url, tmp_path)
    client.auth.token()
    barrier = threading.Barrier(4)

    def renew():
        barrier.wait()
        client.auth.renew(FIRST)

    threads = [threading.Thread(target=renew) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert plane.registrations == 2  # the first and exactly one renewal
    assert client.auth.token() == SECOND


def test_bad_bootstrap_token_blocks_auth_path(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/register$", status=400, body=ERROR % b"invalid agent bootstrap token")
    with pytest.raises(AuthBlocked) as err:
        client.heartbeat({})
    assert err.value.retry_after == 300
    with pytest.raises(AuthBlocked):
        client.heartbeat({})
    assert len(plane.requests) == 1  # no second register while blocked
    client.auth.unblock()  # SIGHUP
    client.heartbeat({})
    assert client.auth.blocked_reason is None


def test_resource_403_refuses_that_call_only(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/config/revisions/5$", status=403, body=ERROR % b"Access denied")
    with pytest.raises(Forbidden):
        client.config_revision_raw(5)
    assert client.auth.blocked_reason is None and plane.registrations == 1
    assert (tmp_path / "session.json").exists()
    client.heartbeat({})  # the session goes on
    assert auths(plane)[-1] == f"Bearer {FIRST}"


def test_session_mismatch_403_registers_again_and_retries(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/commands/9/finish$", status=403, body=ERROR % b"agent id does not match session")
    client.finish_command(9, {"status": "succeeded"})
    assert plane.registrations == 2 and client.auth.blocked_reason is None
    assert [r.path for r in plane.requests][-1] == API + "/commands/9/finish"
    assert auths(plane)[-1] == f"Bearer {SECOND}"


def test_session_file_is_keyed_on_agent_id(tmp_path):
    from caldera.protocol.session import SessionInfo

    base = "http://127.0.0.1:9"
    SessionFile(tmp_path / "s.json", base, 7, "caldera-7-adapter").save(SessionInfo("tok", None, 15, 5))
    assert SessionFile(tmp_path / "s.json", base, 7, "caldera-7-adapter").load().token == "tok"
    assert SessionFile(tmp_path / "s.json", base, 7, "caldera-7-process").load() is None


def test_403_on_register_blocks(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/register$", status=403, body=ERROR % b"instance disabled")
    with pytest.raises(AuthBlocked):
        client.heartbeat({})
    assert client.auth.blocked_reason == "instance disabled"


def test_error_types_and_retry_after_is_kept(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/commands/next$", status=404, body=b"")
    plane.fault(r"/state/report$", status=400, body=ERROR % b"bad")
    plane.fault(r"/heartbeat$", status=429, headers={"Retry-After": "30"}, body=ERROR % b"slow down")
    with pytest.raises(NotFound):
        client.next_command()
    with pytest.raises(Invalid, match="bad"):
        client.state_report({})
    with pytest.raises(Retryable) as err:
        client.heartbeat({})
    assert err.value.retry_after == 30
    calls = len(plane.requests)
    with pytest.raises(Retryable, match="Retry-After"):
        client.state_report({})  # fails fast: no request while the server asked for quiet
    assert len(plane.requests) == calls


def test_body_over_cap_is_refused(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/heartbeat$", size=BODY_CAP + 1)
    with pytest.raises(Invalid, match="over"):
        client.heartbeat({})


def test_network_error_is_retryable_and_names_where_it_went():
    port = dead_port()
    transport = Transport(f"http://127.0.0.1:{port}")
    with pytest.raises(Retryable, match=rf"ConnectionRefusedError: .* \(127.0.0.1:{port}\)"):
        transport.request("POST", "/heartbeat", "t", body={})


def test_download_is_streamed_and_capped(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.downloads["ver_1"] = plane.downloads["ver_2"] = b"z" * 5000
    assert client.download_skill("ver_1", tmp_path / "a.zip").size == 5000
    assert (tmp_path / "a.zip").read_bytes() == b"z" * 5000
    with pytest.raises(Invalid, match="over 100"):
        client.download_skill("ver_2", tmp_path / "b.zip", cap=100)


def test_upload_is_multipart_from_the_file_with_one_content_length(plane, tmp_path):
    client = make(plane.url, tmp_path)
    archive = tmp_path / "s.zip"
    archive.write_bytes(b"PK\x03\x04zipdata")
    client.upload_skill({"agent_id": "a", "skill_id": "s1"}, archive)
    [request] = plane.seen(r"/skills/upload$")
    assert request.headers["Content-Type"].startswith("multipart/form-data; boundary=")
    assert b'name="skill_id"\r\n\r\ns1\r\n' in request.body and b"PK\x03\x04zipdata" in request.body
    assert int(request.headers["Content-Length"]) == len(request.body)
    assert "Transfer-Encoding" not in request.headers  # Go's plane reads a length, not chunks


def test_config_revision_raw_keeps_bytes(plane, tmp_path):
    client = make(plane.url, tmp_path)
    raw = b'{"success":true,"data":{"revision":{"id":5,"content":{"b":1,"a":2}}}}'
    plane.fault(r"/config/revisions/5$", body=raw)
    assert client.config_revision_raw(5) == raw


def test_upload_reaches_a_real_server_unchunked(tmp_path):
    """Against the plane over HTTP: one Content-Length, no chunked framing (Go's server reads it)."""
    import zipfile

    from plane_helpers import uploads

    from caldera.plane.server import PlaneServer

    plane = PlaneServer(str(tmp_path / "p.db"), tokens={"boot-token-xyz": 7}).start()
    try:
        client = ControlPlaneClient(Transport(plane.url), None)
        hello = {"instance_id": 7, "agent_id": "caldera-7-main", "agent_version": "caldera-test",
                 "protocol_version": "v1", "capabilities": [], "host_info": {"runtime_type": "caldera"}}
        client.auth = Auth(bootstrap_token="boot-token-xyz",
                           session_file=SessionFile(tmp_path / "s.json", plane.url, 7),
                           register=lambda: client.register(hello), redactor=Redactor())
        archive = tmp_path / "hello.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("hello/SKILL.md", "hello\n")
        client.upload_skill({"agent_id": "caldera-7-main", "skill_id": "hello", "skill_version": "1",
                             "identifier": "hello", "content_md5": "bab02a68eaf254c164cf4d590bdd8693",
                             "source": "runtime"}, archive)
        assert len(uploads(plane.store, 7)) == 1
    finally:
        plane.stop()


def test_a_body_nested_too_deep_is_one_failed_call(plane, tmp_path):
    client = make(plane.url, tmp_path)
    plane.fault(r"/heartbeat$", body=b'{"success": true, "data": ' + b"[" * 20000 + b"]" * 20000 + b"}")
    plane.fault(r"/heartbeat$", status=400, body=b"[" * 20000 + b"]" * 20000)
    # a 2xx whose body is not usable JSON was not taken (issue 13: retried, e.g. a finish stays queued)
    with pytest.raises(Unaccepted, match="nested deeper than 64 levels"):
        client.heartbeat({})
    with pytest.raises(Invalid):  # an error body too deep: still just that call's error
        client.heartbeat({})
    assert client.heartbeat({})["has_pending_command"] is False  # the next call works


def test_an_encoded_answer_nobody_asked_for_is_not_taken(plane, tmp_path):
    client = make(plane.url, tmp_path)
    client.auth.token()
    plane.fault(r"/heartbeat$", headers={"Content-Encoding": "gzip"})
    with pytest.raises(Unaccepted, match="gzip-encoded"):
        client.heartbeat({})
    assert plane.requests[-1].headers.get("Accept-Encoding") == "identity"


def test_a_session_the_disk_cannot_hold_is_used_from_memory(tmp_path, caplog, monkeypatch):
    """register's answer is the plane's word even when session.json cannot be written (a full
    state dir): the call that registered gets its token, later calls use it, and the log says
    the next start registers again -- one register, not one per call."""
    from caldera.protocol import session as session_mod

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(session_mod, "atomic_write_json", full)
    registers = []

    def register():
        registers.append(1)
        return {"session_token": "sess-from-plane", "heartbeat_interval_seconds": 15}

    auth = Auth(bootstrap_token="boot", session_file=SessionFile(tmp_path / "session.json", "http://x", 7),
                register=register, redactor=Redactor())
    assert auth.token() == "sess-from-plane"
    assert auth.token() == "sess-from-plane"
    assert registers == [1]
    assert not (tmp_path / "session.json").exists()
    assert "session.json not written (No space left on device)" in caplog.text


# ------------------------------------------------------------------ connections: pooled, stale, closed

def test_calls_share_one_keep_alive_connection(plane, tmp_path):
    accepted = count_connections(plane.server)
    client = make(plane.url, tmp_path)
    client.heartbeat({})  # register and heartbeat
    client.heartbeat({})
    assert len(plane.requests) == 3 and len(accepted) == 1


def test_threads_never_share_a_connection_and_reuse_the_pools(plane):
    accepted = count_connections(plane.server)
    transport = Transport(plane.url)
    barrier = threading.Barrier(4)
    errors = []

    def calls():
        barrier.wait()
        try:
            for _ in range(5):
                transport.request("POST", "/heartbeat", "t", body={})
        except Exception as exc:  # noqa: BLE001  # any failure is the test's
            errors.append(exc)

    threads = [threading.Thread(target=calls) for _ in range(4)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert errors == [] and len(plane.seen(r"/heartbeat$")) == 20
    assert 1 <= len(accepted) <= 4  # one connection per thread at most, kept between calls


def test_a_connection_idle_too_long_is_not_used(plane, monkeypatch):
    from caldera.protocol import http

    accepted = count_connections(plane.server)
    transport = Transport(plane.url)
    transport.request("POST", "/heartbeat", "t", body={})
    monkeypatch.setattr(http, "IDLE_MAX", 0.0)
    transport.request("POST", "/heartbeat", "t", body={})
    assert len(accepted) == 2


def test_an_answer_not_read_to_its_end_closes_its_connection(plane, tmp_path):
    accepted = count_connections(plane.server)
    client = make(plane.url, tmp_path)
    client.auth.token()
    plane.fault(r"/heartbeat$", size=BODY_CAP + 1)
    with pytest.raises(TooLarge):
        client.heartbeat({})
    client.heartbeat({})
    assert len(accepted) == 2  # the rest of the large answer was never taken for the next one's


def _keep_alive_then(then):
    """Connection 1 answers one request and then does `then(server, sock)`; later
    connections answer every request."""
    def serve(sock, number):
        while server.read_request(sock) is not None:
            sock.sendall(answer())
            if number == 1:
                then(server, sock)
                return

    server = RawServer(serve)
    return server


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_connection_the_server_closed_while_idle_is_not_used(method):
    closed = threading.Event()

    def close_it(server, sock):
        sock.close()
        closed.set()

    with _keep_alive_then(close_it) as server:
        transport = Transport(server.url)
        transport.request(method, "/heartbeat", "t")
        assert closed.wait(5)
        transport.request(method, "/heartbeat", "t")  # on a new connection, sent once
    assert server.connections == 2 and len(server.requests) == 2


def test_a_get_is_resent_once_when_its_reused_connection_breaks():
    def take_then_close(server, sock):
        server.read_request(sock)  # the plane closes it as our request arrives
        sock.close()

    with _keep_alive_then(take_then_close) as server:
        transport = Transport(server.url)
        transport.request("GET", "/commands/next", "t")
        transport.request("GET", "/commands/next", "t")
    assert server.connections == 2 and len(server.requests) == 3


def test_a_post_is_never_resent_when_its_connection_breaks():
    """Its bytes reached the plane, which may have acted on them: the caller decides."""
    def take_then_close(server, sock):
        server.read_request(sock)
        sock.close()

    with _keep_alive_then(take_then_close) as server:
        transport = Transport(server.url)
        transport.request("POST", "/commands/1/finish", "t", body={})
        with pytest.raises(Retryable, match="RemoteDisconnected|ConnectionReset"):
            transport.request("POST", "/commands/1/finish", "t", body={})
        assert server.connections == 1 and len(server.requests) == 2
        transport.request("POST", "/heartbeat", "t", body={})  # the next call: a new connection
    assert server.connections == 2


CUT_SHORT = {
    "a body shorter than its Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"success\":",
    "a chunked body cut off": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"suc\r\n",
    "closed before any answer": b"",
    "closed inside the status line": b"HTTP/1.1 2",
}


@pytest.mark.parametrize("what", CUT_SHORT)
def test_an_answer_cut_short_is_retryable_never_taken(what):
    def serve(sock, number):
        server.read_request(sock)
        sock.sendall(CUT_SHORT[what])

    with RawServer(serve) as server:
        transport = Transport(server.url)
        with pytest.raises(Retryable) as err:
            transport.request("POST", "/heartbeat", "t", body={})
    assert type(err.value) is Retryable  # not Unaccepted: nothing of it was read as an answer


def test_a_trickling_answer_is_cut_at_the_total_deadline():
    def serve(sock, number):
        server.read_request(sock)
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not server.released.wait(0.05):
            sock.sendall(b"1\r\n \r\n")

    with RawServer(serve) as server:
        started = time.monotonic()
        with pytest.raises(Retryable, match="no complete answer within"):
            Transport(server.url).request("POST", "/heartbeat", "t", body={}, total=0.5)
        assert time.monotonic() - started < 3  # each byte came within the read timeout


def test_abort_interrupts_a_request_in_its_tls_handshake(tmp_path):
    """The watch holds the socket before the handshake: a server that accepts and says
    nothing is left at once on stop, not after the connect timeout."""
    def silent(sock, number):
        server.released.wait(30)

    with RawServer(silent) as server:
        transport = Transport(f"https://127.0.0.1:{server.port}")
        outcome = {}

        def call():
            try:
                transport.request("POST", "/heartbeat", "t", body={})
            except Retryable as exc:
                outcome["error"] = str(exc)

        thread = threading.Thread(target=call)
        thread.start()
        while not server.connections:
            threading.Event().wait(0.01)
        threading.Event().wait(0.1)  # into the handshake's read
        started = time.monotonic()
        assert transport.abort("stopping") == 1
        thread.join(10)
    assert not thread.is_alive() and outcome["error"] == "interrupted: stopping"
    assert time.monotonic() - started < 2


# ------------------------------------------------------------------ proxies and TLS

def _tls_plane(tmp_path, host):
    cert, key = tls_certificate(tmp_path, host)
    plane = FaultPlane()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    plane.server.socket = context.wrap_socket(plane.server.socket, server_side=True)
    return plane.start(), cert


def test_https_goes_through_the_proxys_connect_tunnel_with_its_credentials(tmp_path, no_proxies):
    """The plane's name resolves nowhere here: only the proxy's tunnel reaches it. The
    proxy sees host and port and its own credentials, never the bearer token; the tunnel
    is kept for the next call."""
    plane, cert = _tls_plane(tmp_path, "plane.test")
    try:
        with ConnectProxy(plane.server.server_address[1]) as proxy:
            no_proxies.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://us%3Aer:p%40ss@"))
            no_proxies.setenv("NO_PROXY", "localhost,127.0.0.1")
            url = f"https://plane.test:{plane.server.server_address[1]}"
            client = make(url, tmp_path, ca_bundle=str(cert))
            client.heartbeat({})
            client.heartbeat({})
    finally:
        plane.stop()
    [(target, headers)] = proxy.connects
    assert target == f"plane.test:{plane.server.server_address[1]}"
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"us:er:p@ss").decode()
    assert auths(plane) == ["Bearer boot-token-xyz", f"Bearer {FIRST}", f"Bearer {FIRST}"]
    assert b"Bearer" not in bytes(proxy.sent)  # inside TLS


def test_the_plane_certificate_is_always_verified(tmp_path, no_proxies):
    plane, cert = _tls_plane(tmp_path, "localhost")
    try:
        url = f"https://localhost:{plane.server.server_address[1]}"
        with pytest.raises(Retryable, match="CERTIFICATE_VERIFY_FAILED"):
            Transport(url).request("POST", "/heartbeat", "t", body={})
        no_proxies.setenv("REQUESTS_CA_BUNDLE", str(cert))  # honoured, as requests did
        Transport(url).request("POST", "/heartbeat", "t", body={})
        assert Transport(url, ca_bundle=str(cert)).request("POST", "/heartbeat", "t", body={}) == {
            "has_pending_command": False}
    finally:
        plane.stop()
    assert len(plane.requests) == 2


def test_http_goes_to_the_proxy_in_absolute_form(plane, tmp_path, no_proxies):
    with ForwardProxy(plane.url) as proxy:
        no_proxies.setenv("http_proxy", proxy.url.replace("http://", "http://u:pw@"))
        no_proxies.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead_port()}")  # the lower-case one wins
        client = make("http://plane.test:8080", tmp_path)
        client.heartbeat({})
        client.heartbeat({})  # the proxy closes each connection: a new one each time
    assert proxy.seen == [("POST", f"http://plane.test:8080{API}/{path}")
                          for path in ("register", "heartbeat", "heartbeat")]
    assert {h.get("Proxy-Authorization") for h in proxy.headers} == {"Basic " + base64.b64encode(b"u:pw").decode()}
    assert "Proxy-Authorization" not in plane.requests[0].headers


def test_a_proxy_that_is_not_there_is_named(tmp_path, no_proxies):
    no_proxies.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead_port()}")
    with pytest.raises(Retryable, match="ProxyError: through the proxy 127.0.0.1:"):
        Transport("http://plane.test").request("POST", "/heartbeat", "t", body={})


def test_an_unsupported_proxy_is_refused_with_a_sentence(no_proxies):
    no_proxies.setenv("HTTPS_PROXY", "socks5://user:secret@proxy.corp:1080")
    with pytest.raises(Retryable) as err:
        Transport("https://plane.test").request("POST", "/heartbeat", "t", body={})
    assert "socks5://proxy.corp:1080" in str(err.value) and "secret" not in str(err.value)


# url, environment, the proxy chosen (None: directly)
SELECTION = [
    ("https://plane.corp/x", {"HTTPS_PROXY": "http://p:1"}, "http://p:1"),
    ("https://plane.corp/x", {"https_proxy": "http://low:1", "HTTPS_PROXY": "http://up:1"}, "http://low:1"),
    ("https://plane.corp/x", {"https_proxy": "", "HTTPS_PROXY": "http://up:1"}, None),
    ("https://plane.corp/x", {"HTTP_PROXY": "http://p:1"}, None),
    ("http://plane.corp/x", {"HTTP_PROXY": "http://p:1"}, "http://p:1"),
    ("http://plane.corp/x", {"HTTP_PROXY": "http://p:1", "REQUEST_METHOD": "GET"}, None),
    ("https://plane.corp/x", {"ALL_PROXY": "http://all:1"}, "http://all:1"),
    ("https://plane.corp/x", {"ALL_PROXY": "http://all:1", "HTTPS_PROXY": "http://p:1"}, "http://p:1"),
    ("https://plane.corp/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "plane.corp"}, None),
    ("https://api.plane.corp/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "plane.corp"}, None),
    ("https://api.plane.corp/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".plane.corp"}, None),
    ("https://PLANE.corp/x", {"HTTPS_PROXY": "http://p:1", "no_proxy": "plane.CORP"}, None),
    ("https://notplane.corp/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "plane.corp"}, "http://p:1"),
    ("https://plane.corp:8443/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "plane.corp:8443"}, None),
    ("https://plane.corp:9443/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "plane.corp:8443"}, "http://p:1"),
    ("https://plane.corp/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
    ("https://plane.corp/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": " other , plane.corp "}, None),
    ("https://10.1.2.3/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, None),
    ("https://11.1.2.3/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, "http://p:1"),
    ("https://10.1.2.3/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3"}, None),
    ("https://10.1.2.3/x", {"HTTPS_PROXY": "http://p:1", "no_proxy": "", "NO_PROXY": "10.1.2.3"}, None),
    ("https://10.1.2.4/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3,10.1.3.0/24"}, "http://p:1"),
]


@pytest.mark.parametrize(("url", "env", "chosen"), SELECTION)
def test_the_proxy_is_chosen_from_the_environment_as_requests_chose_it(url, env, chosen, no_proxies):
    from caldera.host.proxies import proxy_for

    assert proxy_for(url, env) == chosen
    requests_utils = pytest.importorskip("requests.utils")  # the reference, where it is installed
    for name, value in env.items():
        no_proxies.setenv(name, value)
    found = requests_utils.select_proxy(url, requests_utils.get_environ_proxies(url)) or None
    if url.startswith("https://notplane") and found is None:
        return  # requests before 2.32 matched a NO_PROXY name as a bare suffix; 2.32 and caldera do not
    assert found == chosen


def test_a_proxy_url_gives_host_port_and_never_shows_its_credentials():
    from caldera.host.proxies import parse_proxy

    proxy = parse_proxy("proxy.corp:3128")
    assert (proxy.scheme, proxy.host, proxy.port, proxy.authorization) == ("http", "proxy.corp", 3128, None)
    assert parse_proxy("http://user@proxy.corp").authorization is None  # as requests: no password, no header
    proxy = parse_proxy("http://us%40er:p%3Ass@Proxy.Corp")
    assert (proxy.host, proxy.port) == ("proxy.corp", 80)
    assert proxy.authorization == "Basic " + base64.b64encode(b"us@er:p:ss").decode()
    assert "p:ss" in proxy.secrets and "p:ss" not in repr(proxy) and proxy.shown == "proxy.corp:80"


@pytest.mark.parametrize(("scheme", "port", "host"), [("https", 443, "plane"), ("https", 8443, "plane:8443"),
                                                      ("http", 80, "plane"), ("http", 443, "plane:443")])
def test_the_host_header_leaves_out_only_the_schemes_own_port(scheme, port, host):
    from caldera.protocol.http import Connection, Route

    class Sink:
        data = b""

        def sendall(self, data):
            self.data += data

    conn = Connection(Route(scheme, "plane", port), None, 1)
    conn.sock = sink = Sink()
    conn.request("GET", "/x")
    assert f"\r\nHost: {host}\r\n".encode() in sink.data
