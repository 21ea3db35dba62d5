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
