#!/usr/bin/env python3
"""The model of CI's code-agent turns under systemd (.ci/code-agents.sh, issue 39): one loopback
server that speaks the three wires the pinned CLIs use — OpenAI Responses (`POST
/v1/responses`, Codex), Anthropic Messages (`POST /v1/messages`, Claude Code) and OpenAI chat
completions (`POST /v1/chat/completions`, OpenCode) — and runs one command per turn.

Stateless, so that any number of agents and turns share it: a request whose conversation holds
no tool result yet is answered with a call of the CLI's shell tool running the command the
user's prompt names (the last "Run `COMMAND`" in a user message); one that holds a result is
answered with a text quoting it ("The command printed: …"). A request that offers no tool (a
title, a quota probe) gets a short text. Every request must carry KEY (Authorization: Bearer, or
x-api-key): any other is answered 401, so a turn that completes proves the key reached the
provider through caldera. One line per request on stdout, never a header or a body (the journal
is checked for the key).

Usage: code-agents-model.py KEY-FILE URL-FILE   (listens on 127.0.0.1, any free port; the URL,
http://127.0.0.1:PORT, goes to URL-FILE). Standard library only.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMMAND = re.compile(r"Run `([^`\n]{1,500})`")
MAX_BODY = 16 * 1024 * 1024


def texts(content: Any) -> list[str]:
    """The text parts of a message's content (a string, or a list of typed blocks)."""
    if isinstance(content, str):
        return [content]
    out = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict):
            for key in ("text", "content", "output"):
                if isinstance(block.get(key), str):
                    out.append(block[key])
                elif isinstance(block.get(key), list):
                    out += texts(block[key])
    return out


def command_of(messages: list[Any]) -> str | None:
    found = [m.group(1) for msg in messages if isinstance(msg, dict) and msg.get("role") == "user"
             for text in texts(msg.get("content")) for m in COMMAND.finditer(text)]
    return found[-1] if found else None


def tool_output(wire: str, body: dict[str, Any]) -> str | None:
    """What the tool printed, when the conversation holds a tool result."""
    if wire == "responses":
        outs = [i for i in body.get("input") or [] if isinstance(i, dict) and i.get("type") == "function_call_output"]
        return "\n".join(texts([outs[-1]])) if outs else None
    if wire == "messages":
        for msg in reversed(body.get("messages") or []):
            blocks = msg.get("content") if isinstance(msg, dict) else None
            results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"] \
                if isinstance(blocks, list) else []
            if results:
                return "\n".join(texts(results))
        return None
    tools = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "tool"]
    return "\n".join(texts([tools[-1]])) if tools else None


def sse(event: str | None, doc: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(doc)}\n\n".encode()


def responses(model: str, text: str | None, command: str | None) -> bytes:
    out = [sse("response.created", {"type": "response.created", "response": {"id": "resp_1"}})]
    if command is not None:
        item = {"type": "function_call", "id": "fc_1", "call_id": f"call_{time.monotonic_ns()}",
                "name": "exec_command", "arguments": json.dumps({"cmd": command})}
    else:
        item = {"type": "message", "role": "assistant", "id": "msg_1",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
    out.append(sse("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}))
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
    out.append(sse("response.completed", {"type": "response.completed", "response": {"id": "resp_1", "usage": usage}}))
    return b"".join(out)


def anthropic_blocks(text: str | None, command: str | None) -> list[dict[str, Any]]:
    if command is not None:
        return [{"type": "tool_use", "id": f"toolu_{time.monotonic_ns()}", "name": "Bash",
                 "input": {"command": command, "description": "run the command"}}]
    return [{"type": "text", "text": text}]


def messages(model: str, text: str | None, command: str | None, stream: bool) -> tuple[str, bytes]:
    blocks = anthropic_blocks(text, command)
    stop = "tool_use" if command is not None else "end_turn"
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": blocks,
               "stop_reason": stop, "stop_sequence": None, "usage": usage}
    if not stream:
        return "application/json", json.dumps(message).encode()
    out = [sse("message_start", {"type": "message_start", "message": dict(message, content=[], stop_reason=None)})]
    block = blocks[0]
    if block["type"] == "tool_use":
        start, delta = dict(block, input={}), {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
    out.append(sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}))
    out.append(sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
    out.append(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    out.append(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": 5}}))
    out.append(sse("message_stop", {"type": "message_stop"}))
    return "text/event-stream", b"".join(out)


def chat(model: str, text: str | None, command: str | None) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(None, {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()),
                          "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    out = [chunk({"role": "assistant", "content": ""})]
    if command is not None:
        call = {"index": 0, "id": f"call_{time.monotonic_ns()}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": command, "description": "run it"})}}
        out += [chunk({"tool_calls": [call]}), chunk({}, "tool_calls")]
    else:
        out += [chunk({"content": text}), chunk({}, "stop")]
    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
             "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
    return b"".join(out) + sse(None, usage) + b"data: [DONE]\n\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    key = ""

    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.answer(200 if "/models" in self.path else 404, "application/json", b'{"object": "list", "data": []}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(length, MAX_BODY))
        path = self.path.split("?")[0]
        wire = {"/v1/responses": "responses", "/v1/messages": "messages", "/v1/chat/completions": "chat"}.get(path)
        sent = self.headers.get("x-api-key") or (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if wire is None or sent != self.key:
            print(f"POST {path}: {'unknown path' if wire is None else 'wrong or no key'} -> 401/404", flush=True)
            self.answer(404 if wire is None else 401, "application/json",
                        b'{"error": {"type": "authentication_error", "message": "invalid key"}}')
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        model = str(body.get("model") or "ci-model")
        output = tool_output(wire, body)
        command = None
        if output is None and body.get("tools"):
            history = body.get("input") if wire == "responses" else body.get("messages")
            command = command_of(history if isinstance(history, list) else [])
        if output is not None:
            text = f"The command printed: {output}"
        else:
            text = "Nothing to run." if body.get("tools") else "A title"
        print(f"POST {path} model={model}: {'tool call' if command else 'text'}", flush=True)
        if wire == "responses":
            self.answer(200, "text/event-stream", responses(model, text, command))
        elif wire == "messages":
            self.answer(200, *messages(model, text, command, bool(body.get("stream"))))
        else:
            self.answer(200, "text/event-stream", chat(model, text, command))


def main() -> None:
    key_file, url_file = sys.argv[1:3]
    Handler.key = open(key_file).read().strip()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(url_file + ".tmp", "w") as fh:
        fh.write(f"http://127.0.0.1:{server.server_address[1]}\n")
    os.replace(url_file + ".tmp", url_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
