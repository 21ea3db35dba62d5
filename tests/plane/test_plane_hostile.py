"""The plane against hostile clients: authenticate before reading a body, cap bodies (413)
before buffering them, 400 for JSON nested too deep, and an upload's totals across members."""
import io
import socket
import zipfile

import pytest
from plane_helpers import AGENT, agent, clock, plane  # noqa: F401

from caldera.plane import upload


def _raw(plane, head: str) -> bytes:
    """Send only a request head (no body) and read the answer the plane gives at once."""
    host, port = plane.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode())
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def _head(path: str, token: str, length: int) -> str:
    return (f"POST /api/v1/agent{path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n")


@pytest.mark.parametrize("path", ["/heartbeat", "/skills/upload", "/state/report"])
def test_a_wrong_token_is_answered_before_the_body_is_read(plane, path):
    # 200 MiB announced, not one byte sent: the plane answers 401 at once and closes.
    answer = _raw(plane, _head(path, "agt_sess_stolen_or_guessed", 200 * 1024 * 1024))
    assert answer.startswith(b"HTTP/1.1 401") and b"session token" in answer


def test_register_with_an_unknown_bootstrap_token_is_refused_unread(plane):
    answer = _raw(plane, _head("/register", "not-a-bootstrap-token", 50 * 1024 * 1024))
    assert answer.startswith(b"HTTP/1.1 400") and b"invalid agent bootstrap token" in answer


def test_a_body_over_the_cap_is_413_before_buffering(plane, agent):
    answer = _raw(plane, _head("/heartbeat", agent.token, 64 * 1024 * 1024))
    assert answer.startswith(b"HTTP/1.1 413")
    assert plane.count("POST", "/heartbeat", 413) == 1


def test_json_nested_too_deep_is_400_not_500(plane, agent):
    body = b'{"agent_id": "' + AGENT.encode() + b'", "x": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    resp = agent.http.post(agent.base + "/heartbeat", data=body, headers={
        "Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"})
    assert resp.status_code == 400 and "nested deeper than 64 levels" in resp.json()["error"]
    assert agent.heartbeat().status_code == 200  # and the plane is fine


def _zip(members: int, size: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("alpha/SKILL.md", "# alpha\n")
        for n in range(members):
            zf.writestr(f"alpha/data/{n}.bin", b"\0" * size)
    return buf.getvalue()


def test_upload_ratio_is_judged_across_members():
    # 40 members of 100 KiB zeros: each one small, together 4 MiB from a few KiB.
    data = _zip(40, 100 * 1024)
    with pytest.raises(upload.UploadError, match="ratio across its members"):
        upload.check_package(data)
    upload.check_package(_zip(2, 1024))  # a normal package passes


def test_upload_total_unpacked_size_is_capped(monkeypatch):
    monkeypatch.setattr(upload, "MAX_UNPACKED", 64 * 1024)
    monkeypatch.setattr(upload, "MAX_RATIO", 10 ** 9)
    with pytest.raises(upload.UploadError, match="unpacks to"):
        upload.check_package(_zip(10, 10 * 1024))


def test_upload_of_a_bomb_is_refused_over_http(plane, agent):
    # Refused with the reason; the status is the real server's for archive problems (500, unmapped).
    resp = agent.http.post(agent.base + "/skills/upload", data={"agent_id": AGENT, "identifier": "alpha"},
                           files={"file": ("alpha.zip", _zip(40, 100 * 1024))},
                           headers={"Authorization": f"Bearer {agent.token}"})
    assert resp.status_code == 500 and "ratio across its members" in resp.json()["error"]
    assert plane.store.skill_version(1) is None  # nothing kept


def test_a_stray_path_does_not_buffer_a_large_body(plane):
    head = "POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 10485760\r\n\r\n"
    assert _raw(plane, head).startswith(b"HTTP/1.1 413")
