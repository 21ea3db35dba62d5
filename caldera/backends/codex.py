"""The Codex backend: the native `codex app-server`, JSON-RPC over stdio.

One run = one process in its own process group with a private CODEX_HOME (0700)
built by `codex_config`. A reader thread hands stdout over in whole-line blocks
(`Channel`); the thread waiting for them turns them into messages (a response goes
to the request waiting for it, everything else, in order, to the turn loop); another
reader keeps a bounded, redacted stderr tail. The turn loop
answers approval requests from the policy (declined: there is no approver in a
control-plane run, and the policy is never widened), normalises notifications,
and interrupts on `agent_interrupt`, on cancel and on the policy's deadline
(then kills after a grace: backend-timeout).
"""
from __future__ import annotations

import collections
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from caldera import __version__, config
from caldera.backends import codex_config
from caldera.backends import failures as fk
from caldera.backends.base import APPROVALS, SANDBOXES, Backend, Environment, RunRequest
from caldera.backends.codex_deltas import unused_delta
from caldera.backends.events import EVENT_TYPES
from caldera.backends.normalize import Normalizer
from caldera.errors import ConfigError
from caldera.host import proc
from caldera.host.jsonlimits import JSONLimitError, line_parser

LINE_CAP = 32 * 1024 * 1024  # one stdout line (a huge aggregatedOutput stays well below)
READ_CHUNK = 64 * 1024  # one read of stdout: its whole lines are handled together
HANDOFF_BLOCKS = 64  # read blocks waiting for the turn loop (<= 4 MiB); then codex waits on its pipe
STDERR_KEEP = 64 * 1024
STDERR_LINE = 64 * 1024
REQUEST_TIMEOUT = 30.0  # initialize / thread/start / turn/start
INTERRUPT_GRACE = 5.0  # after turn/interrupt on cancel, before the kill
TIMEOUT_GRACE = 2.0  # after turn/interrupt on the policy deadline, before the kill
CLOSE_GRACE = 2.0  # after closing stdin (codex exits in <= 0.06 s)
POLL = 0.05
STDERR_SETTLE = 2.0  # after an early exit: how long to wait for the stderr that explains it
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
TRIPLES = {"x86_64": ("codex-linux-x64", "x86_64-unknown-linux-musl"),
           "aarch64": ("codex-linux-arm64", "aarch64-unknown-linux-musl")}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_EOF = ("eof", None)


# ---------------------------------------------------------------- the binary

def find_binary(env: dict) -> str | None:
    """CALDERA_CODEX_BIN, else `codex` on PATH (the npm wrapper resolved to its native binary)."""
    explicit = config.codex_binary(env)
    if explicit:
        return explicit
    found = shutil.which("codex", path=env.get("PATH") or DEFAULT_PATH)
    return native_for(found) if found else None


def native_for(path: str) -> str:
    """The native binary inside the npm package when `path` is its Node wrapper (bin/codex.js)."""
    real = os.path.realpath(path)
    if not real.endswith(".js"):
        return path
    package = Path(real).parent.parent  # node_modules/@openai/codex
    pkg, triple = TRIPLES.get(os.uname().machine, TRIPLES["x86_64"])
    for base in (package / "node_modules" / "@openai", package.parent):
        candidate = base / pkg / "vendor" / triple / "bin" / "codex"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return path


# ---------------------------------------------------------------- JSON-RPC over stdio

class _Slot:
    __slots__ = ("event", "message")

    def __init__(self):
        self.event = threading.Event()
        self.message = None


LINE_JSON_MAX = 64 * 1024 * 1024  # one JSON-RPC line; the nesting limit is what matters


