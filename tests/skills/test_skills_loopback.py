"""Skills and revisions against a real loopback HTTP server (stdlib), through the
real client: streamed download, streamed multipart upload checked the way
ClawManager checks it, a raw revision body, and the watcher thread's inventory
delivered by the outbox sender."""
import hashlib
import io
import json
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from skills_helpers import (
    FakeRuntime,
    content_md5_mapping,
    content_md5_zip,
    multipart_fields,
    run,
    write_tree,
    zip_bytes,
)

from caldera.skills import watcher

CONTENT = b'{"mode":"none","resources":[],"schemaVersion":1,"x":"\\u003c"}'


class Plane:
    def __init__(self):
        self.uploads, self.inventories, self.archives = [], [], {}


def handler_for(plane):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status, body: bytes, ctype="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.startswith("/api/v1/agent/skills/versions/"):
                version = self.path.split("/")[-2]
                data = plane.archives.get(version)
                return self._send(200, data, "application/zip") if data else self._send(500, b'{"error":"x"}')
            if self.path == "/api/v1/agent/config/revisions/5":
                checksum = "sha256:" + hashlib.sha256(CONTENT).hexdigest()
                body = b'{"success":true,"data":{"revision":{"id":5,"revision_no":1,"checksum":"%s","content":%s}}}' % (
                    checksum.encode(), CONTENT)
                return self._send(200, body)
            self._send(404, b"")

        def do_POST(self):
            length = int(self.headers["Content-Length"])
            raw = self.rfile.read(length)
            if self.path.endswith("/skills/inventory"):
                plane.inventories.append(json.loads(raw))
                return self._send(200, b'{"success":true,"data":null}')
            if self.path.endswith("/skills/upload"):
                form = multipart_fields(raw, self.headers["Content-Type"])
                filename, data = form["file"]
                names = zipfile.ZipFile(io.BytesIO(data)).namelist()
                plane.uploads.append({"filename": filename, "md5": form["content_md5"][1].decode(),
                                      "names": names, "zip": data})
                return self._send(201, b'{"success":true,"data":{"id":1,"external_skill_id":"skill_1"}}')
            self._send(404, b"")

    return Handler


@pytest.fixture
def served(tmp_path, monkeypatch):
    plane = Plane()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(plane))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    import skills_helpers
    monkeypatch.setattr(skills_helpers, "BASE", f"http://127.0.0.1:{server.server_address[1]}")
    runtime = FakeRuntime(tmp_path)
    yield plane, runtime
    server.shutdown()
    server.server_close()


def test_install_then_collect_round_trip(served, tmp_path):
    plane, rt = served
    files = {"SKILL.md": b"# calc\n", "bin/calc.py": bytes(range(256)) * 100}
    plane.archives["ver_4"] = zip_bytes([(f"calc-src/{k}", v) for k, v in files.items()])
    expected = content_md5_mapping(files)
    result = run(rt, "install_skill", {"skill_id": "skill_4", "skill_version": "ver_4", "target_name": "calc",
                                       "content_md5": expected})
    assert result["content_md5"] == expected
    up = run(rt, "collect_skill_package", {"content_md5": expected, "identifier": "calc", "skill_id": "skill_4"})
    [upload] = plane.uploads
    assert upload["filename"] == "calc.zip" and upload["md5"] == expected
    assert sorted(upload["names"]) == ["calc/SKILL.md", "calc/bin/calc.py"]
    zpath = tmp_path / "got.zip"
    zpath.write_bytes(upload["zip"])
    assert content_md5_zip(zpath) == expected == up["content_md5"]  # what the server computes


def test_revision_over_http(served):
    plane, rt = served
    result = run(rt, "apply_config_revision", {"revision_id": 5, "snapshot_id": 1})
    assert result["current_config_revision_id"] == 5


def test_watcher_thread_inventory_reaches_the_plane(served):
    from caldera.daemon.sender import flush

    plane, rt = served
    write_tree(rt.paths.state_dir / "skills" / "hello", {"SKILL.md": "hello\n"})
    thread = threading.Thread(target=watcher.skills_loop, args=(rt.publisher, rt.wake, rt.live), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not rt.inventories() and time.monotonic() < deadline:
            rt.stop.wait(0.02)
        assert flush(rt.client, rt.outbox, rt.stop) is True
        write_tree(rt.paths.state_dir / "skills" / "second", {"SKILL.md": "2\n"})
        rt.inventory_changed()
        while len(plane.inventories) < 2 and time.monotonic() < deadline:
            rt.stop.wait(0.02)
            flush(rt.client, rt.outbox, rt.stop)
    finally:
        rt.stop.set()
        rt.inventory_wakeup.set()
        thread.join(10)
    assert not thread.is_alive()
    first, second = plane.inventories[:2]
    assert first["mode"] == "full" and first["trigger"] == "startup"
    assert [s["content_md5"] for s in first["skills"]] == ["bab02a68eaf254c164cf4d590bdd8693"]
    assert second["trigger"] == "command" and sorted(s["identifier"] for s in second["skills"]) == ["hello", "second"]
    assert rt.skill_count == 2
