"""`ServerOwner`: the one OpenCode server of an agent, for as long as its owner lives.

    owner = ServerOwner(runs_dir)           # the daemon: one per agent, at start
    lease = owner.get(launch, should_stop)  # a turn: the running server (started if need be)
    ...                                     # lease.server.call(...), lease.server.events(...)
    lease.release()                         # the turn is over (poison=True: stop it when free)
    owner.close()                           # the runtime stops: the server stops, now

- Never two servers at once: `get` starts one only when there is none; a turn that needs
  another launch (the projection changed) waits until the turns on the old one are done,
  then the old one is stopped and the new one started.
- A server that died is replaced at the next `get` (the turn that was using it fails on its
  own: its event stream ends).
- Idle: `idle_seconds` (CALDERA_OPENCODE_IDLE_SECONDS, default 300) after the last lease
  is released, the server is stopped (a `threading.Timer`, thread `opencode-idle`). Why 300 s:
  an idle server burns ~1.2 % of a core, a new one ~3.2 s of CPU more than a turn on a
  running one (bench/bench_opencode.py): after ~270 s idle the two are even; a later turn
  inside that window answers in 0.1 s instead of 2.5-5 s (docs/backends.md, "OpenCode").
- Recycled, never in the middle of a turn and losing none: when the last turn on it ends,
  a server that has served `recycle_turns` turns (default 250) or whose `opencode serve`
  holds more than `recycle_rss` bytes (default 1 GiB) is stopped, and the next turn starts
  a fresh one; a turn that finds the server free asks its health check (`GET
  /global/health`, 5 s) first, and one that does not answer healthy is replaced before the
  turn uses it. Why: upstream `opencode serve` grows to 1-4 GB over a day or two and then
  stops answering; the limits and the server's RSS over 500 turns are in
  docs/performance.md, section 9.
- On first use, servers left by an owner that died (a killed daemon) are stopped and
  their dirs removed (`server.reap_leftovers`).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

from caldera.backends import failures as fk
from caldera.backends.opencode import server as srv

DEFAULT_IDLE_SECONDS = 300
RECYCLE_TURNS = 250
RECYCLE_RSS = 1024 * 1024 * 1024
WAIT_TICK = 0.05


class Lease:
    """A turn's hold on the server; `release()` once (further calls do nothing)."""

    def __init__(self, owner: ServerOwner, server: srv.OpenCodeServer, started: bool):
        self.owner = owner
        self.server = server
        self.started = started  # this get() started the server (the first turn pays for it)
        self._released = False
        self._admitted: str | None = None

    def admit(self, workspace: str, writable: bool) -> None:
        """The turn's workspace is where its commands run (writable or not) until `release`.
        ValueError for a workspace the sandbox cannot name."""
        if self.server.admitted is not None and self._admitted is None:
            self._admitted = self.server.admitted.admit(workspace, writable)

    def release(self, poison: bool = False) -> None:
        if not self._released:
            self._released = True
            if self._admitted is not None and self.server.admitted is not None:
                self.server.admitted.dismiss(self._admitted)
            self.owner._release(self.server, poison)


