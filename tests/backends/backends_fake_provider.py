"""A fake OpenAI-compatible Responses-API provider on 127.0.0.1 for the real-Codex tests.

`FakeProvider(script)` answers the n-th `POST /v1/responses` with `script[n]` (the last
entry repeats). Entries:
    {"text": "..."}                               an assistant message, streamed as SSE
    {"call": "exec_command", "args": {...}}       a function call
    {"custom": "apply_patch", "input": "..."}     a custom (freeform) tool call
    {"status": 503, "body": {...}, "headers": {}} an HTTP error
    {"cut": True}                                 headers + one event, then the connection drops
    {"stall": 30}                                 headers, then silence for N seconds
    {"stall": 30, "silent": True}                 200 and its headers, then not a byte for N seconds
    {"drop": True}                                200, its Content-Length and a piece of its body, then the
                                                  connection drops: mid-answer, streaming or not (a
                                                  provider behind a failing load balancer)
Every request is recorded (path, headers, body text) for the leak checks. With `tls` (an
SSLContext holding a certificate) it speaks HTTPS on the same port.

`FakeProvider(script, models=[...])` is ClawManager's AI gateway: a `POST /v1/responses` whose
`model` its catalogue does not list is answered 404 `model_not_found`, before the script.
"""
from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _sse(kind: str, payload: dict) -> bytes:
    payload = dict(payload, type=kind)
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()


def _usage() -> dict:
    return {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}


def response_events(entry: dict, n: int) -> list[bytes]:
    rid = f"resp_{n}"
    out = [_sse("response.created", {"response": {"id": rid}})]
    if "text" in entry:
        item = {"type": "message", "role": "assistant", "id": f"msg_{n}",
                "content": [{"type": "output_text", "text": entry["text"], "annotations": []}]}
        out.append(_sse("response.output_item.added", {"output_index": 0, "item": dict(item, content=[])}))
        text = entry["text"]
        for i in range(0, len(text), 16):
            out.append(_sse("response.output_text.delta", {"item_id": f"msg_{n}", "output_index": 0,
                                                           "content_index": 0, "delta": text[i:i + 16]}))
        out.append(_sse("response.output_item.done", {"output_index": 0, "item": item}))
    elif "call" in entry:
        item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": entry["call"],
                "arguments": json.dumps(entry.get("args", {}))}
        out.append(_sse("response.output_item.done", {"output_index": 0, "item": item}))
    elif "custom" in entry:
        item = {"type": "custom_tool_call", "id": f"ctc_{n}", "call_id": f"call_{n}", "name": entry["custom"],
                "input": entry["input"]}
        out.append(_sse("response.output_item.done", {"output_index": 0, "item": item}))
    out.append(_sse("response.completed", {"response": {"id": rid, "usage": _usage()}}))
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self.server.provider.record(self, b"")
        body = json.dumps({"object": "list", "data": []}).encode()
        self.send_response(404 if "/models" not in self.path else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        entry, n = self.server.provider.record(self, body)
        refused = self.server.provider.refusal(body)
        if refused is not None:
            return self._error(refused)
        if "status" in entry:
            return self._error(entry)
        if self.broken(entry, body):
            return None
        if entry.get("cut") or entry.get("stall"):
            return self.drop_after(_sse("response.created", {"response": {"id": f"resp_{n}"}}), entry)
        self.send_stream(b"".join(response_events(entry, n)))

    def send_stream(self, payload: bytes) -> None:
        """A whole SSE answer (200, text/event-stream, its length)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def drop_after(self, first: bytes, entry: dict) -> None:
        """A {"cut"} or {"stall": N} entry: the stream's headers and `first`, then (after N
        seconds of silence, or the provider's stop) the connection drops. The client may
        have gone meanwhile (an aborted turn): nothing to say then."""
        self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(first)
            self.wfile.flush()
            if entry.get("stall"):
                self.server.provider.stop.wait(entry["stall"])
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def broken(self, entry: dict, body: bytes) -> bool:
        """A {"drop"} or silent {"stall"} entry answered (True), on any wire: the request's
        own `stream` flag decides between an SSE and a JSON answer."""
        if not entry.get("drop") and not (entry.get("stall") and entry.get("silent")):
            return False
        try:
            streaming = bool(json.loads(body).get("stream"))
        except (ValueError, AttributeError):
            streaming = False
        text = {"type": "message", "content": [{"type": "text", "text": "cut " * 64}]}
        answer = (b"".join(_sse("message", dict(text, n=i)) for i in range(8)) if streaming
                  else json.dumps(text).encode())
        sent = len(answer) // 16  # within the first event (or object): no whole one reaches the client
        self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if streaming else "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            if entry.get("drop"):
                self.wfile.write(answer[:sent])
            self.wfile.flush()
            if entry.get("stall"):
                self.server.provider.stop.wait(entry["stall"])
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the client went first (an aborted turn)
        return True

    def _error(self, entry):
        body = json.dumps(entry.get("body") or {"error": {"message": f"HTTP {entry['status']}"}}).encode()
        self.send_response(entry["status"])
        self.send_header("Content-Type", "application/json")
        for k, v in (entry.get("headers") or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class FakeProvider:
    handler: type[BaseHTTPRequestHandler] = _Handler  # a provider of another wire subclasses both

    def __init__(self, script: list[dict], models: list[str] | None = None, tls: ssl.SSLContext | None = None):
        self.script = list(script)
        self.models = models  # a gateway's catalogue: any other model is refused
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.httpd.daemon_threads = True
        self.httpd.provider = self
        self.scheme = "https" if tls is not None else "http"
        if tls is not None:  # HTTPS on the same port (the proxy tests)
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def record(self, handler, body: bytes):
        with self.lock:
            posts = [r for r in self.requests if r["method"] == "POST"]
            n = len(posts)
            self.requests.append({"method": handler.command, "path": handler.path,
                                  "headers": {k.lower(): v for k, v in handler.headers.items()},
                                  "body": body.decode("utf-8", "replace"), "at": time.monotonic()})
        if handler.command != "POST":
            return {}, n
        return self.script[min(n, len(self.script) - 1)], n

    def refusal(self, body: bytes) -> dict | None:
        """The gateway's answer to a model its catalogue does not list, else None."""
        if self.models is None:
            return None
        try:
            model = json.loads(body).get("model")
        except (ValueError, AttributeError):
            model = None
        if model in self.models:
            return None
        message = f"model {model!r} is not in this gateway's catalogue"
        return {"status": 404, "body": {"error": {"message": message, "type": "invalid_request_error",
                                                  "code": "model_not_found"}}}

    @property
    def posts(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "POST"]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
