"""The `codex app-server` process and its JSON-RPC channel over stdio.

The process and its reader threads are `stdio.StdioProcess`'s (threads codex-stdout,
codex-stderr). The stdout reader only hands whole-line blocks of bytes to a bounded
`Channel`; the thread that uses the messages parses them there (`Dispatcher`): run log,
bounded parse, each response to the request waiting for it, everything else in order
into the inbox as batches. What the messages mean is the turn logic's (backend.py).

The inbox holds ("batch", [(kind, message), …]) with kind "notification" or "request",
("fatal", BackendFailure) and, last, ("eof", None).
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from caldera.backends import failures as fk
from caldera.backends.codex.deltas import unused_delta
from caldera.backends.stdio import (
    LINE_CAP,
    Eof,
    Fatal,
    Handoff,
    HandoffItem,
    StdioProcess,
    pump_stderr,
    pump_stdout,
)
from caldera.host.jsonlimits import JSONLimitError, line_parser

if TYPE_CHECKING:
    from caldera.backends.runlog import RunLog
    from caldera.redact import Redactor

__all__ = ["LINE_CAP", "AppServer", "Channel", "Dispatcher", "Handoff", "pump_stderr", "pump_stdout"]
LINE_JSON_MAX = 64 * 1024 * 1024  # one JSON-RPC line; the nesting limit is what matters
HANDOFF_BLOCKS = 64  # read blocks waiting for the turn loop; then the reader, and through its pipe codex, waits

Message: TypeAlias = dict[str, Any]  # one JSON-RPC message, as parsed
Batch: TypeAlias = list[tuple[Literal["notification", "request"], Message]]
InboxItem: TypeAlias = tuple[Literal["batch"], Batch] | Fatal | Eof


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


class AppServer(StdioProcess):
    """One `codex app-server` process and its JSON-RPC channel."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, runlog: RunLog | None, redactor: Redactor):
        self.channel = Channel(runlog)
        super().__init__(argv, env, cwd, runlog, redactor, self.channel.reader_end, "codex")
        self._next_id = 1

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