class ServerOwner:
    def __init__(self, runs_dir: str | os.PathLike[str], idle_seconds: float = DEFAULT_IDLE_SECONDS,
                 recycle_turns: int = RECYCLE_TURNS, recycle_rss: int = RECYCLE_RSS):
        self.runs_dir = str(runs_dir)
        self.idle_seconds = idle_seconds
        self.recycle_turns = recycle_turns
        self.recycle_rss = recycle_rss
        self.recycled: dict[str, int] = {"turns": 0, "rss": 0, "health": 0}  # servers recycled, by cause
        self._cond = threading.Condition()
        self._server: srv.OpenCodeServer | None = None
        self._starting = False
        self._stopping = 0  # servers being stopped outside the lock: a new one waits for them
        self._closed = False
        self._reaped = False
        self._timer: threading.Timer | None = None
        self.starts = 0  # servers started (tests and the bench read it)

    @property
    def server(self) -> srv.OpenCodeServer | None:
        with self._cond:
            return self._server

    def get(self, launch: srv.Launch, should_stop: Callable[[], bool] | None = None) -> Lease:
        """The running server for `launch`, started if need be. BackendFailure when it cannot
        start (spawn-failed) or the owner is closed; srv.Stopped when `should_stop()` turns
        true while waiting or starting. A free server is asked its health check first (outside
        the lock) and replaced when it fails it."""
        while True:
            lease, was_free = self._lease(launch, should_stop)
            if not was_free or lease.server.healthy():
                return lease
            with self._cond:
                self.recycled["health"] += 1
            lease.release(poison=True)  # stopped now if no other turn took it meanwhile, else when free

    def _lease(self, launch: srv.Launch, should_stop: Callable[[], bool] | None) -> tuple[Lease, bool]:
        """A lease on the server to use, and whether that server was free (no turn on it)."""
        retired: list[srv.OpenCodeServer] = []
        with self._cond:
            while True:
                if self._closed:
                    raise fk.BackendFailure(fk.BACKEND_FAILED, "the runtime is stopping: no new OpenCode turn")
                if should_stop is not None and should_stop():
                    raise srv.Stopped()
                current = self._server
                if self._starting or (current is None and self._stopping):
                    pass  # another turn is starting one, or the last one is still stopping: wait
                elif current is not None and not current.alive():
                    retired.append(current)  # died: stopped (cleaned) below, replaced now
                    self._server = None
                    continue
                elif current is not None and current.launch.fingerprint == launch.fingerprint and not current.poisoned:
                    current.leases += 1
                    current.turns += 1
                    self._cancel_timer()
                    return Lease(self, current, started=False), current.leases == 1
                elif current is not None and current.leases == 0:
                    retired.append(current)  # another launch (or poisoned) and free: replace it
                    self._server = None
                    continue
                elif current is None:
                    self._starting = True
                    self._cancel_timer()
                    break
                self._cond.wait(WAIT_TICK)  # in-flight turns on a server we must replace, or a start
        for old in retired:
            old.stop()  # this thread set _starting: no other one starts a server meanwhile
        return self._start(launch, should_stop), False

    def _start(self, launch: srv.Launch, should_stop: Callable[[], bool] | None) -> Lease:
        server = None
        try:
            if not self._reaped:
                srv.reap_leftovers(self.runs_dir)
                self._reaped = True
            server = srv.OpenCodeServer(launch, self.runs_dir)
            server.start(should_stop)
        except BaseException:
            with self._cond:
                self._starting = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._starting = False
            self.starts += 1
            if self._closed:  # close() came while it started
                self._cond.notify_all()
                closed = True
            else:
                self._server = server
                server.leases += 1
                server.turns += 1
                self._cond.notify_all()
                closed = False
        if closed:
            server.stop()
            raise fk.BackendFailure(fk.BACKEND_FAILED, "the runtime is stopping: no new OpenCode turn")
        return Lease(self, server, started=True)

    def _release(self, server: srv.OpenCodeServer, poison: bool) -> None:
        worn = None if poison else self._worn(server)  # read outside the lock: a walk of /proc
        stop_now = False
        with self._cond:
            server.leases -= 1
            server.poisoned = server.poisoned or poison
            if server is not self._server:
                stop_now = server.leases == 0  # retired meanwhile: whoever retired it skipped a busy one
            elif server.leases == 0:
                if worn is not None and not server.poisoned and server.alive():
                    self.recycled[worn] += 1
                    server.poisoned = True  # recycled: the next turn starts a fresh one
                if server.poisoned or not server.alive():
                    self._server = None
                    stop_now = True
                else:
                    self._arm_timer()
            if stop_now:
                self._stopping += 1
            self._cond.notify_all()
        if stop_now:
            self._stop_outside(server)

    def _worn(self, server: srv.OpenCodeServer) -> str | None:
        """Why `server` is due for its recycle ("turns", "rss"), else None."""
        if server.turns >= self.recycle_turns:
            return "turns"
        rss = server.rss_bytes()
        if rss is not None and rss > self.recycle_rss:
            return "rss"
        return None

    def _stop_outside(self, server: srv.OpenCodeServer) -> None:
        """Stop a server the lock no longer holds (`_stopping` counted by the caller, under it)."""
        try:
            server.stop()
        finally:
            with self._cond:
                self._stopping -= 1
                self._cond.notify_all()

    def _arm_timer(self) -> None:
        self._cancel_timer()
        if self.idle_seconds <= 0:
            self._timer = threading.Timer(0, self._idle)
        else:
            self._timer = threading.Timer(self.idle_seconds, self._idle)
        self._timer.name = "opencode-idle"
        self._timer.daemon = True
        self._timer.start()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle(self) -> None:
        with self._cond:
            server = self._server
            if server is None or server.leases > 0 or self._starting:
                return
            self._server = None
            self._timer = None
            self._stopping += 1
        self._stop_outside(server)

    def close(self) -> None:
        """Stop the server now (the runtime stops); later `get` calls fail. Idempotent."""
        with self._cond:
            self._closed = True
            self._cancel_timer()
            server, self._server = self._server, None
            self._cond.notify_all()
        if server is not None:
            server.stop()
