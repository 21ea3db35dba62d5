"""caldera.host.sdnotify against real AF_UNIX datagram sockets, the way systemd listens."""
import os
import socket
import struct
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from caldera.host import sdnotify

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def listener():
    """A bound datagram socket in a short directory (sun_path is at most 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="sdn") as where:
        path = os.path.join(where, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(5)
        try:
            yield sock, path
        finally:
            sock.close()


@pytest.fixture
def abstract_listener():
    name = f"caldera-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        yield sock, name
    finally:
        sock.close()


def test_ready_reaches_a_path_socket(listener):
    sock, path = listener
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": path}) is True
    assert sock.recv(4096) == b"READY=1"


def test_abstract_socket_named_with_at(abstract_listener):
    sock, name = abstract_listener
    assert sdnotify.notify("WATCHDOG=1", environ={"NOTIFY_SOCKET": "@" + name}) is True
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_several_assignments_travel_as_one_datagram(listener):
    sock, path = listener
    state = "STOPPING=1\nSTATUS=draining the running command"
    assert sdnotify.notify(state, environ={"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == state.encode()


def test_each_call_is_its_own_datagram_in_order(listener):
    sock, path = listener
    for state in ("READY=1", "WATCHDOG=1", "STOPPING=1"):
        assert sdnotify.notify(state, environ={"NOTIFY_SOCKET": path})
    assert [sock.recv(4096) for _ in range(3)] == [b"READY=1", b"WATCHDOG=1", b"STOPPING=1"]


def test_without_systemd_it_is_a_no_op():
    assert sdnotify.notify("READY=1", environ={}) is False
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": ""}) is False


def test_a_socket_that_went_away_is_reported_not_raised(tmp_path):
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": str(tmp_path / "gone")}) is False


def test_an_unusable_address_is_refused(listener):
    sock, path = listener
    # A relative path would depend on the cwd; systemd never sends one.
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": "notify"}) is False
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": "vsock:2:1234"}) is False
    sock.settimeout(0.2)
    with pytest.raises(socket.timeout):
        sock.recv(4096)


def test_the_sender_is_the_calling_process(listener):
    """NotifyAccess=main: systemd accepts a datagram only from the main pid, read from
    SCM_CREDENTIALS. A child process that calls notify() must show its own pid."""
    sock, path = listener
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    env = {**os.environ, "NOTIFY_SOCKET": path, "PYTHONPATH": str(ROOT)}
    code = "import sys; from caldera.host import sdnotify; sys.exit(0 if sdnotify.notify('READY=1') else 3)"
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    assert child.wait(timeout=30) == 0
    data, ancillary, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(12))
    assert data == b"READY=1"
    creds = [d for level, kind, d in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS]
    assert creds, "no SCM_CREDENTIALS received"
    pid, uid, _gid = struct.unpack("3i", creds[0][:12])
    assert pid == child.pid
    assert uid == os.getuid()


def test_the_socket_is_not_left_open(listener, monkeypatch):
    """One socket per call, closed at once: a daemon pinging every 90 s for months
    must not leak descriptors. (Each socket notify() made is checked, not the process's
    fd count, which threads left by other tests may change meanwhile.)"""
    sock, path = listener
    made = []

    class Tracked(socket.socket):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(sdnotify.socket, "socket", Tracked)
    for _ in range(50):
        assert sdnotify.notify("WATCHDOG=1", environ={"NOTIFY_SOCKET": path})
        assert sock.recv(4096) == b"WATCHDOG=1"
    ours = [s for s in made if s.family == socket.AF_UNIX]
    assert len(ours) >= 50 and all(s.fileno() == -1 for s in ours)


def test_a_listener_that_never_reads_does_not_block_forever(listener, monkeypatch):
    """The queue fills up; a send then gives up after SEND_TIMEOUT instead of hanging
    the daemon's main thread."""
    _sock, path = listener
    monkeypatch.setattr(sdnotify, "SEND_TIMEOUT", 0.05)
    results = []
    while len(results) < 100_000 and (not results or results[-1]):
        results.append(sdnotify.notify("WATCHDOG=1", environ={"NOTIFY_SOCKET": path}))
    assert results[0] is True
    assert results[-1] is False


@pytest.mark.parametrize("env, expected", [
    ({}, None),
    ({"WATCHDOG_USEC": ""}, None),
    ({"WATCHDOG_USEC": "180000000"}, 180.0),
    ({"WATCHDOG_USEC": "500000"}, 0.5),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "-5"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
])
def test_watchdog_interval_from_watchdog_usec(env, expected):
    assert sdnotify.watchdog_interval(environ=env) == expected


def test_watchdog_pid_names_the_process_that_pings():
    env = {"WATCHDOG_USEC": "180000000", "WATCHDOG_PID": str(os.getpid())}
    assert sdnotify.watchdog_interval(environ=env) == 180.0
    # Set for another process (e.g. inherited by an adapter): not ours to feed.
    assert sdnotify.watchdog_interval(environ=env, pid=os.getpid() + 1) is None
    assert sdnotify.watchdog_interval(environ={**env, "WATCHDOG_PID": "x"}) is None


def test_defaults_read_the_process_environment(listener, monkeypatch):
    sock, path = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 2.0
    assert sdnotify.notify("READY=1")
    assert sock.recv(4096) == b"READY=1"
