"""A backend CLI driven over stdio: the process in its own group, the reader threads of
its pipes, and its end (shared by the Codex and Claude Code backends).

`StdioProcess` starts the CLI (argv, own session/process group, pipes), runs two reader
threads (`<prefix>-stdout`: `pump_stdout` hands whole-line blocks of bytes to a bounded
`Handoff`; `<prefix>-stderr`: `pump_stderr` keeps a bounded, ANSI-stripped tail and copies
it to the run log), writes lines to stdin, and ends it (close stdin, grace, TERM -> KILL of
the group, a last SIGKILL for what the agent's commands left in the group). What the lines
mean is the backend's.
"""
from __future__ import annotations

import collections
import io
import json
import logging
import queue
import re
import signal
import subprocess
import threading
from typing import IO, TYPE_CHECKING, Any, Literal, TypeAlias

from caldera.backends import failures as fk
from caldera.errors import unexpected
from caldera.host import proc
from caldera.host.loopguard import LoopGuard

if TYPE_CHECKING:
    from caldera.backends.runlog import RunLog
    from caldera.redact import Redactor

LINE_CAP = 32 * 1024 * 1024  # one stdout line (a huge command output stays well below)
READ_CHUNK = 64 * 1024  # one read of stdout: its whole lines are handled together
HANDOFF_POLL = 0.05  # how often a reader waiting on a full channel looks whether it was closed
STDERR_KEEP = 64 * 1024
STDERR_LINE = 64 * 1024
CLOSE_GRACE = 2.0  # after closing stdin; both CLIs exit at once (docs/performance.md, section 5)
log = logging.getLogger("caldera.backends")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

Fatal: TypeAlias = tuple[Literal["fatal"], fk.BackendFailure]
Eof: TypeAlias = tuple[Literal["eof"], None]
HandoffItem: TypeAlias = tuple[Literal["raw"], bytes] | Fatal | Eof
EOF_ITEM: Eof = ("eof", None)


class Handoff:
    """The reader thread's end of a Channel: whole-line blocks of stdout go over as bytes,
    at most HANDOFF_BLOCKS waiting. A full channel stops the reader, and the pipe then
    stops the CLI: memory stays flat however fast codex writes. Once the channel is closed
    (the run is over, nobody reads) what comes is dropped instead of waited on."""

    def __init__(self, queue_: queue.Queue[HandoffItem], runlog: RunLog | None):
        self._queue = queue_
        self.runlog = runlog
        self.closed = threading.Event()

    def put(self, item: HandoffItem) -> None:
        while not self.closed.is_set():
            try:
                self._queue.put(item, timeout=HANDOFF_POLL)
                return
            except queue.Full:
                continue

    def block(self, data: bytes) -> None:
        self.put(("raw", data))


def pump_stdout(stream: io.BufferedReader, end: Handoff) -> None:
    """Reader thread body: stdout in chunks of up to READ_CHUNK bytes, each chunk's whole
    lines handed over at once, the last line at EOF, then EOF."""
    parts: list[bytes] = []  # the line being read, in pieces (a long line is not copied per chunk)
    size = 0
    try:
        while True:
            chunk = stream.read1(READ_CHUNK)
            if not chunk:
                break
            cut = chunk.rfind(b"\n")
            if cut < 0:
                parts.append(chunk)
                size += len(chunk)
                if size >= LINE_CAP:
                    end.put(("fatal", fk.BackendFailure(
                        fk.BACKEND_PROTOCOL_ERROR, f"backend stdout line longer than {LINE_CAP} bytes")))
                    return
                continue
            head = b"".join((*parts, chunk[:cut])) if parts else chunk[:cut]
            rest = chunk[cut + 1:]
            parts, size = ([rest], len(rest)) if rest else ([], 0)
            end.block(head)
        if parts:
            end.block(b"".join(parts))  # a last line without its newline
    except (OSError, ValueError) as exc:  # the pipe was closed under us at shutdown
        if end.runlog is not None:
            end.runlog.note(f"stdout reader stopped: {exc}")
    except Exception as exc:  # noqa: BLE001 -- a bug: the turn ends on it (a skipped block would garble the stream)
        log.exception("backend stdout reader failed")
        # By type and place, not message: it becomes the finish's error (caldera.errors.unexpected)
        reason = f"the runtime's stdout reader failed: {unexpected(exc)}"
        end.put(("fatal", fk.BackendFailure(fk.BACKEND_FAILED, reason)))
    finally:
        end.put(EOF_ITEM)


