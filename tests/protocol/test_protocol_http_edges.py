"""The client's HTTP layer against answers at the edges of HTTP/1.1, on real loopback
sockets: interim (1xx) answers, answers without a body by rule followed by stray bytes, an
answer sent before an upload was read, headers and URLs that cannot be sent, CA bundles,
proxies (scripted raw answers: rawhttp_helpers.RawServer)."""
import json
import os
import socket
import ssl
import struct
import subprocess
import threading
import time

import pytest
from backends_proxy import PROXIES, tls_certificate
from rawhttp_helpers import RawServer, answer

from caldera.protocol.client import (
    Invalid,
    MultipartFile,
    Redirected,
    Retryable,
    Transport,
    Unaccepted,
    Unauthorized,
    Unsendable,
)
from caldera.protocol.session import Auth, SessionFile
from caldera.redact import Redactor


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    """No proxy or CA variable of the host's reaches a test unless the test sets it."""
    for name in (*PROXIES, "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


LATE = answer(500, b'{"success":false,"message":"the real answer"}')


def _ok(data):
    return answer(200, json.dumps({"success": True, "data": data}).encode())


@pytest.mark.parametrize("interim", [b"102 Processing", b"103 Early Hints\r\nLink: </x>; rel=preload"])
def test_an_interim_answer_is_no_answer_and_its_connection_is_closed(interim):
    """A 102/103 (http.client skips only a 100) is not the final answer: its empty body is
    not a success, and the real answer behind it is never read as the next request's."""
    def serve(sock, number):
        if server.read_request(sock) is None:
            return
        if number == 1:
            sock.sendall(b"HTTP/1.1 " + interim + b"\r\n\r\n")
            time.sleep(0.1)
            sock.sendall(LATE)
        else:
            sock.sendall(_ok({"for": "request 2"}))
        server.released.wait(5)

    with RawServer(serve) as server:
        transport = Transport(server.url)
        with pytest.raises(Retryable, match="interim answer"):
            transport.request("POST", "/commands/1/finish", "t", body={})
        assert transport.request("GET", "/commands/next", "t") == {"for": "request 2"}
    assert server.connections == 2


@pytest.mark.parametrize("status", [204])
def test_a_connection_whose_answer_has_no_body_by_rule_is_not_reused(status):
    """Bytes a server writes after its 204 are never read as the next request's answer."""
    def serve(sock, number):
        if server.read_request(sock) is None:
            return
        if number == 1:
            sock.sendall(f"HTTP/1.1 {status} X\r\n\r\n".encode())
            time.sleep(0.1)
            sock.sendall(_ok({"command": {"id": 666, "command_type": "stale-bytes"}}))
            server.read_request(sock)
            sock.sendall(_ok({"command": {"id": 666, "command_type": "stale-bytes"}}))
        else:
            sock.sendall(_ok({"command": None}))
        server.released.wait(5)

    with RawServer(serve) as server:
        transport = Transport(server.url)
        assert transport.request("POST", "/heartbeat", "t", body={}) is None
        assert transport.request("GET", "/commands/next", "t") == {"command": None}
    assert server.connections == 2


@pytest.mark.parametrize("status, error", [(413, Invalid), (401, Unauthorized)])
def test_an_answer_sent_before_the_upload_was_read_is_the_answer(tmp_path, status, error):
    """The plane refuses an upload from its head and closes (reset): its answer is the
    call's, not a retryable broken pipe (a 401 must renew the session, a 413 stop retrying)."""
    archive = tmp_path / "s.zip"
    archive.write_bytes(os.urandom(4 * 1024 * 1024))

    def serve(sock, number):
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        sock.sendall(answer(status, b'{"success":false,"message":"refused unread"}', close=True))
        time.sleep(0.1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset

    with RawServer(serve) as server:
        form = MultipartFile({"name": "s"}, "file", archive, "s.zip")
        with pytest.raises(error, match="refused unread"):
            Transport(server.url).request("POST", "/skills/upload", "t", data=form,
                                          headers={"Content-Type": form.content_type})


def test_a_ca_bundle_that_cannot_be_read_is_a_retryable_sentence(no_proxies, tmp_path):
    """REQUESTS_CA_BUNDLE is not checked at start: a missing or broken one is named (the
    variable and its path) in a retryable error, never a bare OSError out of the call."""
    not_a_cert = tmp_path / "not-a-cert.pem"
    not_a_cert.write_text("no certificate here\n")
    for path in ("/nonexistent/ca.pem", str(not_a_cert)):
        no_proxies.setenv("REQUESTS_CA_BUNDLE", path)
        with pytest.raises(Retryable, match=f"the CA bundle REQUESTS_CA_BUNDLE names \\({path}\\) cannot be used"):
            Transport("https://localhost:1").request("GET", "/x", "t")


def test_a_ca_bundle_rotated_on_disk_is_read_again(tmp_path):
    """The plane's private CA renewed (bundle and certificate together): the next new
    connection verifies against the new bundle, without a restart."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first, second = tls_certificate(tmp_path / "one", "localhost"), tls_certificate(tmp_path / "two", "localhost")
    serving = [first]
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(first[0].read_bytes())

    with _tls_server(serving) as server:
        transport = Transport(f"https://localhost:{server.port}", ca_bundle=str(bundle))
        assert transport.request("GET", "/x", "t") == {"n": 1}
        serving[0] = second
        bundle.write_bytes(second[0].read_bytes())
        later = bundle.stat().st_mtime_ns + 2_000_000_000  # a file system with coarse times
        os.utime(bundle, ns=(later, later))
        assert transport.request("GET", "/x", "t") == {"n": 2}


@pytest.mark.parametrize("token", ["s3cr3t-session-token\n", "s3cr3t\r\nX-Evil: 1"])
def test_a_token_that_cannot_be_a_header_is_unsendable_and_never_quoted(token):
    def serve(sock, number):
        while server.read_request(sock):
            sock.sendall(answer())

    with RawServer(serve) as server:
        with pytest.raises(Unsendable, match="the Authorization header holds a character") as err:
            Transport(server.url).request("GET", "/commands/next", token)
        assert not server.requests
    assert "s3cr3t" not in str(err.value)


def test_a_url_that_cannot_be_sent_is_unsendable():
    def serve(sock, number):
        while server.read_request(sock):
            sock.sendall(answer())

    with RawServer(serve) as server:
        with pytest.raises(Unsendable, match="the URL or a header holds a character"):
            Transport(server.url).request("GET", "/commands/a b\n", "t")
        assert not server.requests


def test_register_answering_a_token_that_cannot_be_a_header_is_not_taken(tmp_path):
    auth = Auth(bootstrap_token="boot", session_file=SessionFile(tmp_path / "session.json", "http://p", 7),
                register=lambda: {"session_token": "agt_sess_x\n"}, redactor=Redactor())
    with pytest.raises(Unaccepted, match="not one line of printable characters") as err:
        auth.token()
    assert "agt_sess_x" not in str(err.value) and not (tmp_path / "session.json").exists()


def _tls_server(serving):
    """A TLS plane with the certificate (cert, key) `serving[0]` names (a test may swap it):
    one answer per connection, then close."""
    def serve(sock, number):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*serving[0])
        with context.wrap_socket(sock, server_side=True) as tls:
            if server.read_request(tls):
                tls.sendall(_ok({"n": number}).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))

    server = RawServer(serve)
    return server


def test_a_ca_directory_of_hashed_certificates_verifies_the_plane(tmp_path):
    cert, key = tls_certificate(tmp_path, "localhost")
    directory = tmp_path / "cas"
    directory.mkdir()
    name = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(cert)], capture_output=True,
                          text=True, check=True, timeout=30).stdout.strip()
    (directory / f"{name}.0").write_bytes(cert.read_bytes())
    with _tls_server([(cert, key)]) as server:
        assert Transport(f"https://localhost:{server.port}", ca_bundle=str(directory)).request(
            "GET", "/x", "t") == {"n": 1}
        (directory / f"{name}.0").unlink()  # the same directory without it: not trusted
        with pytest.raises(Retryable, match="CERTIFICATE_VERIFY_FAILED"):
            Transport(f"https://localhost:{server.port}", ca_bundle=str(directory)).request("GET", "/x", "t")


def test_abort_interrupts_a_request_in_its_tcp_connect():
    """A listener whose accept queue is full drops further SYNs: the connect waits. The
    watch holds the socket before its connect, so stopping ends it at once, not after the
    5 s connect timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    try:
        time.sleep(0.2)
        transport = Transport(f"http://127.0.0.1:{port}")
        timer = threading.Timer(0.3, transport.abort)
        timer.start()
        started = time.monotonic()
        with pytest.raises(Retryable, match="interrupted: stopping"):
            transport.request("GET", "/x", "t")
        assert time.monotonic() - started < 2
        timer.join()
    finally:
        for sock in (listener, *fillers):
            sock.close()


def _recording_proxy():
    """A proxy that refuses every request (407); `requests` holds what it was asked."""
    def serve(sock, number):
        if proxy.read_request(sock):
            sock.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")

    proxy = RawServer(serve)
    return proxy


def test_a_loopback_plane_is_never_reached_through_the_proxy(no_proxies):
    """As the backends' forwarder: plain http to loopback would hand the token to the proxy."""
    def serve(sock, number):
        while server.read_request(sock):
            sock.sendall(_ok({"direct": True}))

    with _recording_proxy() as proxy, RawServer(serve) as server:
        no_proxies.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        assert Transport(server.url).request("GET", "/x", "t") == {"direct": True}
        assert Transport(f"http://localhost:{server.port}").request("GET", "/x", "t") == {"direct": True}
    assert not proxy.requests and len(server.requests) == 2


def test_an_ipv6_plane_is_bracketed_in_the_proxys_connect(no_proxies):
    with _recording_proxy() as proxy:
        no_proxies.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
        with pytest.raises(Retryable, match="407"):
            Transport("https://[fd00::1]:8443").request("GET", "/x", "t")
    line = proxy.requests[0].split(b"\r\n")[0]
    assert line in (b"CONNECT [fd00::1]:8443 HTTP/1.0", b"CONNECT [fd00::1]:8443 HTTP/1.1")


def test_a_redirects_location_is_cut_and_shown_terminal_safe():
    location = "https://elsewhere.example/\x1b[2J" + "a" * 5000

    def serve(sock, number):
        while server.read_request(sock):
            sock.sendall(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())

    with RawServer(serve) as server:
        with pytest.raises(Redirected) as err:
            Transport(server.url).request("GET", "/x", "t")
    assert "Location: https://elsewhere.example/?[2Jaaa" in str(err.value)
    assert len(str(err.value)) < 320 and "\x1b" not in str(err.value)
