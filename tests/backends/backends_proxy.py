"""A live HTTP proxy on loopback that speaks CONNECT, and a throwaway TLS certificate,
for the tests of the Claude Code forwarder behind HTTPS_PROXY.

`ConnectProxy(port)` records every CONNECT (its target and headers) and tunnels it to
127.0.0.1:port whatever host it names (a name that resolves nowhere here still reaches the
local provider), keeping the bytes the client sent through the tunnel for the leak checks;
any other request is recorded and answered 502. `tls_certificate(dir, host)` writes a
self-signed certificate for `host` (openssl) and returns (cert, key) paths: trusted by
a client once SSL_CERT_FILE names the cert.
"""
from __future__ import annotations

import select
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# What requests reads to choose a proxy (and REQUEST_METHOD, which makes it ignore HTTP_PROXY).
PROXIES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
           "NO_PROXY", "REQUEST_METHOD")


def tls_certificate(directory: Path, host: str) -> tuple[Path, Path]:
    cert, key = directory / f"{host}.crt", directory / f"{host}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", f"/CN={host}", "-addext", f"subjectAltName=DNS:{host}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


class ConnectProxy:
    def __init__(self, target_port: int):
        self.target_port = target_port
        self.connects: list[tuple[str, dict[str, str]]] = []
        self.others: list[tuple[str, str]] = []
        self.sent = bytearray()  # what clients sent inside the tunnels
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_CONNECT(self):
                with proxy.lock:
                    proxy.connects.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                upstream = socket.create_connection(("127.0.0.1", proxy.target_port), timeout=30)
                self.send_response(200, "Connection established")
                self.end_headers()
                self.wfile.flush()
                proxy.pump(self.connection, upstream)
                self.close_connection = True

            def _other(self):
                with proxy.lock:
                    proxy.others.append((self.command, self.path))
                self.send_response(502)
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

            do_GET = do_POST = do_HEAD = _other

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Bytes both ways until either side closes."""
        try:
            while True:
                ready, _, _ = select.select([client, upstream], [], [], 30)
                if not ready:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        with self.lock:
                            self.sent += data
                        upstream.sendall(data)
                    else:
                        client.sendall(data)
        except OSError:
            return
        finally:
            upstream.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
