"""The control socket: a deep state dir (past sun_path's 108 bytes), one JSON line each way,
hostile requests answered with a sentence, the socket's mode, and no daemon = NoDaemon."""
import json
import os
import socket
import stat

import pytest

from caldera.agents.adapter.answer import DONE, Answer
from caldera.agents.process import control
from caldera.redact import Redactor


class FakeDriver:
    def __init__(self):
        self.calls = []

    def log_list(self):
        self.calls.append("log --list")
        answer = Answer(verb="log --list", kind=DONE, message="1 log.")
        answer.data = {"logs": ["agent.log"]}
        return answer

    def pause(self):
        self.calls.append("pause")
        return Answer(verb="pause", kind=DONE, message="Paused; token s3cret-value-here")

    def status_body(self):
        return {"state": {"level": "ok", "label": "Running"}}, {"pid": 42, "status": "running"}


@pytest.fixture
def served(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    driver = FakeDriver()
    server = control.ControlServer(driver, deep, Redactor(["s3cret-value-here"]))
    server.start()
    yield deep, driver
    server.close()


def test_a_deep_state_dir_works_and_the_socket_is_0600(served):
    deep, driver = served
    assert len(str(deep / control.SOCKET_NAME).encode()) > 108
    assert stat.S_IMODE(os.stat(deep / control.SOCKET_NAME).st_mode) == 0o600
    reply = control.call(deep, "log --list")
    assert reply["ok"] and reply["data"] == {"logs": ["agent.log"]}
    assert control.call(deep, "status")["process"] == {"pid": 42, "status": "running"}


def test_replies_are_redacted(served):
    deep, _ = served
    reply = control.call(deep, "pause")
    assert "s3cret-value-here" not in json.dumps(reply) and reply["message"].startswith("Paused")


def _raw(deep, data: bytes) -> dict:
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)
        sock.connect(f"/proc/self/fd/{fd}/{control.SOCKET_NAME}")
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return json.loads(got) if got else {}
    finally:
        sock.close()
        os.close(fd)


@pytest.mark.parametrize("data, needle", [
    (b'{"verb": "rm -rf"}\n', "unknown verb"),
    (b'[1, 2]\n', "one JSON object"),
    (b'{"verb": "settings set", "args": "x"}\n', "unknown verb"),
])
def test_hostile_requests_get_a_sentence(served, data, needle):
    deep, driver = served
    assert needle in _raw(deep, data)["message"]
    assert driver.calls == []


def test_garbage_and_oversized_requests_are_refused_and_the_server_goes_on(served):
    deep, driver = served
    assert _raw(deep, b"\xff\xfe not json\n")["message"].startswith("refused: ")
    assert "over 64 KiB" in _raw(deep, b"{" + b" " * (control.LINE_MAX + 10))["message"]
    assert control.call(deep, "log --list")["ok"]  # still serving


def test_no_daemon(tmp_path):
    with pytest.raises(control.NoDaemon):
        control.call(tmp_path, "pause")
    (tmp_path / control.SOCKET_NAME).touch()  # a stale file, nobody listening
    with pytest.raises(control.NoDaemon):
        control.call(tmp_path, "pause")
