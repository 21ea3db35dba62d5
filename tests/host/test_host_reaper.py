"""caldera.host.reaper's parent half without a PID namespace (tests/daemon/test_daemon_container.py
runs the whole of it as a real PID 1): signals forwarded to the runtime, its status passed on."""
import os
import pty
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from caldera.host import reaper

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
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    reaper.split_if_init()  # pytest is not PID 1: returns at once, nothing forked or blocked
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_only_a_signal_a_process_sent_is_forwarded():
    """si_code <= 0: kill(2) (SI_USER), sigqueue (SI_QUEUE), tgkill (SI_TKILL); SI_KERNEL (0x80)
    is the terminal's, which the runtime in the same foreground group got itself."""
    assert reaper.forwards(0) and reaper.forwards(-1) and reaper.forwards(-6)
    assert not reaper.forwards(0x80)


# The runtime's stand-in for the terminal test: it counts the SIGINTs it receives as the
# runtime does (caldera.daemon.signals), by the wakeup fd's bytes: one per delivery, where
# the Python handlers of two signals close together run once.
COUNTING = r"""
import os, select, signal, sys
from caldera.host import reaper
reaper.split_if_init(pid=1)
r, w = os.pipe2(os.O_NONBLOCK)
signal.set_wakeup_fd(w, warn_on_full_buffer=False)
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda *_: None)
signal.pthread_sigmask(signal.SIG_UNBLOCK, reaper.FORWARDED)
open(sys.argv[1], "w").write(str(os.getpid()))
seen = 0
while True:
    select.select([r], [], [])
    for signum in os.read(r, 64):
        if signum == signal.SIGINT:
            seen += 1
            open(sys.argv[1] + ".int", "w").write(str(seen))
        elif signum == signal.SIGTERM:
            open(sys.argv[1] + ".final", "w").write(str(seen))
            os._exit(7)
"""


def on_a_terminal(argv: list[str], **popen) -> tuple[subprocess.Popen, int, threading.Thread, list[bytes]]:
    """`argv` as the session leader of a new pseudo-terminal (`setsid --ctty`), in its
    foreground process group, as `docker run -it` starts a container's command. Returns
    (the process, the terminal's master end, the thread draining it, what it read)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["setsid", "--ctty", *argv], stdin=slave, stdout=slave, stderr=slave, **popen)
    os.close(slave)
    read: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every slave end closed
                return
            if not chunk:
                return
            read.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    return proc, master, reader, read


def wait_file(path, proc, what):
    deadline = time.monotonic() + 20
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, what
        time.sleep(0.02)
    return path.read_text()


@pytest.mark.skipif(shutil.which("setsid") is None, reason="no setsid(1)")
def test_ctrl_c_at_a_terminal_reaches_the_runtime_once(tmp_path):
    """The terminal sends Ctrl-C's SIGINT to its whole foreground group: the PID 1 half and the
    runtime both get one. PID 1 must not pass its copy on (the runtime would count two: the
    second cancels a running command), while a SIGTERM a process sends is passed on."""
    ready = tmp_path / "ready"
    proc, master, reader, _ = on_a_terminal([sys.executable, "-c", COUNTING, str(ready)])
    try:
        wait_file(ready, proc, "the child half never started")
        os.write(master, b"\x03")  # Ctrl-C
        assert wait_file(tmp_path / "ready.int", proc, "the runtime never got the terminal's SIGINT") == "1"
        proc.send_signal(signal.SIGTERM)  # kill(2): forwarded; the runtime says how many SIGINTs it had
        assert proc.wait(10) == 7
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        reader.join(10)
    assert (tmp_path / "ready.final").read_text() == "1"


@pytest.mark.skipif(os.getpid() == 1, reason="the test runner is PID 1 here")
def test_caldera_run_splits_before_anything_else_is_imported(tmp_path):
    """A SIGTERM to a PID 1 without a handler is dropped: the split comes while caldera.cli
    is being imported (itself only begun), before caldera.config and the rest."""
    prefix = None
    for candidate in (["unshare", "--pid", "--fork"], ["unshare", "--user", "--map-root-user", "--pid", "--fork"]):
        if shutil.which("unshare") and subprocess.run([*candidate, "true"], capture_output=True).returncode == 0:
            prefix = candidate
            break
    if prefix is None:
        pytest.skip("no PID namespace here")
    probe = ("import sys\n"
             "sys.argv = ['caldera', 'run', '--agent', 'none']\n"
             "from caldera.host import reaper\n"
             "split = reaper.split_if_init\n"
             "def spy(pid=None):\n"
             "    print('split;', ' '.join(sorted(m for m in sys.modules if m.startswith('caldera'))), flush=True)\n"
             "    split(pid)\n"
             "reaper.split_if_init = spy\n"
             "import caldera.cli\n")
    done = subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["split; caldera caldera.cli caldera.host caldera.host.reaper"], done.stdout
    assert "caldera run is PID 1" in done.stderr
