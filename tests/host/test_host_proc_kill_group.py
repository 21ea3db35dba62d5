"""proc.kill_group: the one TERM -> grace -> KILL, for long-lived children too (Codex, the demo)."""
import signal
import subprocess
import sys

from caldera.host import proc

IGNORES_TERM = ("import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\n"
                "while True: time.sleep(1)\n")
WAITS = "import sys, time\nprint('ready', flush=True)\nwhile True: time.sleep(1)\n"


def _start(code):
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert child.stdout.readline() == b"ready\n"  # signal handlers are in place
    return child


def test_term_ends_a_child_that_obeys_it():
    child = _start(WAITS)
    assert proc.kill_group(child, grace=30.0) == -signal.SIGTERM
    child.stdout.close()


def test_kill_after_the_grace_for_a_child_ignoring_term():
    child = _start(IGNORES_TERM)
    assert proc.kill_group(child, grace=0.2, reap=30.0) == -signal.SIGKILL
    child.stdout.close()


def test_a_group_already_gone_is_no_error():
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.wait()
    assert proc.kill_group(child, grace=0.1) == 0


def test_wait_exit_is_woken_by_the_exit_not_a_polling_step(monkeypatch):
    # Popen.wait(timeout) looks with WNOHANG, sleeping up to 50 ms between looks; a pidfd wakes
    # at the exit itself, and the exited child is then reaped with one blocking waitpid.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"], start_new_session=True)
    looks = []
    try_wait = subprocess.Popen._try_wait
    monkeypatch.setattr(subprocess.Popen, "_try_wait", lambda self, flags: looks.append(flags) or try_wait(self, flags))
    assert proc.wait_exit(child, 0.05) is None  # still running: None after the timeout
    assert proc.wait_exit(child, 30.0) == 0
    assert looks == [0], looks  # no WNOHANG looks: one blocking reap, after the exit


def test_wait_exit_without_pidfds_is_popens_wait(monkeypatch):
    def no_pidfd(pid):
        raise OSError(38, "Function not implemented")
    monkeypatch.setattr(proc.os, "pidfd_open", no_pidfd)
    child = _start(WAITS)
    assert proc.wait_exit(child, 0.05) is None
    child.terminate()
    assert proc.wait_exit(child, 30.0) == -signal.SIGTERM
    assert proc.wait_exit(child, 0.05) == -signal.SIGTERM  # already reaped: its code again
    child.stdout.close()
