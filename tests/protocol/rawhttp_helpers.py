"""A loopback TCP server that answers with whatever bytes a test scripts, for the client's
HTTP layer against answers no well-behaved server sends: short bodies, chunked bodies cut
off, connections closed mid-answer or while idle, trickles, silent TLS handshakes.

`RawServer(serve)` hands every accepted connection to `serve(sock, number)` (number 1, 2,
... in accept order) in a thread of its own; `read_request(sock)` reads one request (head
and Content-Length body) and records it in `server.requests`. `count_connections(server)`
counts the connections an http.server accepts from now on.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class RawServer:
    def __init__(self, serve: Callable[[socket.socket, int], None]):
        self.serve = serve
        self.requests: list[bytes] = []  # each request's head and body, as read
        self.connections = 0
        self.released = threading.Event()  # a script's waits end when the test is over
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._open: list[socket.socket] = []

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self._listener.close()
        for sock in self._open:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed: the test is over
            self.connections += 1
            self._open.append(sock)
            threading.Thread(target=self._run, args=(sock, self.connections), daemon=True).start()

    def _run(self, sock: socket.socket, number: int) -> None:
        try:
            self.serve(sock, number)
        except OSError:
            pass  # the client hung up: what some scripts are about
        finally:
            sock.close()

    def read_request(self, sock: socket.socket) -> bytes | None:
        """One request, or None when the client closed first."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += sock.recv(65536)
        self.requests.append(head + b"\r\n\r\n" + body)
        return head


def answer(status: int = 200, body: bytes = b'{"success":true,"data":{}}', close: bool = False) -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


def count_connections(server) -> list:
    """The connections a socketserver accepts from now on (before it serves the first)."""
    accepted: list = []
    real = server.get_request

    def counting():
        pair = real()
        accepted.append(pair)
        return pair

    server.get_request = counting
    return accepted
