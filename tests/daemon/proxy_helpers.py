"""A live HTTP forward proxy on loopback for the proxy tests: every request it gets (an
absolute URI, as a client sends through HTTP_PROXY) goes to one upstream, whatever host
the URI names, so a cluster DNS name that resolves nowhere here still reaches the plane.
It records (method, url) of each request; HTTP/1.0, one request per connection."""
import http.client
import http.server
import socket
import threading
import urllib.parse

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade"}


class ForwardProxy:
    def __init__(self, upstream_url: str):
        parts = urllib.parse.urlsplit(upstream_url)
        self.upstream = (parts.hostname, parts.port)
        self.seen: list[tuple[str, str]] = []
        self.headers: list[dict] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, fmt, *args):
                pass

            def _relay(self):
                proxy.seen.append((self.command, self.path))
                proxy.headers.append(dict(self.headers))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                target = urllib.parse.urlsplit(self.path)
                path = target.path + (f"?{target.query}" if target.query else "")
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                conn.request(self.command, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in HOP_BY_HOP | {"content-length"}:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = _relay

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
