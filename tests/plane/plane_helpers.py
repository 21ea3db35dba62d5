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


# ---- a synthetic history (the charts' tests and the README's screenshot) ----

GiB = 2**30


def system_info(cpu: float, memory: float, disk: float, rx: int, tx: int, cores: int = 4) -> dict:
    """A report's system_info whose page figures are exactly cpu/memory/disk (fractions)."""
    return {"cpu": {"cores": cores, "load": {"1m": cpu * cores, "5m": 0.0, "15m": 0.0}},
            "memory": {"mem_total_bytes": 16 * GiB, "mem_available_bytes": round(16 * GiB * (1 - memory))},
            "disk": {"root_total_bytes": 200 * GiB, "root_free_bytes": round(200 * GiB * (1 - disk))},
            "network": {"interfaces": [{"name": "lo", "rx_bytes": 5, "tx_bytes": 5},
                                       {"name": "eth0", "rx_bytes": rx, "tx_bytes": tx}]}}


def feed_history(agent_: Agent, clock_: Clock, minutes: int = 120, gap=(80, 92)) -> list[dict]:
    """Two hours of reports a minute apart (heartbeats between), silent for the minutes in `gap`.

    CPU waves, memory climbs, the disk fills slowly, traffic bursts; the adapter's
    level goes ok -> warn -> bad -> off -> ok. Returns what was reported, with the plane's times.
    """
    import math

    sent, rx, tx = [], 10_000_000, 2_000_000
    for minute in range(minutes):
        if gap[0] <= minute < gap[1]:
            clock_.advance(60)
            continue
        cpu = 0.4 + 0.3 * math.sin(minute / 9.0) + 0.15 * math.sin(minute / 2.3)
        memory = 0.30 + 0.4 * minute / minutes
        disk = 0.61 + 0.05 * minute / minutes
        rx += 40_000 + (3_000_000 if minute % 30 == 7 else 0)
        tx += 15_000 + (900_000 if minute % 30 == 7 else 0)
        level = "warn" if 40 <= minute < 60 else "bad" if 60 <= minute < 66 else "off" if 66 <= minute < 70 else "ok"
        info = system_info(max(0.0, min(1.0, cpu)), memory, disk, rx, tx)
        status = {"state": {"level": level, "label": {"ok": "Ready", "warn": "Quota 85 %", "bad": "Rate limited",
                                                      "off": "Paused"}[level]},
                  "gauges": [{"name": "Weekly quota", "used": 0.2 + 0.6 * minute / minutes, "label": "of 2000 runs"}]}
        if minute == gap[1]:
            assert agent_.register().status_code == 200  # back after the outage
        health = {"runtime_process": "ok", "agent": "ok" if level == "ok" else "degraded",
                  "metrics_collector": "procfs", "metrics_sample_interval_seconds": 60}
        resp = agent_.report(system_info=info, agent_status=status, health=health)
        assert resp.status_code == 200, resp.text
        sent.append({"at": clock_(), "system_info": info, "level": level})
        for _ in range(3):
            clock_.advance(15)
            assert agent_.heartbeat().status_code == 200
        clock_.advance(15)
    return sent


# ---- reading the charts back out of a page (what Chromium's --dump-dom gives) ----

def read_charts(page_html: str) -> dict:
    """{instance: {"charts": {name: chart}, "strips": {name: [(x0, x1, state)]}}} from the SVGs.

    A chart is {"t0", "t1", "vmax", "width", "height", "series": {name: [[(x, y), ...] per line]}};
    a lone point (a <circle>) is a line of one point.
    """
    from html.parser import HTMLParser

    out: dict = {}

    class Reader(HTMLParser):
        timeline = chart = strip = None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if "data-timeline" in a:
                self.timeline = out.setdefault(int(a["data-timeline"]), {"charts": {}, "strips": {}})
            elif tag == "svg" and "data-chart" in a:
                _, _, w, h = (float(v) for v in a["viewbox"].split())
                self.chart = self.timeline["charts"][a["data-chart"]] = {
                    "t0": float(a["data-t0"]), "t1": float(a["data-t1"]), "vmax": float(a["data-vmax"]),
                    "width": w, "height": h, "series": {}}
            elif tag == "svg" and "data-strip" in a:
                self.strip = self.timeline["strips"][a["data-strip"]] = []
            elif tag == "polyline" and self.chart is not None:
                pts = [tuple(float(n) for n in p.split(",")) for p in a["points"].split()]
                self.chart["series"].setdefault(a["data-series"], []).append(pts)
            elif tag == "circle" and self.chart is not None:
                self.chart["series"].setdefault(a["data-series"], []).append([(float(a["cx"]), float(a["cy"]))])
            elif tag == "rect" and self.strip is not None and "data-state" in a:
                x, width = float(a["x"]), float(a["width"])
                self.strip.append((x, x + width, a["data-state"]))

        def handle_endtag(self, tag):
            if tag == "svg":
                self.chart = self.strip = None

    Reader().feed(page_html)
    return out


def expected_xy(chart: dict, at: float, value: float) -> tuple[float, float]:
    """Where the page must draw `value` reported at `at` (charts.py's mapping, restated)."""
    x = (at - chart["t0"]) / (chart["t1"] - chart["t0"]) * chart["width"]
    y = 2 + (1 - min(value, chart["vmax"]) / chart["vmax"]) * (chart["height"] - 4)
    return x, y


def all_points(chart: dict, series: str) -> list[tuple[float, float]]:
    return sorted(p for line in chart["series"].get(series, []) for p in line)