class Dispatcher:
    """Turns stdout lines into messages. Separate from the process so that it can be benchmarked."""

    def __init__(self, inbox: queue.Queue, runlog, skip_unused: bool = False):
        self.inbox = inbox
        self.runlog = runlog
        self.pending: dict = {}
        self.lock = threading.Lock()
        self.parse = line_parser(max_bytes=LINE_JSON_MAX, what="backend stdout line")
        # In a run, agentMessage deltas nothing consumes are validated and dropped (codex_deltas).
        self.skip_unused = skip_unused

    def line(self, raw: bytes) -> None:
        self.block(raw)

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
        batch: list = []
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
                self._fatal(batch, fk.BACKEND_PROTOCOL_ERROR, f"backend sent a JSON {type(msg).__name__}, not an object")
            elif "method" in msg:
                batch.append(("request" if "id" in msg else "notification", msg))
            elif "id" in msg:
                self._flush(batch)  # what came before a response is queued before it is seen
                self._respond(msg)
            else:
                self._fatal(batch, fk.BACKEND_PROTOCOL_ERROR, "backend message has neither method nor id")
        self._flush(batch)

    def _flush(self, batch: list) -> None:
        if batch:
            self.inbox.put(("batch", batch[:]))
            batch.clear()

    def _fatal(self, batch: list, kind: str, message: str) -> None:
        self._flush(batch)
        self.inbox.put(("fatal", fk.BackendFailure(kind, message)))

    def _respond(self, msg: dict) -> None:
        with self.lock:
            slot = self.pending.pop(msg["id"], None)
        if slot is None:
            if self.runlog is not None:
                self.runlog.note(f"response to unknown request id {msg['id']!r}")
            return
        slot.message = msg
        slot.event.set()

    def expect(self, request_id) -> _Slot:
        slot = _Slot()
        with self.lock:
            self.pending[request_id] = slot
        return slot

    def fail_all(self) -> None:
        with self.lock:
            slots, self.pending = list(self.pending.values()), {}
        for slot in slots:
            slot.event.set()  # message stays None: the process is gone


def handle_batch(batch: list, normalizer, answer) -> dict | None:
    """One ("batch", …) inbox item through the normalizer (requests to `answer`); the
    turn/completed message when it comes (what follows it in the batch is dropped, as
    the inbox's rest was when the loop ended one message at a time)."""
    handler_for = normalizer.handler_for  # bound once: this loop runs for every stdout line
    for kind, msg in batch:
        if kind == "notification":
            method = msg.get("method")
            if method == "turn/completed":
                return msg
            handler = handler_for(method)
            if handler is not None:  # a line no handler wants (rate limits, …) costs no call
                params = msg.get("params")
                handler(params if isinstance(params, dict) else {})
        else:
            answer(msg)
    return None


class Handoff:
    """The reader thread's end of a Channel: whole-line blocks of stdout go over as bytes,
    at most HANDOFF_BLOCKS waiting. A full channel stops the reader, and the pipe then
    stops codex: memory stays flat however fast codex writes. Once the channel is closed
    (the run is over, nobody reads) what comes is dropped instead of waited on."""

    def __init__(self, queue_: queue.Queue, runlog):
        self._queue = queue_
        self.runlog = runlog
        self.closed = threading.Event()
        self.inbox = self  # pump_stdout puts its fatal and EOF items here too

    def put(self, item) -> None:
        while not self.closed.is_set():
            try:
                self._queue.put(item, timeout=POLL)
                return
            except queue.Full:
                continue

    def block(self, data: bytes) -> None:
        self.put(("raw", data))

    def fail_all(self) -> None:
        """Nothing here: the channel fails waiting requests when it reaches the EOF."""


