"""A total deadline per request: connect, send and the whole answer.

requests' timeouts bound each socket operation, not the call: a server that
trickles one byte every few seconds holds a call for as long as it likes. Every
request of the `Transport` is watched instead: when its deadline passes, or when
the daemon stops (`Watches.abort`), the request's socket is shut down, so the
blocked read returns at once and the caller gets a retryable error.

The socket is found through the connection class of the transport's own pools
(`WatchedAdapter`); the watch of the request being made is per thread.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import PoolManager


class Watch:
    """One request's deadline; `fired` says why its socket was shut (None while it runs)."""

    def __init__(self) -> None:
        self.conn: HTTPConnection | None = None
        self.fired: str | None = None
        self._lock = threading.Lock()

    def attach(self, conn: HTTPConnection) -> None:
        with self._lock:
            self.conn = conn
            fired = self.fired
        if fired:
            _shut(conn)

    def fire(self, reason: str) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired, conn = reason, self.conn
        if conn is not None:
            _shut(conn)


def _shut(conn: HTTPConnection) -> None:
    sock = conn.sock
    if sock is None:
        return  # still connecting: the connect timeout bounds it, and connect() looks again
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the raw socket, TLS or not
    except OSError:
        pass  # already closed: nothing left to interrupt


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


def _connection_class(base: Any, watches: Watches) -> type[HTTPConnection]:
    """`base`: a pool's connection class (urllib3's HTTPConnection or HTTPSConnection)."""
    class WatchedConnection(base):
        def connect(self) -> None:
            super().connect()
            watch = watches.current()
            if watch is not None:
                watch.attach(self)  # shuts the new socket at once when the deadline already passed

        def request(self, *args: Any, **kwargs: Any) -> None:
            watch = watches.current()
            if watch is not None:
                watch.attach(self)
            super().request(*args, **kwargs)

    return WatchedConnection


def _pool_classes(watches: Watches) -> dict[str, type[HTTPConnectionPool]]:
    out: dict[str, type[HTTPConnectionPool]] = {}
    for scheme, pool in (("http", HTTPConnectionPool), ("https", HTTPSConnectionPool)):
        out[scheme] = type(f"Watched{pool.__name__}", (pool,),
                           {"ConnectionCls": _connection_class(pool.ConnectionCls, watches)})
    return out


class WatchedAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter whose pools make connections the watches can find."""

    def __init__(self, watches: Watches, **kwargs: Any):
        self._pool_classes = _pool_classes(watches)  # before super(): it builds the pool manager
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pool_classes

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> PoolManager:
        manager = super().proxy_manager_for(proxy, **kwargs)
        manager.pool_classes_by_scheme = self._pool_classes
        return manager
