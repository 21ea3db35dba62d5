"""Shared pieces of the plane's tests: a running plane and a tiny protocol client."""
from __future__ import annotations

import io
import zipfile

import requests

BOOT = "boot-secret-token"
AGENT = "caldera-1-main"


class Clock:
    """A clock the test moves by hand (Unix seconds)."""

    def __init__(self, start: float = 1_800_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Agent:
    """Protocol calls against a plane, with the session token of the last register."""

    def __init__(self, url: str, instance_id: int = 1, agent_id: str = AGENT, bootstrap: str = BOOT):
        self.base = url + "/api/v1/agent"
        self.instance_id, self.agent_id, self.bootstrap = instance_id, agent_id, bootstrap
        self.http = requests.Session()
        self.token = None

    def register(self, **overrides) -> requests.Response:
        body = {"instance_id": self.instance_id, "agent_id": self.agent_id, "agent_version": "caldera-0.1.0",
                "protocol_version": "v1", "capabilities": ["commands.poll"], "host_info": {"runtime_type": "caldera"}}
        body.update(overrides)
        resp = self.http.post(self.base + "/register", json=body, headers=self.auth(self.bootstrap))
        if resp.status_code == 200:
            self.token = resp.json()["data"]["session_token"]
        return resp

    @staticmethod
    def auth(token) -> dict:
        return {"Authorization": f"Bearer {token}"} if token else {}

    def post(self, path: str, body=None, token: str | None = None, **kw) -> requests.Response:
        return self.http.post(self.base + path, json=body, headers=self.auth(token or self.token), **kw)

    def get(self, path: str, token: str | None = None, **kw) -> requests.Response:
        return self.http.get(self.base + path, headers=self.auth(token or self.token), **kw)

    def heartbeat(self, **fields) -> requests.Response:
        return self.post("/heartbeat", {"agent_id": self.agent_id, **fields})

    def next(self) -> dict | None:
        resp = self.get("/commands/next")
        assert resp.status_code == 200, resp.text
        return resp.json()["data"]["command"]

    def start(self, command_id, **fields) -> requests.Response:
        return self.post(f"/commands/{command_id}/start", {"agent_id": self.agent_id, **fields})

    def finish(self, command_id, status="succeeded", **fields) -> requests.Response:
        return self.post(f"/commands/{command_id}/finish", {"agent_id": self.agent_id, "status": status, **fields})

    def report(self, **fields) -> requests.Response:
        body = {"agent_id": self.agent_id, "runtime": {"openclaw_status": "running", "openclaw_pid": None,
                                                     "current_config_revision_id": None}}
        body.update(fields)
        return self.post("/state/report", body)


def error_of(resp) -> str:
    doc = resp.json()
    assert doc["success"] is False and "message" not in doc, doc
    return doc["error"]


def skill_zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buf.getvalue()


# ---- fixtures (imported by the test modules: test-file basenames stay unique) ----

import pytest  # noqa: E402


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def plane(tmp_path, clock):
    from caldera.plane.server import PlaneServer

    server = PlaneServer(tmp_path / "plane.db", tokens={BOOT: 1, "other-token": 2}, clock=clock).start()
    yield server
    server.stop()


@pytest.fixture
def agent(plane):
    a = Agent(plane.url)
    assert a.register().status_code == 200
    return a
