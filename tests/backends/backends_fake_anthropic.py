"""A fake Anthropic Messages-API provider on 127.0.0.1 for the real Claude Code tests.

`FakeAnthropic(script)` answers the n-th `POST /v1/messages` with `script[n]` (the last
entry repeats). Entries:
    {"text": "...", "delta": 16}                  an assistant message, streamed as SSE deltas
    {"tool": "Bash", "input": {...}}              a tool_use block (stop_reason tool_use), after
                                                  the text block when the entry has both
    {"status": 429, "body": {...}, "headers": {}} an HTTP error
    {"cut": True}                                 message_start and half a text, then the connection drops
    {"stall": 30}                                 headers and message_start, then silence for N seconds
    {"drop"}, {"stall": 30, "silent": True}       as FakeProvider's (the request's `stream` decides SSE or JSON)
Every request is recorded (path, headers, body text) for the leak checks. With `tls` (an
SSLContext holding a certificate) it speaks HTTPS on the same port.
"""
from __future__ import annotations

import json
import socket
import ssl

from backends_fake_provider import FakeProvider
from backends_fake_provider import _Handler as ResponsesHandler

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 429: "rate_limit_error", 500: "api_error", 503: "api_error",
               529: "overloaded_error"}


def _sse(kind: str, payload: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(dict(payload, type=kind))}\n\n".encode()


def _start(n: int, model: str) -> bytes:
    return _sse("message_start", {"message": {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0}}})


def message_events(entry: dict, n: int, model: str) -> list[bytes]:
    """A text block (in deltas of entry["delta"] characters, 16 by default), a tool_use
    block, or both in that order."""
    out = [_start(n, model)]
    index = 0
    if "text" in entry:
        text, size = entry["text"], entry.get("delta", 16)
        out.append(_sse("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}))
        for i in range(0, max(len(text), 1), size):
            delta = {"type": "text_delta", "text": text[i:i + size]}
            out.append(_sse("content_block_delta", {"index": index, "delta": delta}))
        out.append(_sse("content_block_stop", {"index": index}))
        index += 1
    if "tool" in entry:
        out.append(_sse("content_block_start", {"index": index, "content_block": {
            "type": "tool_use", "id": f"toolu_{n}", "name": entry["tool"], "input": {}}}))
        out.append(_sse("content_block_delta", {"index": index, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(entry.get("input", {}))}}))
        out.append(_sse("content_block_stop", {"index": index}))
    stop = "tool_use" if "tool" in entry else "end_turn"
    out.append(_sse("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 5}}))
    out.append(_sse("message_stop", {}))
    return out


class _Handler(ResponsesHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def do_HEAD(self):
        self.server.provider.record(self, b"")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self.server.provider.record(self, b"")
        self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not here"}})

    def do_POST(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            body = self._chunked()
        else:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        entry, n = self.server.provider.record(self, body)
        if not self.path.startswith("/v1/messages"):
            return self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
        try:
            model = json.loads(body).get("model") or "fake"
        except ValueError:
            model = "fake"
        if "status" in entry:
            status = entry["status"]
            return self._json(status, entry.get("body") or {"type": "error", "error": {
                "type": ERROR_TYPES.get(status, "api_error"), "message": f"HTTP {status}"}}, entry.get("headers"))
        if self.broken(entry, body):
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if entry.get("cut") or entry.get("stall"):
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(_start(n, model))
            if entry.get("cut"):
                self.wfile.write(_sse("content_block_start", {"index": 0, "content_block": {"type": "text"}}))
                self.wfile.write(_sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                                                    "text": "half"}}))
            self.wfile.flush()
            if entry.get("stall"):
                self.server.provider.stop.wait(entry["stall"])
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        payload = b"".join(message_events(entry, n, model))
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                self.rfile.readline()
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _json(self, status, doc, headers=None):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class FakeAnthropic(FakeProvider):
    """The OpenAI-shaped fake's server, recording and script, on Anthropic's wire."""
    handler = _Handler

    def __init__(self, script: list[dict], tls: ssl.SSLContext | None = None):
        super().__init__(script, tls=tls)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"
