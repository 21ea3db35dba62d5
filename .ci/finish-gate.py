#!/usr/bin/env python3
"""A control plane that answers 503 to finishes while a gate file exists (issue 35).

Forwards every request to UPSTREAM (a `caldera plane serve` URL) and back, except a
`POST .../commands/ID/finish` while GATE exists: that one gets 503 and the plane's error
envelope, so the agent's finishes queue in its outbox (a line `ID STATUS` in GATE answers
STATUS to that command's finish instead: `1 500` holds command 1's finish back on a retry
record of its own). Removing GATE is the plane recovering. Each finish it turned away and
each it forwarded is one line on stdout (`503 finish ID` / `fwd finish ID STATUS USER-AGENT`),
so a test can count what reached the plane, and which caldera sent it (its User-Agent is
`caldera/VERSION`).

Used by .ci/upgrade.sh (inside the booted roots) and to make the 0.1.0 fixture state
dirs (tests/fixtures/state-0.1.0/README.md). Standard library only, loopback only.

Usage: finish-gate.py UPSTREAM-URL GATE-FILE URL-FILE   (the proxy's URL goes to URL-FILE)
"""
from __future__ import annotations

import http.client
import os
import re
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FINISH = re.compile(r"/commands/([^/]+)/finish$")
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def _gated(gate: str, command_id: str) -> int | None:
    """The status GATE answers this command's finish with, or None (forwarded)."""
    try:
        with open(gate) as fh:
            rules = dict(line.split()[:2] for line in fh if len(line.split()) >= 2)
    except FileNotFoundError:
        return None
    return int(rules.get(command_id, 503))


def main(upstream: str, gate: str, url_file: str) -> None:
    target = urllib.parse.urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # one line per finish only (below)
            pass

        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = urllib.parse.urlsplit(self.path).path
            finish = FINISH.search(path) if self.command == "POST" else None
            status = _gated(gate, finish.group(1)) if finish else None
            if finish and status:
                print(f"{status} finish {finish.group(1)}", flush=True)
                self._answer(status, b'{"success":false,"error":"finish gate: not now"}', {})
                return
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                kept = {k: v for k, v in answer.getheaders() if k.lower() not in HOP | {"content-length"}}
                if finish:
                    agent = "".join(c for c in self.headers.get("User-Agent", "-") if c.isprintable() and c != " ")
                    print(f"fwd finish {finish.group(1)} {answer.status} {agent or '-'}", flush=True)
                self._answer(answer.status, data, kept)
            except OSError as exc:
                self._answer(502, f'{{"success":false,"error":"finish gate: {type(exc).__name__}"}}'.encode(), {})
            finally:
                conn.close()

        def _answer(self, status: int, data: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if "content-type" not in {k.lower() for k in headers}:
                self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _relay

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = url_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(f"http://127.0.0.1:{server.server_address[1]}\n")
    os.replace(tmp, url_file)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.rsplit("Usage: ", 1)[1])
    main(*sys.argv[1:])
