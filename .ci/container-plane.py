"""The container step's control plane (.ci/container.sh): caldera's embedded plane on the
host's loopback, the one `caldera plane serve` runs, plus what the step needs of a test:

- every request it answers is appended to REQUESTS (one line: method path status), so the
  step can count the finishes the plane took for a command;
- SIGUSR1 makes it answer every finish 503 (ClawManager away, Retry-After 1) until SIGUSR2;
- ClawManager's AI gateway, faked at its path on the same port (`/api/v1/gateway/llm`, where
  the instance's CLAWMANAGER_LLM_BASE_URL points): an OpenAI-compatible chat-completions model
  that answers a request offering tools with one `bash` call (GATEWAY_COMMAND), one carrying
  that call's result with a short text, and anything else (a title) with a short text;
- a live forward proxy on PROXY-PORT (HTTP/1.0, absolute URIs; every request goes to the
  plane, whatever host it names), which appends each request's method and URL to PROXIED.

The operator verbs (`caldera plane enqueue|commands|reports|agents --db DB`) read the same
database. Usage: python3 container-plane.py DB PORT PROXY-PORT URL-FILE REQUESTS PROXIED TOKEN INSTANCE
(PORT 0: any free one; the URL file names the one it got).
"""
import http.client
import http.server
import json
import re
import signal
import sys
import threading
import urllib.parse

from caldera.host.fsutil import atomic_write_bytes
from caldera.plane import api
from caldera.plane.server import PlaneServer

FINISH = r"^/api/v1/agent/commands/\d+/finish$"
GATEWAY = "/api/v1/gateway/llm/"
# The model's command: its output (`caldera-ran-42 in /config/workspace`) is only there if it ran;
# the second line says where (the sandbox's own pid namespace makes bwrap pid 1, the container's
# caldera run otherwise).
GATEWAY_COMMAND = "echo caldera-ran-$((6*7)) in $(pwd); echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline | cut -c1-40)"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade"}


class LoggedPlane(PlaneServer):
    """The plane, each answered request also appended to a file (the step reads it from the shell),
    every finish answered 503 while `refusing` is set. (The product's PlaneServer has no fault
    injection; the tests' InjectingPlane is in tests/, which the .deb's CI does not import.)"""

    def __init__(self, log_path: str, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.log_path = log_path
        self.refusing = threading.Event()

    def preauth(self, method: str, path: str, headers: dict[str, str]) -> api.Response | None:
        return None if path.startswith(GATEWAY) else super().preauth(method, path, headers)

    def handle(self, req: api.Request) -> api.Response | None:
        if req.path.startswith(GATEWAY):
            return _gateway(req)
        if self.refusing.is_set() and req.method == "POST" and re.match(FINISH, req.path):
            resp = api.error(503, "refusing finishes (container step)")
            resp.headers["Retry-After"] = "1"
            return resp
        return super().handle(req)

    def _record(self, method: str, path: str, status: int) -> None:
        super()._record(method, path, status)
        with self._lock, open(self.log_path, "a") as fh:
            fh.write(f"{method} {path} {status}\n")


def main() -> int:
    db, port, proxy_port, url_file, requests_log, proxied_log, token, instance = sys.argv[1:9]
    plane = LoggedPlane(requests_log, db, host="127.0.0.1", port=int(port), tokens={token: int(instance)},
                        heartbeat_interval=2, poll_interval=1)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if signum == signal.SIGUSR1:
            plane.refusing.set()
        elif signum == signal.SIGUSR2:
            plane.refusing.clear()
        else:
            stop.set()

    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    proxy = _proxy(int(proxy_port), plane.port, proxied_log)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    plane.start()
    atomic_write_bytes(url_file, f"{plane.url} {proxy.server_address[1]}\n".encode(), mode=0o644)
    print(f"container plane on {plane.url}, proxy on {proxy.server_address[1]}", flush=True)
    while not stop.wait(0.5):
        pass
    proxy.shutdown()
    plane.stop()
    return 0


def _gateway(req: api.Request) -> api.Response:
    """The fake AI gateway's one route, chat completions (streamed when asked)."""
    if req.method != "POST" or not req.path.endswith("/chat/completions"):
        return api.error(404, "the fake gateway serves chat completions only")
    body = json.loads(req.body)
    messages = body.get("messages") or []
    if any(m.get("role") == "tool" for m in messages):
        delta: dict[str, object] = {"content": "The command ran."}
        finish = "stop"
    elif body.get("tools"):
        args = json.dumps({"command": GATEWAY_COMMAND, "description": "say where it runs"})
        delta = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                 "function": {"name": "bash", "arguments": args}}]}
        finish = "tool_calls"
    else:
        delta, finish = {"content": "A title"}, "stop"
    model = body.get("model") or "auto"
    if not body.get("stream"):
        message = {"role": "assistant", "content": delta.get("content")}
        if "tool_calls" in delta:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in delta["tool_calls"]]
        doc = {"id": "chatcmpl-1", "object": "chat.completion", "model": model,
               "choices": [{"index": 0, "message": message, "finish_reason": finish}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        return api.Response(200, json.dumps(doc).encode())
    chunks = [{"role": "assistant", "content": ""}, delta]
    lines = [{"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
              "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in chunks]
    lines.append({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
                  "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                  "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
    data = b"".join(b"data: " + json.dumps(line).encode() + b"\n\n" for line in lines) + b"data: [DONE]\n\n"
    return api.Response(200, data, content_type="text/event-stream")


def _proxy(port: int, plane_port: int, log_path: str) -> http.server.ThreadingHTTPServer:
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, fmt: str, *args: object) -> None:
            pass

        def relay(self) -> None:
            with lock, open(log_path, "a") as fh:
                fh.write(f"{self.command} {self.path}\n")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            target = urllib.parse.urlsplit(self.path)
            conn = http.client.HTTPConnection("127.0.0.1", plane_port, timeout=30)
            conn.request(self.command, target.path + (f"?{target.query}" if target.query else ""), body=body,
                         headers={k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP})
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for key, value in resp.getheaders():
                if key.lower() not in HOP_BY_HOP | {"content-length"}:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            conn.close()

        do_GET = do_POST = relay

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


if __name__ == "__main__":
    sys.exit(main())
