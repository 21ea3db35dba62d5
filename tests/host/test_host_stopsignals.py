"""SIGINT/SIGTERM set an interactive command's stop Event through a relay thread, never
from the handler (caldera/host/stopsignals.py says why)."""
import os
import signal
import threading

import pytest

from caldera.host.stopsignals import stop_on_signals


@pytest.fixture
def stop():
    event = threading.Event()
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    restore = stop_on_signals(event)
    yield event
    restore()
    assert {s: signal.getsignal(s) for s in before} == before  # the previous handlers are back
    assert signal.set_wakeup_fd(-1) == -1  # and no wakeup fd is left behind


def test_sigterm_sets_the_event(stop):
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.wait(5) is True  # 5 s only bounds a failure


def test_a_signal_taken_by_another_thread_still_ends_the_main_threads_wait(stop):
    # The old handlers called stop.set() themselves: with the signal delivered to another
    # thread, the main thread blocked in Event.wait() was never interrupted to run them.
    def take_it():
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    threading.Timer(0.2, take_it).start()
    assert stop.wait(5) is True


def test_the_handler_does_not_touch_the_event_lock(stop):
    # Holding the Event's condition lock, as Event.wait() does on entry and return: a
    # handler calling set() here would wait for it forever.
    with stop._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        assert not stop.is_set()  # the handler ran and returned; the relay waits for the lock
    assert stop.wait(5) is True


def test_once_gives_the_second_signal_its_default_action():
    from caldera.host.stopsignals import on_signals

    calls = []
    called = threading.Event()
    previous = signal.getsignal(signal.SIGUSR1)
    marker = []
    signal.signal(signal.SIGUSR1, lambda *_: marker.append("previous"))  # stands for the default action
    restore = on_signals(lambda: (calls.append(1), called.set()), (signal.SIGUSR1,), once=True)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert called.wait(5)
        os.kill(os.getpid(), signal.SIGUSR1)  # the second: the handler that was there before
        threading.Event().wait(0.1)  # the main thread runs the Python handler at its next bytecode
        assert marker == ["previous"] and calls == [1]
    finally:
        restore()
        signal.signal(signal.SIGUSR1, previous)


def test_the_relay_survives_a_callback_that_raises():
    """A bug in the callback ended the relay before: the next Ctrl-C was never relayed (issue 26)."""
    from caldera.host.stopsignals import on_signals

    calls = []

    def callback():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the stop")

    before = signal.getsignal(signal.SIGUSR1)
    restore = on_signals(callback, {signal.SIGUSR1})
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        waiter = threading.Event()
        deadline = 30.0  # generous: polled for the condition, never timed
        while not calls and deadline > 0:
            waiter.wait(0.05)
            deadline -= 0.05
        os.kill(os.getpid(), signal.SIGUSR1)
        while len(calls) < 2 and deadline > 0:
            waiter.wait(0.05)
            deadline -= 0.05
        assert len(calls) == 2
    finally:
        restore()
    assert signal.getsignal(signal.SIGUSR1) == before
