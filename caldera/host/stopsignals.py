"""SIGINT/SIGTERM stop an interactive command (`caldera plane`, `caldera demo`,
`caldera status --watch`) by setting a `threading.Event`, or interrupt a turn
(`caldera turn`), safely.

Not from the handler: a Python handler runs in the main thread between two
bytecodes, possibly while that thread holds the Event's own lock (on entry to and
return from `Event.wait`), and `Event.set()` there waits for that lock forever.
And not only when the main thread next runs bytecode: the kernel may deliver the
signal to another thread (the plane's and the demo's servers have many), and then
the main thread, blocked in `Event.wait()`, is never interrupted to run the handler.
So the handlers do nothing else; CPython's C handler writes the signal's number into the
wakeup fd in whichever thread took it, and a relay thread blocked on that pipe sets
the Event (or calls the callback). (The daemon counts its signals instead: caldera/daemon/signals.py.)
"""
from __future__ import annotations

import logging
import os
import select
import signal
import threading

from caldera import TYPE_CHECKING
from caldera.host.loopguard import LoopGuard

if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from types import FrameType

STOPPING = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals(stop: threading.Event, signums: Collection[int] = STOPPING) -> Callable[[], None]:
    """Set `stop` when one of `signums` arrives. From the main thread. Returns a function
    that puts the previous handlers and wakeup fd back (for in-process callers: tests)."""
    return on_signals(stop.set, signums)


def on_signals(callback: Callable[[], None], signums: Collection[int] = STOPPING, *,
               once: bool = False) -> Callable[[], None]:
    """Call `callback` in the relay thread for each burst of `signums`. once: the first
    such signal also puts the previous handler back for its number, so that a second one
    takes the default action (a second Ctrl-C ends the process). From the main thread."""
    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    previous: dict[int, signal._HANDLER] = {}

    def handler(signum: int, _frame: FrameType | None) -> None:
        """Installed so that the C handler runs (and writes the wakeup byte); the relay acts."""
        if once:
            signal.signal(signum, previous[signum])

    for signum in signums:
        previous[signum] = signal.signal(signum, handler)
    closed = threading.Event()
    relay = threading.Thread(target=_relay, args=(read, set(signums), callback, closed, once), name="signals",
                             daemon=True)
    relay.start()

    def restore() -> None:
        for signum, old in previous.items():
            signal.signal(signum, old)
        signal.set_wakeup_fd(previous_fd)
        closed.set()
        try:
            os.write(write, b"\0")  # wakes the relay, which sees `closed` and ends
        except BlockingIOError:
            pass  # full: the relay has bytes to wake up to already (or ended after `once`)
        relay.join()
        os.close(read)
        os.close(write)

    return restore


def _relay(read: int, signums: set[int], callback: Callable[[], None], closed: threading.Event, once: bool) -> None:
    """A callback that raises is logged (once while it repeats) and the relay waits for the next
    signal: a second Ctrl-C must still reach it."""
    guard = LoopGuard(logging.getLogger("caldera.signals"), "signal relay")
    while not closed.is_set():
        try:
            if _relay_one(read, signums, callback, closed) and once:
                return
            guard.ok()
        except Exception as exc:  # noqa: BLE001 -- the relay is the only way a stop gets in
            closed.wait(guard.failed(exc))


def _relay_one(read: int, signums: set[int], callback: Callable[[], None], closed: threading.Event) -> bool:
    """Wait for the pipe; True when one of `signums` came and the callback ran."""
    select.select([read], [], [])
    try:
        data = os.read(read, 512)
    except BlockingIOError:
        return False
    if any(byte in signums for byte in data) and not closed.is_set():
        callback()
        return True
    return False
