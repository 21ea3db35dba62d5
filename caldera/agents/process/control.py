"""The control socket: how `caldera pause|resume|run-now|settings|log|status` reach the daemon
that owns the agent process (SPEC section 7b; docs/process.md, "Control socket").

`<state>/control.sock`, a unix stream socket, mode 0600 inside the 0700 state dir,
and each peer's uid (SO_PEERCRED) must be the runtime's own or root: the same
owner rules as the rest of the state dir. No network socket is opened. One
request per connection, one JSON line each way, both capped at 64 KiB:
`{"verb": "pause"}` -> `{"ok", "message", "held", …}`. A person's verb runs in
its own short-lived thread, so a graceful stop (up to stop_timeout_seconds) does
not block a `caldera status` beside it.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
from pathlib import Path

from caldera import TYPE_CHECKING
from caldera.host.jsonlimits import loads

if TYPE_CHECKING:
    from logging import Logger
    from typing import Any

    from caldera.agents.adapter.answer import Answer
    from caldera.agents.process.driver import ProcessDriver
    from caldera.redact import Redactor

SOCKET_NAME = "control.sock"
LINE_MAX = 64 * 1024
ACCEPT_POLL = 0.5
CLIENT_TIMEOUT = 330.0  # a stop may take stop_timeout_seconds (at most 300) + the KILL wait
MAX_CLIENTS = 8
ACCEPT_BACKOFF = (0.5, 1, 2, 5)  # after a failed accept (no descriptors left): short, a person waits
VERBS = ("status", "pause", "resume", "run-now", "start", "stop", "restart", "settings get", "settings set",
         "log --list", "log")


class NoDaemon(Exception):
    """No runtime is listening for this agent."""


def _short(path: Path, fd: int | None) -> str:
    # sun_path holds 108 bytes; a deep state dir is reached through its descriptor instead.
    text = str(path)
    if len(text.encode()) < 100 or fd is None:
        return text
    return f"/proc/self/fd/{fd}/{path.name}"


def answer_of(driver: ProcessDriver, request: dict[str, Any]) -> dict[str, Any]:
    """One request -> the reply object (the Answer's payload plus its data)."""
    verb, args = request.get("verb"), request.get("args") or {}
    if verb == "status":
        body, info = driver.status_body()
        return {"ok": True, "message": None, "held": [], "agent_status": body, "process": info}
    if verb not in VERBS or not isinstance(args, dict):
        return {"ok": False, "message": f"unknown verb {verb!r}", "held": []}
    answer = _act(driver, verb, args)
    reply = {**answer.payload(), "verb": answer.verb}
    if answer.data is not None and answer.ok:
        reply["data"] = answer.data
    if answer.verb == "log" and answer.ok:
        reply.update(text=answer.text, truncated=answer.truncated)
    return reply


def _act(driver: ProcessDriver, verb: str, args: dict[str, Any]) -> Answer:
    """One of VERBS but status, on the driver."""
    match verb:
        case "pause":
            return driver.pause()
        case "resume":
            return driver.resume()
        case "run-now":
            return driver.run_now()
        case "start":
            return driver.start()
        case "stop":
            return driver.stop()
        case "restart":
            return driver.restart()
        case "settings get":
            return driver.settings_get()
        case "settings set":  # anything but an object is refused as "give at least one setting"
            values = args.get("values")
            return driver.settings_set(values if isinstance(values, dict) else {})
        case "log --list":
            return driver.log_list()
        case _:  # "log"; anything but text is refused as "a log name is required"
            name = args.get("name")
            return driver.log_get(name if isinstance(name, str) else "")


class ControlServer:
    def __init__(self, driver: ProcessDriver, state_dir: str | Path, redactor: Redactor) -> None:
        import logging  # here: only the daemon's side logs; a process-mode `caldera pause` (the client) never does

        self.log: Logger = logging.getLogger("caldera.agents.process")
        self.driver, self.redactor = driver, redactor
        self.path = Path(state_dir) / SOCKET_NAME
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                os.unlink(self.path)  # stale: this runtime holds the agent's lock, no other one listens
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)
            try:
                sock.bind(_short(self.path, dir_fd))
            finally:
                os.umask(old)
        finally:
            os.close(dir_fd)
        os.chmod(self.path, 0o600)
        sock.listen(MAX_CLIENTS)
        sock.settimeout(ACCEPT_POLL)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept_loop, name="control-socket", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        sock = self._sock
        if sock is None:  # start() sets it before this thread runs
            return
        from caldera.host.loopguard import LoopGuard
        from caldera.protocol.retry import Backoff

        guard = LoopGuard(self.log, "control socket", Backoff(ACCEPT_BACKOFF))
        while not self._stop.is_set():
            try:
                self._accept_one(sock)
                guard.ok()
            except Exception as exc:  # noqa: BLE001 -- no descriptors left, no thread to start: the socket stays
                if self._stop.is_set():
                    return  # close() closed the socket under accept
                self._stop.wait(guard.failed(exc))

    def _accept_one(self, sock: socket.socket) -> None:
        """One connection, served in a thread of its own (at most MAX_CLIENTS at once)."""
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            return
        if not self._slots.acquire(blocking=False):
            conn.close()  # more than MAX_CLIENTS at once: refuse rather than queue
            return
        try:
            threading.Thread(target=self._serve, args=(conn,), name="control-client", daemon=True).start()
        except BaseException:
            conn.close()  # no thread to answer it: the person sees the connection end
            self._slots.release()
            raise

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10.0)
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
            if uid not in (os.getuid(), 0):
                _send(conn, {"ok": False, "message": "refused: not the runtime's user or root", "held": []})
                return
            try:
                request = _recv(conn)
            except ValueError as exc:  # not UTF-8, not JSON, over 64 KiB: refused with a sentence
                _send(conn, {"ok": False, "message": f"refused: {exc}", "held": []})
                return
            conn.settimeout(None)
            reply = answer_of(self.driver, request) if isinstance(request, dict) else {
                "ok": False, "message": "a request is one JSON object", "held": []}
            _send(conn, self.redactor(reply))
        except (OSError, ValueError) as exc:
            self.log.warning("control socket: %s", exc)
        except Exception as exc:  # noqa: BLE001 -- a bug answers the person instead of killing the thread
            self.log.exception("control socket request failed")
            try:
                _send(conn, {"ok": False, "message": f"internal error: {exc}", "held": []})
            except OSError:
                pass
        finally:
            conn.close()
            self._slots.release()

    def close(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        if self._thread is not None:
            self._thread.join(ACCEPT_POLL * 4)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _recv(conn: socket.socket) -> Any:
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > LINE_MAX:
            raise ValueError("request over 64 KiB")
    return loads(data.split(b"\n", 1)[0], max_bytes=LINE_MAX, what="the request")


def _send(conn: socket.socket, obj: Any) -> None:
    conn.sendall(json.dumps(obj, ensure_ascii=False).encode() + b"\n")


def call(state_dir: str | Path, verb: str, args: dict[str, Any] | None = None,
         timeout: float = CLIENT_TIMEOUT) -> Any:
    """Ask the daemon; NoDaemon when none listens on the agent's socket."""
    path = Path(state_dir) / SOCKET_NAME
    if not path.exists():
        raise NoDaemon(str(path))
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(_short(path, dir_fd))
        except (ConnectionRefusedError, FileNotFoundError):
            raise NoDaemon(str(path)) from None
        _send(sock, {"verb": verb, "args": args or {}})
        data = b""
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
            if len(data) > 8 * LINE_MAX + (1 << 20):  # a log tail (512 KiB) fits; more is not an answer
                raise ValueError("reply too large")
        return loads(data, max_bytes=len(data), what="the daemon's reply")
    finally:
        sock.close()
        os.close(dir_fd)