def pump_stderr(stream: IO[bytes], tail: collections.deque[str], runlog: RunLog | None) -> None:
    """Reader thread body: stderr lines, ANSI stripped, into the run log and a bounded tail.
    It reads to EOF whatever the run log does (a full disk): a reader that stopped would
    leave the CLI blocked on a full stderr pipe for the rest of the turn."""
    size = 0
    guard = LoopGuard(log, "backend stderr reader: the run log")
    try:
        # Whole lines up to STDERR_LINE (a piece of a longer one is a record of its own): each
        # record is masked alone, so a smaller piece could cut a secret in two.
        for raw in iter(lambda: stream.readline(STDERR_LINE), b""):
            text = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip()
            if not text:
                continue
            tail.append(text)
            size += len(text)
            while size > STDERR_KEEP and tail:
                size -= len(tail.popleft())
            if runlog is not None:
                try:
                    runlog.write("stderr", text)
                    guard.ok()
                except Exception as exc:  # noqa: BLE001 -- the line stays in the tail; the pipe keeps draining
                    guard.failed(exc)
    except (OSError, ValueError) as exc:
        if runlog is not None:
            runlog.note(f"stderr reader stopped: {exc}")



class StdioProcess:
    """One CLI process: its pipes, its two reader threads (named `<prefix>-stdout`,
    `<prefix>-stderr`), stdin writes, and its end. `reader_end` takes stdout's blocks."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, runlog: RunLog | None,
                 redactor: Redactor, reader_end: Handoff, prefix: str):
        self.argv, self.env, self.cwd = argv, env, cwd
        self.runlog, self.redactor = runlog, redactor
        self.reader_end, self.prefix = reader_end, prefix
        self.stderr_tail: collections.deque[str] = collections.deque()
        self.proc: subprocess.Popen[bytes] | None = None
        self.threads: list[threading.Thread] = []
        self._write_lock = threading.Lock()

    def start(self) -> None:
        try:
            # die_with_parent: a runtime killed with -9 takes the CLI with it (docs/backends.md).
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, close_fds=True, preexec_fn=proc.die_with_parent())
        except OSError as exc:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED,
                                    f"cannot start {self.argv[0]}: {exc.strerror or exc}") from None
        for name, target, args in (
                (f"{self.prefix}-stdout", pump_stdout, (self.proc.stdout, self.reader_end)),
                (f"{self.prefix}-stderr", pump_stderr, (self.proc.stderr, self.stderr_tail, self.runlog))):
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)

    def send(self, message: dict[str, Any]) -> bool:
        """One JSON line to stdin (and the run log's c2s); False when the process is gone."""
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        if self.runlog is not None:
            self.runlog.write("c2s", line)
        stdin = self.proc.stdin if self.proc is not None else None
        if stdin is None:
            return False  # never started
        with self._write_lock:
            try:
                stdin.write(line.encode("utf-8") + b"\n")
                stdin.flush()
                return True
            except (BrokenPipeError, ValueError, OSError):
                return False  # the process is gone; the reader reports EOF

    def returncode(self, wait: float = 0.0) -> int | None:
        if self.proc is None:
            return None
        return proc.wait_exit(self.proc, wait) if wait else self.proc.poll()

    def stderr_summary(self, lines: int = 3, limit: int = 500, settle: float = 0.0) -> str:
        """The last stderr lines, redacted; `settle` waits that long for the reader to reach EOF.

        After an early exit, stdout's EOF can be seen before the stderr reader has read the
        lines that explain it (the two pipes are read by two threads)."""
        if settle and len(self.threads) > 1:
            self.threads[1].join(timeout=settle)  # start(): stdout reader, then stderr reader
        text = " | ".join(list(self.stderr_tail)[-lines:])
        return self.redactor.text(text)[-limit:]  # masked whole, then cut: no secret cut in two

    def close(self, grace: float = CLOSE_GRACE) -> int | None:
        """Close stdin (the CLI exits at once), then TERM -> KILL the whole group if needed."""
        if self.proc is None:
            return None
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass  # already gone
        self.reader_end.closed.set()  # a reader waiting on a full channel would keep the CLI blocked on stdout
        if self.returncode(grace) is None:
            self.kill()
        proc.signal_group(self.proc, signal.SIGKILL)  # agent commands left in the group
        held = []
        # self.threads are the stdout and stderr readers, in that order (start()).
        for thread, stream in zip(self.threads, (self.proc.stdout, self.proc.stderr), strict=False):
            thread.join(timeout=2.0)
            if thread.is_alive():
                # A process outside the group (a command that ran `setsid`) still holds the
                # pipe: closing the stream would wait on the reader's lock for as long as that
                # process lives. The daemon thread keeps it; the turn is over regardless.
                held.append(thread.name)
            elif stream is not None:
                stream.close()
        if held:
            self.note(f"{', '.join(held)} still held open by a process outside the CLI's group; left behind")
        return self.proc.returncode

    def note(self, text: str) -> None:
        """The runtime's own remark in the run log."""
        if self.runlog is not None:
            self.runlog.note(text)

    def kill(self, grace: float = 1.0) -> None:
        if self.proc is not None:
            proc.kill_group(self.proc, grace, reap=2.0)
