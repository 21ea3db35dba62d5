"""The `codex app-server` process and its JSON-RPC channel over stdio.

The process runs in its own process group. A reader thread (`pump_stdout`, named
codex-stdout) only reads stdout and hands whole-line blocks of bytes to a bounded
`Channel`; the thread that uses the messages parses them there (`Dispatcher`): run log,
bounded parse, each response to the request waiting for it, everything else in order
into the inbox as batches. Another reader (`pump_stderr`, codex-stderr) keeps a bounded
stderr tail. What the messages mean is the turn logic's (codex.py).

The inbox holds ("batch", [(kind, message), …]) with kind "notification" or "request",
("fatal", BackendFailure) and, last, ("eof", None).
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
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Literal, TypeAlias

from caldera.backends import failures as fk
from caldera.backends.codex.deltas import unused_delta
from caldera.errors import unexpected
from caldera.host import proc
from caldera.host.jsonlimits import JSONLimitError, line_parser
from caldera.host.loopguard import LoopGuard

if TYPE_CHECKING:
    from caldera.backends.runlog import RunLog
    from caldera.redact import Redactor

LINE_CAP = 32 * 1024 * 1024  # one stdout line (a huge aggregatedOutput stays well below)
LINE_JSON_MAX = 64 * 1024 * 1024  # one JSON-RPC line; the nesting limit is what matters
READ_CHUNK = 64 * 1024  # one read of stdout: its whole lines are handled together
HANDOFF_BLOCKS = 64  # read blocks waiting for the turn loop; then the reader, and through its pipe codex, waits
HANDOFF_POLL = 0.05  # how often a reader waiting on a full channel looks whether it was closed
STDERR_KEEP = 64 * 1024
STDERR_LINE = 64 * 1024
CLOSE_GRACE = 2.0  # after closing stdin; codex exits at once (docs/performance.md, section 5)
log = logging.getLogger("caldera.backends")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

Message: TypeAlias = dict[str, Any]  # one JSON-RPC message, as parsed
Batch: TypeAlias = list[tuple[Literal["notification", "request"], Message]]
Fatal: TypeAlias = tuple[Literal["fatal"], fk.BackendFailure]
Eof: TypeAlias = tuple[Literal["eof"], None]
InboxItem: TypeAlias = tuple[Literal["batch"], Batch] | Fatal | Eof
HandoffItem: TypeAlias = tuple[Literal["raw"], bytes] | Fatal | Eof
_EOF: Eof = ("eof", None)


@dataclass(slots=True)
class _Slot:
    """Where the response to one request arrives; `message` stays None when the process went away."""
    event: threading.Event = field(default_factory=threading.Event)
    message: Message | None = None


class Dispatcher:
    """Turns stdout bytes into messages. Separate from the process so that tests can feed it."""

    def __init__(self, inbox: queue.Queue[InboxItem], runlog: RunLog | None, skip_unused: bool = False):
        self.inbox = inbox
        self.runlog = runlog
        self.pending: dict[int, _Slot] = {}
        self.lock = threading.Lock()
        self.parse = line_parser(max_bytes=LINE_JSON_MAX, what="backend stdout line")
        # In a run, agentMessage deltas nothing consumes are validated and dropped (codex_deltas).
        self.skip_unused = skip_unused

    def block(self, data: bytes) -> None:
        """Whole lines read together (pump_stdout): one run-log write and one inbox item
        ("batch", [(kind, msg), …]) for all of them, in order, instead of one each: a
        queue put and get, a timestamp and a redaction per line were most of the cost of
        a busy turn (bench/bench_codex.py, docs/performance.md)."""
        text = data.decode("utf-8", "replace")
        lines = text.split("\n")
        if "\r" in text:
            lines = [line.rstrip("\r") for line in lines]
        lines = [line for line in lines if line and not line.isspace()]
        if not lines:
            return
        if self.runlog is not None:
            self.runlog.write_lines("s2c", lines)
        batch: Batch = []
        parse = self.parse
        skip, most_chars = self.skip_unused, LINE_JSON_MAX // 4
        for line in lines:
            if skip and unused_delta(line, most_chars):
                continue
            try:
                msg = parse(line)
            except JSONLimitError as exc:  # too deep: one failed turn with the sentence, not a dead reader
                self._fatal(batch, fk.BACKEND_JSON_PARSE_ERROR, str(exc))
                continue
            except ValueError:
                self._fatal(batch, fk.BACKEND_JSON_PARSE_ERROR, f"backend stdout line is not JSON: {line[:200]!r}")
                continue
            if not isinstance(msg, dict):
                self._fatal(batch, fk.BACKEND_PROTOCOL_ERROR,
                            f"backend sent a JSON {type(msg).__name__}, not an object")
            elif "method" in msg:
                batch.append(("request" if "id" in msg else "notification", msg))
            elif "id" in msg:
                self._flush(batch)  # what came before a response is queued before it is seen
                self._respond(msg)
            else:
                self._fatal(batch, fk.BACKEND_PROTOCOL_ERROR, "backend message has neither method nor id")
        self._flush(batch)

    def _flush(self, batch: Batch) -> None:
        if batch:
            self.inbox.put(("batch", batch[:]))
            batch.clear()

    def _fatal(self, batch: Batch, kind: str, message: str) -> None:
        self._flush(batch)
        self.inbox.put(("fatal", fk.BackendFailure(kind, message)))

    def _respond(self, msg: Message) -> None:
        with self.lock:
            slot = self.pending.pop(msg["id"], None)
        if slot is None:
            if self.runlog is not None:
                self.runlog.note(f"response to unknown request id {msg['id']!r}")
            return
        slot.message = msg
        slot.event.set()

    def expect(self, request_id: int) -> _Slot:
        slot = _Slot()
        with self.lock:
            self.pending[request_id] = slot
        return slot

    def fail_all(self) -> None:
        with self.lock:
            slots, self.pending = list(self.pending.values()), {}
        for slot in slots:
            slot.event.set()  # message stays None: the process is gone


class Handoff:
    """The reader thread's end of a Channel: whole-line blocks of stdout go over as bytes,
    at most HANDOFF_BLOCKS waiting. A full channel stops the reader, and the pipe then
    stops codex: memory stays flat however fast codex writes. Once the channel is closed
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


