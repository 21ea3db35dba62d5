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
    sig.close()


def test_a_signal_wakes_the_wait_and_is_counted(signals):
    os.kill(os.getpid(), signal.SIGTERM)
    signals.wait(30)  # returns at once: the handler poked the pipe
    assert signals.count == 1


def test_a_signal_another_thread_takes_still_wakes_the_main_thread():
    """The kernel may hand SIGTERM to any thread; the main thread, waiting, must wake at once
    (it used to sleep until its timeout: the Python handler runs only in the main thread)."""
    import subprocess
    import sys

    code = ("import signal, threading, time\nfrom caldera.daemon.signals import Signals\n"
            "sig = Signals()\nsig.install()\n"
            "def other():\n    time.sleep(0.3)\n    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)\n"
            "threading.Thread(target=other).start()\n"
            "start = time.monotonic()\nsig.wait(30)\n"
            "print(sig.count, time.monotonic() - start < 10)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["1", "True"], done.stderr


def test_a_signal_before_the_wait_is_not_lost(signals):
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGHUP)
    signals.wait(30)  # the byte waits in the pipe
    assert signals.take_hup() is True
    assert signals.take_hup() is False  # one reload for the burst
    assert signals.count == 0


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
