"""A fake OpenAI-compatible chat-completions provider on 127.0.0.1 for the real-OpenCode tests.

`FakeChatProvider(script)` answers the n-th `POST /v1/chat/completions` for the main model
with `script[n]` (the last entry repeats); a request for any other model (OpenCode's small
model: session titles, summaries) gets a short text and consumes nothing. Entries:
    {"text": "..."}                               an assistant message, streamed as SSE deltas
    {"call": "bash", "args": {...}}               one tool call (finish_reason "tool_calls")
    {"status": 503, "body": {...}, "headers": {}} an HTTP error
    {"cut": True}                                 headers + one chunk, then the connection drops
    {"stall": 30}                                 headers, then silence for N seconds (or until close)
    {"raw": "...", "type": "text/html"}           a 200 answer with this body (a gateway that lies)
    {"gate": "name", "then": {...}}               wait until `release("name")`, then answer as `then`
Streams carry `usage` in a last chunk when the request asks `stream_options.include_usage`.
Every request is recorded (method, path, headers, body, model) for the leak checks.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.server.provider.record(self, b"")
        self._json(404, {"error": {"message": "not here"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        entry, n, request = self.server.provider.record(self, body)
        if "gate" in entry:
            self.server.provider.wait_gate(entry["gate"])
            entry = entry.get("then") or {"text": "after the gate"}
        if "status" in entry:
            return self._json(entry["status"], entry.get("body") or {"error": {"message": f"HTTP {entry['status']}"}},
                              entry.get("headers"))
        model = request.get("model") or MAIN_MODEL
        if "raw" in entry:
            raw = entry["raw"].encode()
            self.send_response(200)
            self.send_header("Content-Type", entry.get("type", "text/html"))
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if entry.get("cut") or entry.get("stall"):
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(_chunk(n, model, {"role": "assistant", "content": ""}))
            self.wfile.flush()
            if entry.get("stall"):
                self.server.provider.stop.wait(entry["stall"])
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        payload = b"".join(stream(entry, n, model, include_usage))
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    provider: FakeChatProvider


class FakeChatProvider:
    def __init__(self, script: list[dict[str, Any]], model: str = MAIN_MODEL):
        self.script = list(script)
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.arrived = threading.Condition(self.lock)
        self._gates: dict[str, threading.Event] = {}
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.provider = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def set_script(self, script: list[dict[str, Any]]) -> None:
        """A new script from the next main-model request on (one provider, several turns)."""
        with self.lock:
            self.script = list(script)
            self._offset = len(self.main)

    _offset = 0

    def record(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[dict[str, Any], int, dict[str, Any]]:
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        if not isinstance(request, dict):
            request = {}
        with self.lock:
            n = len(self.main) - self._offset
            main = handler.command == "POST" and request.get("model") == self.model
            self.requests.append({"method": handler.command, "path": handler.path, "main": main,
                                  "model": request.get("model"),
                                  "headers": {k.lower(): v for k, v in handler.headers.items()},
                                  "body": body.decode("utf-8", "replace"), "at": time.monotonic()})
            self.arrived.notify_all()
            if not main:
                return ({"text": "A title"} if handler.command == "POST" else {}), n, request
            return self.script[min(n, len(self.script) - 1)], n, request

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
            while len(self.main) < count:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.arrived.wait(left)
            return True

    @property
    def main(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["main"]]

    def __enter__(self) -> FakeChatProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