class Channel:
    """Codex stdout between the reader thread and the turn loop.

    The reader thread only reads and cuts whole-line blocks (pump_stdout into `reader_end`);
    the thread that uses the messages parses them (`pump`, `next`): the run-log write, the
    bounded parse, response routing and the normaliser then run on one thread. Parsing in
    the reader thread made every message cross cores and the GIL on its way to the turn
    loop: 72k lines per CPU s against 90-97k with bytes handed over (bench/bench_codex.py,
    docs/performance.md section 5)."""

    def __init__(self, runlog):
        self.handoff: queue.Queue = queue.Queue(HANDOFF_BLOCKS)  # ("raw", bytes) | ("fatal", failure) | EOF
        self.inbox: queue.Queue = queue.Queue()  # parsed, in order: ("batch", …) | ("fatal", …) | EOF
        self.dispatcher = Dispatcher(self.inbox, runlog, skip_unused=True)
        self.reader_end = Handoff(self.handoff, runlog)

    def pump(self, timeout: float) -> None:
        """Parse what the reader handed over next (waiting up to `timeout`; queue.Empty if
        nothing came): responses reach their requests, everything else queues in order."""
        kind, msg = self.handoff.get(timeout=timeout)
        if kind == "raw":
            self.dispatcher.block(msg)
            return
        if kind == "eof":
            self.dispatcher.fail_all()  # after every response before the EOF was routed
        self.inbox.put((kind, msg))

    def close(self) -> None:
        """Nobody reads any more: a reader waiting on a full channel gives up."""
        self.reader_end.closed.set()

    def next(self, timeout: float) -> tuple:
        """The next parsed item (queue.Empty when the reader handed nothing over in `timeout`)."""
        while True:
            try:
                return self.inbox.get_nowait()
            except queue.Empty:
                self.pump(timeout)


def pump_stdout(stream, dispatcher) -> None:
    """Reader thread body: stdout in chunks of up to READ_CHUNK bytes, each chunk's whole
    lines to `dispatcher` at once (its block(): a Channel's Handoff in a run, a Dispatcher
    in tests), the last line at EOF, then EOF."""
    parts: list = []  # the line being read, in pieces (a long line is not copied per chunk)
    size = 0
    try:
        while True:
            chunk = stream.read1(READ_CHUNK)
            if not chunk:
                break
            end = chunk.rfind(b"\n")
            if end < 0:
                parts.append(chunk)
                size += len(chunk)
                if size >= LINE_CAP:
                    dispatcher.inbox.put(("fatal", fk.BackendFailure(
                        fk.BACKEND_PROTOCOL_ERROR, f"backend stdout line longer than {LINE_CAP} bytes")))
                    return
                continue
            head = b"".join((*parts, chunk[:end])) if parts else chunk[:end]
            rest = chunk[end + 1:]
            parts, size = ([rest], len(rest)) if rest else ([], 0)
            dispatcher.block(head)
        if parts:
            dispatcher.block(b"".join(parts))  # a last line without its newline
    except (OSError, ValueError) as exc:  # the pipe was closed under us at shutdown
        if dispatcher.runlog is not None:
            dispatcher.runlog.note(f"stdout reader stopped: {exc}")
    finally:
        dispatcher.fail_all()
        dispatcher.inbox.put(_EOF)


def pump_stderr(stream, tail: collections.deque, runlog) -> None:
    """Reader thread body: stderr lines, ANSI stripped, into the run log and a bounded tail."""
    size = 0
    try:
        # Whole lines up to STDERR_LINE (a piece of a longer one is a record of its own): each
        # record is masked alone, so a smaller piece could cut a secret in two.
        for raw in iter(lambda: stream.readline(STDERR_LINE), b""):
            text = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip()
            if not text:
                continue
            if runlog is not None:
                runlog.write("stderr", text)
            tail.append(text)
            size += len(text)
            while size > STDERR_KEEP and tail:
                size -= len(tail.popleft())
    except (OSError, ValueError) as exc:
        if runlog is not None:
            runlog.note(f"stderr reader stopped: {exc}")