class Channel:
    """Codex stdout between the reader thread and the turn loop.

    The reader thread only reads and cuts whole-line blocks (pump_stdout into `reader_end`);
    the thread that uses the messages parses them (`pump`, `next`): the run-log write, the
    bounded parse, response routing and the normaliser then run on one thread. Parsing in
    the reader thread made every message cross cores and the GIL on its way to the turn
    loop, at a cost measured in docs/performance.md, section 5 (bench/bench_codex.py)."""

    def __init__(self, runlog: RunLog | None):
        self.handoff: queue.Queue[HandoffItem] = queue.Queue(HANDOFF_BLOCKS)
        self.inbox: queue.Queue[InboxItem] = queue.Queue()  # parsed, in order
        self.dispatcher = Dispatcher(self.inbox, runlog, skip_unused=True)
        self.reader_end = Handoff(self.handoff, runlog)

    def pump(self, timeout: float | None) -> None:
        """Parse what the reader handed over next (waiting up to `timeout`; queue.Empty if
        nothing came): responses reach their requests, everything else queues in order."""
        item = self.handoff.get(timeout=timeout)
        if item[0] == "raw":
            self.dispatcher.block(item[1])
            return
        if item[0] == "eof":
            self.dispatcher.fail_all()  # after every response before the EOF was routed
        self.inbox.put(item)

    def close(self) -> None:
        """Nobody reads any more: a reader waiting on a full channel gives up."""
        self.reader_end.closed.set()

    def next(self, timeout: float | None) -> InboxItem:
        """The next parsed item (queue.Empty when the reader handed nothing over in `timeout`)."""
        while True:
            try:
                return self.inbox.get_nowait()
            except queue.Empty:
                self.pump(timeout)

    def queued_failure(self) -> fk.BackendFailure | None:
        """The first failure already parsed, if any: it explains an early EOF better than the
        EOF does, and the turn ends on it. With none, what was queued stays, in order."""
        items: list[InboxItem] = []
        while True:
            try:
                items.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if item[0] == "fatal":
                return item[1]
        for item in items:
            self.inbox.put(item)
        return None


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
        log.exception("codex stdout reader failed")
        # By type and place, not message: it becomes the finish's error (caldera.errors.unexpected)
        reason = f"the runtime's stdout reader failed: {unexpected(exc)}"
        end.put(("fatal", fk.BackendFailure(fk.BACKEND_FAILED, reason)))
    finally:
        end.put(_EOF)


