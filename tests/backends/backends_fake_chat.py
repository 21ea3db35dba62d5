"""A fake OpenAI-compatible chat-completions provider on 127.0.0.1 (OpenCode's wire): the
Responses-API fake (backends_fake_provider.FakeProvider) with another answer's shape.

`FakeChat(script)` answers the n-th `POST .../chat/completions` for its model with
`script[n]` (the last entry repeats); a request for any other model gets a short text and
consumes nothing. Entries, beside FakeProvider's {"status"}, {"cut"}, {"stall"} and {"drop"}:
    {"text": "..."}                               an assistant message, streamed in 16-character deltas
    {"call": "bash", "args": {...}}               one tool call (finish_reason "tool_calls")
    {"raw": "...", "type": "text/html"}           a 200 answer with this body (a gateway that lies)
    {"gate": "name", "then": {...}}               wait until `release("name")`, then answer as `then`
A stream carries `usage` in a last chunk when the request asks `stream_options.include_usage`.
`posts` are the requests for its model; `scenario(script)` is a view of one scenario's on a
provider that serves many (the contract suite's shared OpenCode server keeps one URL).
"""
from __future__ import annotations

import json
import ssl
import threading
import time
from contextlib import contextmanager
from typing import Any

from backends_fake_provider import FakeProvider
from backends_fake_provider import _Handler as ResponsesHandler

MAIN_MODEL = "fake-model"


def _chunk(n: int, model: str, delta: dict[str, Any] | None, finish: str | None = None,
           usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, Any] = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": int(time.time()),
                            "model": model, "choices": []}
    if delta is not None or finish is not None:
        body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def stream(entry: dict[str, Any], n: int, model: str, include_usage: bool) -> list[bytes]:
    out = [_chunk(n, model, {"role": "assistant", "content": ""})]
    if "call" in entry:
        args = json.dumps(entry.get("args", {}))
        out.append(_chunk(n, model, {"tool_calls": [{"index": 0, "id": f"call_{n}", "type": "function",
                                                     "function": {"name": entry["call"], "arguments": ""}}]}))
        for i in range(0, len(args), 24):
            out.append(_chunk(n, model, {"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 24]}}]}))
        out.append(_chunk(n, model, None, "tool_calls"))
    else:
        text = entry.get("text", "")
        for i in range(0, len(text), 16):
            out.append(_chunk(n, model, {"content": text[i:i + 16]}))
        out.append(_chunk(n, model, None, "stop"))
    if include_usage:
        out.append(_chunk(n, model, None, usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}))
    out.append(b"data: [DONE]\n\n")
    return out


class _ChatHandler(ResponsesHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        provider: FakeChat = self.server.provider  # type: ignore[attr-defined]
        entry, n, request = provider.record_chat(self, body)
        if "gate" in entry:
            provider.wait_gate(entry["gate"])
            entry = entry.get("then") or {"text": "after the gate"}
        if "status" in entry:
            return self._error(entry)
        if self.broken(entry, body):
            return None
        model = request.get("model") or MAIN_MODEL
        if "raw" in entry:
            raw = entry["raw"].encode()
            self.send_response(200)
            self.send_header("Content-Type", entry.get("type", "text/html"))
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        if entry.get("cut") or entry.get("stall"):
            return self.drop_after(_chunk(n, model, {"role": "assistant", "content": ""}), entry)
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        self.send_stream(b"".join(stream(entry, n, model, include_usage)))


class FakeChat(FakeProvider):
    handler = _ChatHandler

    def __init__(self, script: list[dict[str, Any]], model: str = MAIN_MODEL, tls: ssl.SSLContext | None = None):
        super().__init__(script, tls=tls)
        self.model = model
        self.arrived = threading.Condition(self.lock)
        self._gates: dict[str, threading.Event] = {}
        self._offset = 0  # main-model requests before the current script

    def set_script(self, script: list[dict[str, Any]]) -> None:
        """A new script from the next main-model request on (one provider, several turns)."""
        with self.lock:
            self.script = list(script)
            self._offset = len(self.posts)

    def record_chat(self, handler: Any, body: bytes) -> tuple[dict[str, Any], int, dict[str, Any]]:
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        request = request if isinstance(request, dict) else {}
        with self.lock:
            n = len(self.posts) - self._offset
            self.requests.append({"method": handler.command, "path": handler.path, "model": request.get("model"),
                                  "headers": {k.lower(): v for k, v in handler.headers.items()},
                                  "body": body.decode("utf-8", "replace"), "at": time.monotonic()})
            self.arrived.notify_all()
            if request.get("model") != self.model:
                return {"text": "A title"}, n, request
            return self.script[min(n, len(self.script) - 1)], n, request

    @property
    def posts(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "POST" and r.get("model") == self.model]

    main = posts  # the OpenCode tests' name for them

    def _gate(self, name: str) -> threading.Event:
        with self.lock:
            return self._gates.setdefault(name, threading.Event())

    def wait_gate(self, name: str) -> None:
        gate = self._gate(name)
        while not gate.is_set() and not self.stop.is_set():
            gate.wait(0.05)

    def release(self, name: str) -> None:
        self._gate(name).set()

    def wait_main(self, count: int, timeout: float = 60.0) -> bool:
        """Block until `count` main-model requests have arrived (for the interrupt tests)."""
        end = time.monotonic() + timeout
        with self.lock:
            while len(self.posts) < count:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.arrived.wait(left)
            return True

    @contextmanager
    def scenario(self, script: list[dict[str, Any]]) -> Any:
        """This provider for one scenario: `script` from its next request on, and a view whose
        `requests` and `posts` are that scenario's only."""
        with self.lock:
            start = len(self.requests)
        self.set_script(script)
        yield _View(self, start)


class _View:
    def __init__(self, provider: FakeChat, start: int):
        self._provider, self._start = provider, start
        self.url = provider.url

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self._provider.requests[self._start:]

    @property
    def posts(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "POST" and r.get("model") == self._provider.model]
