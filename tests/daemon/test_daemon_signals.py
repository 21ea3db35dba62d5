"""The signal handlers only count and poke a pipe; the main thread does the work."""
import os
import signal

import pytest

from caldera.daemon.signals import Signals


@pytest.fixture
def signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    sig = Signals()
    sig.install()
    yield sig
    for s, handler in saved.items():
        signal.signal(s, handler)
    _close(sig)


def _close(sig):
    """Signals in-process: the interpreter must not write to a closed (or reused) fd."""
    if signal.set_wakeup_fd(-1) not in (sig._write, -1):
        raise RuntimeError("another wakeup fd was set after these signals were installed")
    for fd in (sig._read, sig._write):
        os.close(fd)


def test_a_signal_wakes_the_wait_and_is_counted(signals):
    os.kill(os.getpid(), signal.SIGTERM)
    signals.wait(30)  # returns at once: the handler poked the pipe
    assert signals.count == 1


def test_a_signal_before_the_wait_is_not_lost(signals):
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGHUP)
    signals.wait(30)  # the byte waits in the pipe
    assert signals.take_hup() is True
    assert signals.take_hup() is False  # one reload for the burst
    assert signals.count == 0


def test_a_signal_taken_by_another_thread_wakes_the_main_threads_wait(signals):
    # The kernel may hand a process-directed signal to any thread. The main thread's
    # select is then not interrupted, and the Python handler waits for the main thread's
    # next bytecode: a daemon sat in its wait (an hour without a watchdog) through a SIGHUP.
    # The C handler writes the wakeup byte in the thread that took the signal.
    import threading

    taker = threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(), signal.SIGHUP))
    taker.start()
    taker.join()
    signals.wait(5)  # returns at once: the byte is in the pipe (5 s only bounds a failure)
    assert signals._piped["hup"] == 1  # counted from the pipe, written at C level by the taker
    assert signals.take_hup() is True


def test_the_handler_takes_no_lock_the_main_thread_may_hold(signals):
    # The old handler called Event.set(): run while the main thread held that Event's
    # lock (inside Event.wait), it waited for it forever. Hold a lock here and signal.
    import threading

    held = threading.Lock()
    with held:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.count == 1  # the handler ran, and returned, inside the `with`


def test_a_signal_held_for_a_restart_in_place_reaches_the_next_handlers(signals):
    # hold() blocks the three signals in the main thread before execv; the kernel keeps
    # one that arrives then (execve keeps it pending) until install() unblocks them.
    import threading

    main = threading.main_thread().ident
    try:
        assert signals.hold() is True  # no stop asked so far
        signal.pthread_kill(main, signal.SIGTERM)  # to this thread, which blocks it now
        assert signal.SIGTERM in signal.sigpending()
        assert signals.count == 0  # held, not taken: an execv here would hand it on
        signals.install()  # the restarted process: handlers first, then unblock
        assert signals.count == 1
        assert signal.SIGTERM not in signal.sigpending()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))


def test_hold_says_a_stop_was_asked_before_it(signals):
    os.kill(os.getpid(), signal.SIGTERM)
    try:
        assert signals.hold() is False  # the reload must not restart: the stop wins
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))


def test_the_third_stop_exits_by_the_pipe_count_too(tmp_path):
    # Three SIGTERMs that arrive while the main thread is inside one long C call leave three
    # bytes in the pipe, but their Python handler calls may run merged into one: the third
    # must still exit at once. The bytes are written here as the C handler writes them.
    import subprocess
    import sys

    code = ("import os, signal\nfrom caldera.daemon.signals import Signals\n"
            "sig = Signals()\nsig.install()\n"
            "os.write(sig._write, bytes([signal.SIGTERM]) * 3)\n"
            "sig.wait(5)\nprint('still running', sig.count)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "still running" not in done.stdout, (done.stdout, done.stderr)


def test_a_stop_taken_after_the_last_look_reaches_the_restarted_process(tmp_path):
    # After the last look at the count, a SIGTERM another thread takes only leaves its byte
    # in the pipe (its Python handler would run after execv, i.e. never). The pipe's read
    # end is handed over; the restarted process counts it. The byte is written here as the
    # C handler writes it; the second script stands for the restarted daemon.
    import subprocess
    import sys

    after = tmp_path / "after.py"
    after.write_text("import os\nfrom caldera.daemon.signals import Signals\n"
                     "sig = Signals()\nsig.install()\n"
                     "print('count', sig.count, 'var' if 'CALDERA_SIGNAL_HANDOVER' in os.environ else 'clean')\n")
    code = ("import os, signal, sys\nfrom caldera.daemon.signals import Signals\n"
            "sig = Signals()\nsig.install()\nassert sig.hold()\n"
            "os.write(sig._write, bytes([signal.SIGTERM]))\n"
            "sig.hand_over()\n"
            f"os.execv(sys.executable, [sys.executable, {str(after)!r}])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["count", "1", "clean"], (done.stdout, done.stderr)


def test_a_stale_handover_variable_is_ignored(tmp_path):
    import subprocess
    import sys

    code = ("import os\nfrom caldera.daemon.signals import Signals\n"
            "sig = Signals()\nsig.install()\nos.fstat(0)\nprint('count', sig.count)\n")
    env = {**os.environ, "CALDERA_SIGNAL_HANDOVER": "0:12345"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.PIPE)  # fd 0 is a pipe, but not that one: left open
    assert done.stdout.split() == ["count", "0"], (done.stdout, done.stderr)
