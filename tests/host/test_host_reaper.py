"""caldera.host.reaper's parent half without a PID namespace (tests/daemon/test_daemon_container.py
runs the whole of it as a real PID 1): signals forwarded to the runtime, its status passed on."""
import os
import signal
import subprocess
import sys
import time

import pytest

# The child half stands in for the runtime: its handlers, then unblock (as Signals.install does).
SCRIPT = r"""
import os, signal, sys, time
from caldera.host import reaper
reaper.split_if_init(pid=1)  # as if PID 1: the parent reaps and never returns
signal.signal(signal.SIGTERM, lambda *_: os._exit(7))
signal.signal(signal.SIGHUP, lambda *_: open(sys.argv[1] + ".hup", "w").close())
signal.pthread_sigmask(signal.SIG_UNBLOCK, reaper.FORWARDED)
open(sys.argv[1], "w").write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def _start(tmp_path):
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ready)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not (ready.exists() and ready.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the child half never started"
        time.sleep(0.02)
    return proc, int(ready.read_text()), ready


def test_signals_reach_the_runtime_and_its_status_is_the_exit_status(tmp_path):
    proc, runtime, ready = _start(tmp_path)
    try:
        assert runtime != proc.pid
        proc.send_signal(signal.SIGHUP)  # forwarded: the runtime reloads, nobody exits
        deadline = time.monotonic() + 10
        while not (tmp_path / "ready.hup").exists():
            assert time.monotonic() < deadline, "SIGHUP was not forwarded"
            time.sleep(0.02)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 7  # the runtime's own exit status
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with proc.stderr:  # closed: warnings are errors (setup.cfg), an unclosed pipe's ResourceWarning too
        assert b"this process reaps orphans" in proc.stderr.read()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV])
def test_a_runtime_ended_by_a_signal_exits_128_plus_it(tmp_path, signum):
    proc, runtime, _ = _start(tmp_path)
    os.kill(runtime, signum)
    assert proc.wait(10) == 128 + signum
    proc.stderr.close()


@pytest.mark.skipif(os.getpid() == 1, reason="the test runner is PID 1 here: it would split")
def test_anywhere_but_pid_1_nothing_splits():
    from caldera.host import reaper

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    reaper.split_if_init()  # pytest is not PID 1: returns at once, nothing forked or blocked
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