def pump_stderr(stream: IO[bytes], tail: collections.deque[str], runlog: RunLog | None) -> None:
    """Reader thread body: stderr lines, ANSI stripped, into the run log and a bounded tail.
    It reads to EOF whatever the run log does (a full disk): a reader that stopped would
    leave codex blocked on a full stderr pipe for the rest of the turn."""
    size = 0
    guard = LoopGuard(log, "codex stderr reader: the run log")
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


class AppServer:
    """One `codex app-server` process and its JSON-RPC channel."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, runlog: RunLog | None, redactor: Redactor):
        self.argv, self.env, self.cwd = argv, env, cwd
        self.runlog, self.redactor = runlog, redactor
        self.channel = Channel(runlog)
        self.stderr_tail: collections.deque[str] = collections.deque()
        self.proc: subprocess.Popen[bytes] | None = None
        self.threads: list[threading.Thread] = []
        self._next_id = 1
        self._write_lock = threading.Lock()

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED,
                                    f"cannot start {self.argv[0]}: {exc.strerror or exc}") from None
        for name, target, args in (
                ("codex-stdout", pump_stdout, (self.proc.stdout, self.channel.reader_end)),
                ("codex-stderr", pump_stderr, (self.proc.stderr, self.stderr_tail, self.runlog))):
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)

    def send(self, message: Message) -> bool:
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

    def call(self, method: str, params: Message) -> _Slot:
        """Send a request; its response arrives in the slot (routed while the channel is pumped)."""
        request_id = self._next_id
        self._next_id += 1
        slot = self.channel.dispatcher.expect(request_id)
        if not self.send({"method": method, "id": request_id, "params": params}):
            slot.event.set()
        return slot

    def notify(self, method: str) -> None:
        self.send({"method": method})

    def respond(self, request_id: Any, result: Message | None = None, error: Message | None = None) -> None:
        message: Message = {"id": request_id}
        if error is not None:
            message["error"] = error
        else:
            message["result"] = result if result is not None else {}
        self.send(message)

    def returncode(self, wait: float = 0.0) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            return None

    def stderr_summary(self, lines: int = 3, limit: int = 500, settle: float = 0.0) -> str:
        """The last stderr lines, redacted; `settle` waits that long for the reader to reach EOF.

        After an early exit, stdout's EOF can be seen before the stderr reader has read the
        lines that explain it (the two pipes are read by two threads)."""
        if settle and len(self.threads) > 1:
            self.threads[1].join(timeout=settle)  # start(): stdout reader, then stderr reader
        text = " | ".join(list(self.stderr_tail)[-lines:])
        return self.redactor.text(text)[-limit:]  # masked whole, then cut: no secret cut in two

    def close(self, grace: float = CLOSE_GRACE) -> int | None:
        """Close stdin (codex exits at once), then TERM -> KILL the whole group if needed."""
        if self.proc is None:
            return None
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass  # already gone
        self.channel.close()  # a reader waiting on a full channel would keep codex blocked on stdout
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
            self.note(f"{', '.join(held)} still held open by a process outside codex's group; left behind")
        return self.proc.returncode

    def note(self, text: str) -> None:
        """The runtime's own remark in the run log."""
        if self.runlog is not None:
            self.runlog.note(text)

    def kill(self, grace: float = 1.0) -> None:
        if self.proc is not None:
            proc.kill_group(self.proc, grace, reap=2.0)