class AppServer:
    """One `codex app-server` process and its JSON-RPC channel."""

    def __init__(self, argv: list, env: dict, cwd: str, runlog, redactor):
        self.argv, self.env, self.cwd = argv, env, cwd
        self.runlog, self.redactor = runlog, redactor
        self.channel = Channel(runlog)
        self.inbox = self.channel.inbox
        self.dispatcher = self.channel.dispatcher
        self.stderr_tail: collections.deque = collections.deque()
        self.proc: subprocess.Popen | None = None
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

    def send(self, message: dict) -> bool:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        self.runlog.write("c2s", line)
        with self._write_lock:
            try:
                self.proc.stdin.write(line.encode("utf-8") + b"\n")
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, ValueError, OSError):
                return False  # the process is gone; the reader reports EOF

    def call(self, method: str, params) -> tuple[int, _Slot]:
        request_id = self._next_id
        self._next_id += 1
        slot = self.dispatcher.expect(request_id)
        if not self.send({"method": method, "id": request_id, "params": params}):
            slot.event.set()
        return request_id, slot

    def notify(self, method: str, params=None) -> None:
        message = {"method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def respond(self, request_id, result=None, error=None) -> None:
        message = {"id": request_id}
        if error is not None:
            message["error"] = error
        else:
            message["result"] = result if result is not None else {}
        self.send(message)

    def returncode(self, wait: float = 0.0) -> int | None:
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
            self.proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass  # already gone
        self.channel.close()  # a reader waiting on a full channel would keep codex blocked on stdout
        if self.returncode(grace) is None:
            self.kill()
        proc.signal_group(self.proc, signal.SIGKILL)  # agent commands left in the group
        held = []
        # self.threads are the stdout and stderr readers, in that order (start()).
        for thread, stream in zip(self.threads, (self.proc.stdout, self.proc.stderr)):
            thread.join(timeout=2.0)
            if thread.is_alive():
                # A process outside the group (a command that ran `setsid`) still holds the
                # pipe: closing the stream would wait on the reader's lock for as long as that
                # process lives. The daemon thread keeps it; the turn is over regardless.
                held.append(thread.name)
            else:
                stream.close()
        if held and self.runlog is not None:
            self.runlog.note(f"{', '.join(held)} still held open by a process outside codex's group; left behind")
        return self.proc.returncode

    def kill(self, grace: float = 1.0) -> None:
        proc.kill_group(self.proc, grace, reap=2.0)


# ---------------------------------------------------------------- the backend

class _Stop(Exception):
    """Cancel or deadline reached while waiting for a response (before the turn loop)."""


@dataclass
class CodexContext:
    run: RunRequest
    environment: Environment
    sink: object
    normalizer: Normalizer
    binary: str
    run_dir: Path
    plan: codex_config.ProviderPlan
    deadline: float  # time.monotonic() of the policy timeout
    cancel: threading.Event | None = None  # the command's cancel (timeout or operator)
    cancel_is_timeout: object = None  # callable: was the cancel the command's own deadline?
    interrupt_event: threading.Event = field(default_factory=threading.Event)
    server: AppServer | None = None
    thread_id: str | None = None
    turn_id: str | None = None
    reason: str | None = None  # "cancelled" | "timeout" once we stop the turn
    stop_sent_at: float | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def redactor(self):
        return self.environment.redactor


class CodexBackend(Backend):
    name = "codex"

    def resolve_profile(self, profile: str = "codex", env: dict | None = None, probe: bool = False) -> dict:
        env = os.environ if env is None else env
        binary = find_binary(env)
        info = {"name": "codex", "default": True, "transport": "codex app-server (JSON-RPC over stdio)",
                "binary": binary, "available": bool(binary and os.access(binary, os.X_OK)),
                "sandboxes": list(SANDBOXES), "approvals": list(APPROVALS), "network": True,
                "interrupt": True, "events": list(EVENT_TYPES), "failure_kinds": list(fk.FAILURE_KINDS),
                "llm_gateway": codex_config.gateway_settings(env) is not None}
        if probe and info["available"]:
            info["version"] = _version(binary)
        return info

    def prepare(self, run: RunRequest, command, environment: Environment, sink) -> CodexContext:
        """Everything that can fail before a process exists: binary, projection, CODEX_HOME."""
        redactor = environment.redactor
        projection = codex_config.Projection.locate(environment.secrets_dir, environment.credentials_dir)
        plan = codex_config.plan_provider(projection, environment.env, run.model)
        for value in plan.secret_values:
            redactor.add(value)
        binary = find_binary(environment.env)
        sink.emit("backend_status", {
            "phase": "starting", "backend": "codex", "profile": run.backend_profile, "binary": binary,
            "provider": plan.provider, "model": plan.model, "base_url": plan.base_url,
            "provider_source": plan.source, "policy": run.policy.as_dict()})
        if not binary:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED,
                                    "no Codex binary: set CALDERA_CODEX_BIN or put codex on PATH")
        if not os.path.isdir(run.workspace):
            raise fk.BackendFailure(fk.BACKEND_FAILED, f"workspace {run.workspace} is not a directory")
        run_dir = Path(environment.runs_dir) / run.run_id
        context = CodexContext(run=run, environment=environment, sink=sink, normalizer=Normalizer(sink),
                               binary=binary, run_dir=run_dir, plan=plan,
                               deadline=time.monotonic() + run.policy.timeout_seconds)
        try:
            request_retries, stream_retries = config.codex_retries(
                environment.env, codex_config.DEFAULT_REQUEST_MAX_RETRIES, codex_config.DEFAULT_STREAM_MAX_RETRIES)
        except ConfigError as exc:
            raise fk.BackendFailure(fk.BACKEND_FAILED, str(exc)) from None
        codex_toml = codex_config.enforce(plan, network=run.policy.network,
                                          request_retries=request_retries, stream_retries=stream_retries)
        raw = projection.read("config.toml") or b""
        for line in codex_config.withheld_lines(raw.decode("utf-8", "replace"), codex_config.dump_toml(codex_toml)):
            redactor.add(line)  # no line of the config reaches an event beyond base URL, model, profile
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.chmod(run_dir, 0o700)
            codex_config.write_codex_home(run_dir / "codex-home", plan, codex_toml)
            (run_dir / "home").mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            shutil.rmtree(run_dir, ignore_errors=True)  # it may hold a partial auth.json
            raise fk.BackendFailure(fk.BACKEND_FAILED, f"cannot prepare the run directory: {exc}") from None
        return context

    def _process_env(self, context: CodexContext) -> dict:
        # Only what Codex needs: nothing of the runtime's own environment (its tokens) leaks in.
        env = {"PATH": context.environment.env.get("PATH") or DEFAULT_PATH,
               "HOME": str(context.run_dir / "home"), "LANG": "C.UTF-8",
               "CODEX_HOME": str(context.run_dir / "codex-home")}
        if context.environment.env.get("TZ"):
            env["TZ"] = context.environment.env["TZ"]
        env.update(context.plan.env)
        return env

    def start_turn(self, context: CodexContext) -> None:
        server = AppServer([context.binary, "app-server"], self._process_env(context),
                           context.run.workspace, context.sink.runlog, context.redactor)
        context.server = server
        server.start()
        try:
            self._handshake(context)
        except _Stop:
            self._end_stopped(context)
            return
        self._loop(context)

    def _handshake(self, context: CodexContext) -> None:
        server, sink, run = context.server, context.sink, context.run
        init = self._request(context, "initialize", {
            "clientInfo": {"name": "caldera", "title": "caldera", "version": __version__},
            "capabilities": None}, before_init=True)
        sink.emit("backend_status", {"phase": "ready", "user_agent": init.get("userAgent"),
                                     "platform": init.get("platformOs")})
        server.notify("initialized")
        params = {"cwd": run.workspace, "approvalPolicy": run.policy.approval,
                  "sandbox": run.policy.sandbox, "ephemeral": True, "modelProvider": context.plan.provider}
        if context.plan.model:
            params["model"] = context.plan.model
        started = self._request(context, "thread/start", params)
        thread = started.get("thread")
        if not isinstance(thread, dict) or not isinstance(thread.get("id"), str):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID, "thread/start result has no thread.id")
        context.thread_id = thread["id"]
        sink.emit("backend_status", {
            "phase": "thread_started", "thread_id": context.thread_id, "model": started.get("model"),
            "model_provider": started.get("modelProvider"), "sandbox": run.policy.sandbox,
            "approval": run.policy.approval, "network": run.policy.network, "cwd": run.workspace})
        turn = self._request(context, "turn/start", {
            "threadId": context.thread_id,
            "input": [{"type": "text", "text": run.prompt, "text_elements": []}]}).get("turn")
        if not isinstance(turn, dict) or not isinstance(turn.get("id"), str):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID, "turn/start result has no turn.id")
        context.turn_id = turn["id"]

    def _request(self, context: CodexContext, method: str, params, before_init: bool = False) -> dict:
        """Send a request and wait for its result; notifications queue up meanwhile."""
        server = context.server
        _, slot = server.call(method, params)
        limit = time.monotonic() + REQUEST_TIMEOUT
        while not slot.event.is_set():
            if self._stop_reason(context):
                raise _Stop()
            if time.monotonic() >= limit:
                raise fk.BackendFailure(fk.BACKEND_FAILED, f"no answer to {method} within {REQUEST_TIMEOUT:.0f} s")
            try:
                server.channel.pump(POLL)  # the response is routed here; notifications queue for the loop
            except queue.Empty:
                continue
        msg = slot.message
        if msg is None:  # the process went away
            self._raise_fatal_if_any(context)
            rc = server.returncode(wait=2.0)
            kind = fk.BACKEND_SPAWN_FAILED if before_init else fk.BACKEND_FAILED
            raise fk.BackendFailure(kind, f"codex app-server exited (rc {rc}) before answering {method}: "
                                          f"{server.stderr_summary(settle=STDERR_SETTLE) or 'no stderr'}")
        if "error" in msg:
            error = msg["error"] if isinstance(msg["error"], dict) else {"message": str(msg["error"])}
            raise fk.BackendFailure(fk.BACKEND_FAILED, f"{method} failed: {error.get('message')}")
        if "result" not in msg or not isinstance(msg["result"], dict):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID, f"{method} response has no result object")
        return msg["result"]

    def _raise_fatal_if_any(self, context: CodexContext) -> None:
        """A parse/protocol failure the reader queued explains an early EOF better than the EOF."""
        pending = []
        while True:
            try:
                item = context.server.inbox.get_nowait()
            except queue.Empty:
                break
            if item[0] == "fatal":
                raise item[1]
            pending.append(item)
        for item in pending:
            context.server.inbox.put(item)

    def _stop_reason(self, context: CodexContext) -> str | None:
        if context.interrupt_event.is_set():
            return "cancelled"
        if context.cancel is not None and context.cancel.is_set():
            is_timeout = context.cancel_is_timeout() if context.cancel_is_timeout else False
            return "timeout" if is_timeout else "cancelled"
        if time.monotonic() >= context.deadline:
            return "timeout"
        return None

    def _loop(self, context: CodexContext) -> None:
        server, norm = context.server, context.normalizer
        while True:
            if context.reason is None:
                context.reason = self._stop_reason(context)
                if context.reason:
                    self._send_interrupt(context)
            elif time.monotonic() - context.stop_sent_at > self._grace(context):
                server.runlog.note("no turn/completed after turn/interrupt: killing the backend")
                server.kill()
                return self._end_stopped(context)
            try:
                kind, msg = server.channel.next(POLL)
            except queue.Empty:
                continue
            if kind == "batch":
                done = handle_batch(msg, norm, lambda request: self._answer(context, request))
                if done is not None:
                    return self._completed(context, done.get("params"))
                continue
            if kind == "notification":
                if msg.get("method") == "turn/completed":
                    return self._completed(context, msg.get("params"))
                norm.notification(msg.get("method"), msg.get("params"))
            elif kind == "request":
                self._answer(context, msg)
            elif kind == "fatal":
                server.kill()
                return norm.finish("failed", msg.kind, msg.message, self._extra(context))
            elif kind == "eof":
                if context.reason:
                    return self._end_stopped(context)
                rc = server.returncode(wait=2.0)
                hint = server.stderr_summary(settle=STDERR_SETTLE)
                return norm.finish("failed", fk.BACKEND_FAILED,
                                   f"codex app-server exited (rc {rc}) before the turn completed"
                                   + (f": {hint}" if hint else ""), self._extra(context))

    def _grace(self, context: CodexContext) -> float:
        return TIMEOUT_GRACE if context.reason == "timeout" else INTERRUPT_GRACE

    def _send_interrupt(self, context: CodexContext) -> None:
        context.stop_sent_at = time.monotonic()
        context.sink.emit("backend_status", {"phase": "interrupting", "reason": context.reason})
        if context.thread_id and context.turn_id:
            context.server.call("turn/interrupt", {"threadId": context.thread_id, "turnId": context.turn_id})

    def _completed(self, context: CodexContext, params) -> None:
        norm = context.normalizer
        turn = (params or {}).get("turn") if isinstance(params, dict) else None
        if isinstance(turn, dict) and context.turn_id and turn.get("id") not in (None, context.turn_id):
            context.server.runlog.note(f"turn/completed for another turn {turn.get('id')!r}")
        try:
            status, kind, message = norm.outcome(params)
        except fk.BackendFailure as exc:
            return norm.finish("failed", exc.kind, exc.message, self._extra(context))
        if status == "cancelled" and context.reason == "timeout":
            status, kind, message = "failed", fk.BACKEND_TIMEOUT, self._timeout_message(context)
        norm.finish(status, kind, message, self._extra(context))

    def _end_stopped(self, context: CodexContext) -> None:
        reason = context.reason or self._stop_reason(context) or "cancelled"
        if reason == "timeout":
            context.normalizer.finish("failed", fk.BACKEND_TIMEOUT, self._timeout_message(context),
                                      self._extra(context))
        else:
            context.normalizer.finish("cancelled", fk.CANCELLED, "the run was cancelled", self._extra(context))

    def _timeout_message(self, context: CodexContext) -> str:
        return f"the run passed its timeout of {context.run.policy.timeout_seconds} s"

    def _extra(self, context: CodexContext) -> dict:
        return {"duration_ms": int((time.monotonic() - context.started) * 1000)}

    def _answer(self, context: CodexContext, msg: dict) -> None:
        """Server-to-client requests: approvals are declined (the policy is never widened), the rest refused."""
        method, params = msg.get("method"), msg.get("params") or {}
        if method in ("item/commandExecution/requestApproval", "item/fileChange/requestApproval"):
            context.server.respond(msg["id"], {"decision": "decline"})
        elif method in ("execCommandApproval", "applyPatchApproval"):
            context.server.respond(msg["id"], {"decision": "denied"})
        else:
            context.server.respond(msg["id"], error={"code": -32601, "message": f"caldera does not support {method}"})
        context.sink.emit("tool_call", {
            "item_id": params.get("itemId"), "tool": "approval", "status": "declined", "request": method,
            "command": params.get("command") if isinstance(params.get("command"), str) else None,
            "reason": "the execution policy allows no approvals in unattended runs"})

    def interrupt(self, context: CodexContext, command=None) -> bool:
        """Ask the turn loop to interrupt (turn/interrupt, then kill after the grace)."""
        already = context.interrupt_event.is_set()
        context.interrupt_event.set()
        return not already

    def finalize(self, context: CodexContext) -> dict:
        try:
            if context.server is not None and context.server.proc is not None:
                rc = context.server.close()
                context.sink.runlog.note(f"codex app-server ended, rc {rc}")
        finally:
            shutil.rmtree(context.run_dir, ignore_errors=False, onerror=_note_rmtree(context))
        return context.sink.terminal["data"] if context.sink.terminal else {}


def _note_rmtree(context):
    def onerror(func, path, exc_info):
        context.sink.runlog.note(f"could not remove {path}: {exc_info[1]}")
    return onerror


def _version(binary: str) -> str | None:
    result = proc.run([binary, "--version"], env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"},
                      timeout=10, stdout_cap=4096)
    return result.stdout.decode("utf-8", "replace").strip() or None if result.ok else None
