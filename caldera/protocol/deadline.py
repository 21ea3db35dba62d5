"""A total deadline per request: connect, send and the whole answer.

Socket timeouts bound each operation, not the call: a server that trickles one
byte every few seconds holds a call for as long as it likes. Every request of the
`Transport` is watched instead: when its deadline passes, or when the daemon stops
(`Watches.abort`), the request's socket is shut down, so the blocked connect, TLS
handshake, send or read returns at once and the caller gets a retryable error.

The HTTP layer (`protocol/http.py`) hands each socket to the watch of the request
being made (per thread) as soon as it exists (before its TCP connect), and a reused one
before it is used. Only the name's resolution (getaddrinfo) cannot be interrupted.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Watch:
    """One request's deadline; `fired` says why its socket was shut (None while it runs)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.fired: str | None = None
        self._lock = threading.Lock()

    def attach(self, sock: socket.socket | None) -> None:
        """`sock` is this request's now (a new one, or a reused one): shut at once when the
        watch already fired. None: the request lets go of its socket (a connection going
        back to the pool), which this watch never shuts after that."""
        with self._lock:  # shut under the lock: fire() and a release never cross
            self.sock = sock
            if self.fired and sock is not None:
                _shut(sock)

    def fire(self, reason: str) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = reason
            if self.sock is not None:
                _shut(self.sock)  # else no socket yet: attach() shuts it as soon as there is one


def _shut(sock: socket.socket) -> None:
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the raw socket, TLS or not; ends a connect too
    except OSError:
        # not connected: not yet (closed, so that its connect fails at once; the connection is
        # this request's own, nobody else holds it), or already closed: nothing to interrupt
        sock.close()


class Watches:
    """The requests in flight of one transport, each with its timer."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._active: set[Watch] = set()
        self._lock = threading.Lock()

    def current(self) -> Watch | None:
        return getattr(self._local, "watch", None)

    @contextmanager
    def watch(self, seconds: float) -> Iterator[Watch]:
        watch = Watch()
        timer = threading.Timer(max(0.0, seconds), watch.fire, args=("deadline",))
        timer.daemon, timer.name = True, "request-deadline"  # named for a stack dump (docs/architecture.md)
        self._local.watch = watch
        with self._lock:
            self._active.add(watch)
        timer.start()
        try:
            yield watch
        finally:
            timer.cancel()
            self._local.watch = None
            with self._lock:
                self._active.discard(watch)

    def abort(self, reason: str = "stopping") -> int:
        """Interrupt every request in flight now; how many there were."""
        with self._lock:
            active = list(self._active)
        for watch in active:
            watch.fire(reason)
        return len(active)
