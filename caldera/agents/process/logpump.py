"""The agent's stdout/stderr -> `<state>/logs/agent.log`, rotated at 10 MiB x 3, without
ever blocking the agent (SPEC section 7b).

Two threads with a bounded queue between them: the reader drains the pipe as
fast as the agent writes (so the agent never waits on a full pipe), the writer
puts chunks on disk. When the disk is slower than the agent and the queue is full
(QUEUE_CHUNKS x CHUNK = 4 MiB, the bound on the runtime's memory), chunks are
dropped and counted, and the writer says so in the log: losing log lines is
better than stalling the agent or growing without bound.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.host.loopguard import LoopGuard

if TYPE_CHECKING:
    from typing import IO

CHUNK = 64 * 1024
QUEUE_CHUNKS = 64
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 3
WRITE_BACKOFF = (0.5, 1, 2, 5)  # after a failed write: the queue (4 MiB) takes the agent's output meanwhile
TAIL_BYTES = 4096  # of the current child's output, kept in memory for the log line of its exit
TAIL_LINES = 3  # its last lines in that log line (a traceback's end; python's one "can't open file")
TAIL_WAIT = 1.0  # seconds an exit's log line waits for the child's pipe to reach its end
log = logging.getLogger("caldera.agents.process")


class RotatingFile:
    """Append-only file rotated at max_bytes: name -> name.1 -> … -> name.BACKUPS (dropped)."""

    def __init__(self, path: str | Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
        self.path, self.max_bytes, self.backups = Path(path), max_bytes, backups
        self._fh: IO[bytes] | None = None
        self._size = 0
        self.written = 0  # bytes written since start, over every rotation

    def _open(self) -> IO[bytes]:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._fh = os.fdopen(fd, "ab", buffering=0)
        self._size = os.fstat(fd).st_size
        return self._fh

    def write(self, data: bytes) -> None:
        fh = self._fh if self._fh is not None else self._open()
        if self._size and self._size + len(data) > self.max_bytes:
            fh = self._rotate()
        fh.write(data)
        self._size += len(data)
        self.written += len(data)

    def _rotate(self) -> IO[bytes]:
        self.close()
        for index in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        return self._open()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class LogPump:
    """One writer thread for the agent's log; `attach(pipe)` starts a reader for one child."""

    def __init__(self, path: str | Path, *, max_bytes: int = MAX_BYTES, backups: int = BACKUPS,
                 queue_chunks: int = QUEUE_CHUNKS) -> None:
        self.file = RotatingFile(path, max_bytes, backups)
        self.queue: queue.Queue[bytes | None] = queue.Queue(queue_chunks)  # None: the writer's end
        self.dropped = 0  # bytes dropped since the last marker (the reader adds, the writer reports)
        self.dropped_total = 0
        self._lock = threading.Lock()
        from caldera.protocol.retry import Backoff  # here: `caldera status` imports this module (no typing)

        self._closing = threading.Event()  # close() began: a writer backing off goes on at once
        self._tail = b""  # the last TAIL_BYTES the current child printed (its last words at an exit)
        self._drained = threading.Event()  # the current child's pipe reached its end (no child yet: set)
        self._drained.set()
        self._guard_reader = LoopGuard(log, "agent log reader")
        self._guard_writer = LoopGuard(log, "agent.log writer", Backoff(WRITE_BACKOFF))
        self._writer = threading.Thread(target=self._write_loop, name="agent-log-writer", daemon=True)
        self._writer.start()

    def attach(self, pipe: IO[bytes]) -> threading.Thread:
        drained = threading.Event()
        with self._lock:
            self._tail, self._drained = b"", drained
        reader = threading.Thread(target=self._read_loop, args=(pipe, drained), name="agent-log-reader", daemon=True)
        reader.start()
        return reader

    def last_lines(self, count: int = TAIL_LINES, wait: float = TAIL_WAIT) -> list[str]:
        """The current child's last non-empty output lines (decoded, unredacted: the caller's log
        handler redacts), once its pipe reached its end or after `wait` seconds, whichever first."""
        self._drained.wait(wait)
        with self._lock:
            tail = self._tail
        return [line.strip() for line in tail.decode("utf-8", "replace").splitlines() if line.strip()][-count:]

    def note(self, line: str) -> None:
        """A line from the runtime itself (start, exit), in the same log."""
        self._put(f"[caldera] {line}\n".encode())

    def _put(self, chunk: bytes) -> None:
        try:
            self.queue.put_nowait(chunk)
        except queue.Full:
            self._count_dropped(len(chunk))

    def _read_loop(self, pipe: IO[bytes], drained: threading.Event) -> None:
        """Drain the pipe until EOF whatever else fails: a reader that stopped would leave the
        agent blocked on a full pipe. What it cannot queue is counted as dropped."""
        fd = pipe.fileno()
        try:
            while True:
                try:
                    chunk = os.read(fd, CHUNK)
                except OSError as exc:  # the pipe itself is broken: nothing more can come through it
                    log.warning("agent output: reading the pipe failed: %s", exc)
                    break
                if not chunk:
                    break
                try:
                    self._keep_tail(chunk, drained)
                    self._put(chunk)
                except Exception as exc:  # noqa: BLE001 -- a bug here must not stop the draining
                    self._guard_reader.failed(exc)
                    self._count_dropped(len(chunk))
        finally:
            pipe.close()
            drained.set()

    def _keep_tail(self, chunk: bytes, drained: threading.Event) -> None:
        with self._lock:
            if drained is self._drained:  # an earlier child's reader, still draining, is not the current one
                self._tail = (self._tail + chunk)[-TAIL_BYTES:]

    def _count_dropped(self, size: int) -> None:
        with self._lock:
            self.dropped += size
            self.dropped_total += size

    def _write_loop(self) -> None:
        """Put chunks on disk. A write that fails (a full disk) is logged by the guard, once while it
        repeats; its chunk is counted as dropped, and the writer pauses for the backoff (`close()`
        ends the pause) while the reader, finding the queue full, counts what it cannot queue."""
        while True:
            chunk = self.queue.get()
            if chunk is None:
                break
            with self._lock:
                dropped, self.dropped = self.dropped, 0
            try:
                if dropped:
                    self.file.write(f"\n[caldera] {dropped} bytes of agent output dropped: the log was "
                                    f"written slower than the agent printed, or could not be written\n".encode())
                    dropped = 0
                self.file.write(chunk)
                self._guard_writer.ok()
            except Exception as exc:  # noqa: BLE001 -- a full or broken disk, or a bug: keep draining
                with self._lock:
                    self.dropped += dropped  # counted already, not yet said: the next write says it
                self._count_dropped(len(chunk))
                self._closing.wait(self._guard_writer.failed(exc))
        self.file.close()

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued and end the writer (readers end with their pipes)."""
        self._closing.set()
        try:
            self.queue.put(None, timeout=timeout)
        except queue.Full:  # the writer is stuck on the disk; a daemon thread, left behind if it stays so
            log.warning("agent.log: the writer took nothing for %g s (a stuck disk?)", timeout)
        self._writer.join(timeout)
