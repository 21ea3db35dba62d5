"""Shared pieces of the plane's tests: a running plane and a tiny protocol client."""
from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import zipfile

import requests

from caldera.plane import api
from caldera.plane.server import PlaneServer
from caldera.plane.store import version_number

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


# ---- what only tests read from or write into the plane's store (the product never does) ----
# Through the store's own connection and lock (`_read`, `_tx`), so they see what it wrote.

def _rows(store, table: str, instance_id: int, last: bool):
    """A kept table's rows as {received_at, body}, oldest first; with last=True the newest or None."""
    order = "DESC LIMIT 1" if last else "ASC"
    rows = store._read(f"SELECT received_at, body FROM {table} WHERE instance_id=? ORDER BY id {order}",
                       (instance_id,))
    items = [{"received_at": r["received_at"], "body": json.loads(r["body"])} for r in rows]
    if last:
        return items[0] if items else None
    return items


def heartbeats(store, instance_id: int, last: bool = False):
    return _rows(store, "heartbeats", instance_id, last)


def inventories(store, instance_id: int) -> list[dict]:
    return _rows(store, "inventories", instance_id, last=False)


def runtime(store, instance_id: int) -> dict | None:
    """The instance's runtime_status row, its JSON columns decoded."""
    rows = store._read("SELECT * FROM runtime_status WHERE instance_id=?", (instance_id,))
    if not rows:
        return None
    item = dict(rows[0])
    for key in ("summary", "system_info", "health"):
        item[key] = None if item[key] is None else json.loads(item[key])
    return item


def skills(store, instance_id: int) -> list[dict]:
    rows = store._read("SELECT skill_key, name, content_md5, install_path, source_type, skill_version,"
                       " status, updated_at FROM instance_skills WHERE instance_id=? ORDER BY skill_key",
                       (instance_id,))
    return [dict(r) for r in rows]


def inventory(store, instance_id: int) -> dict | None:
    """The newest inventory report as received, with `skills_state`: every skill the plane knows."""
    newest = _rows(store, "inventories", instance_id, last=True)
    if newest is None:
        return None
    return {**newest["body"], "received_at": newest["received_at"], "skills_state": skills(store, instance_id)}


def uploads(store, instance_id: int) -> list[dict]:
    rows = store._read("SELECT u.*, v.data FROM uploads u LEFT JOIN skill_versions v ON v.id=u.version_id"
                       " WHERE u.instance_id=? ORDER BY u.id", (instance_id,))
    out = []
    for r in rows:
        item = dict(r)
        item["fields"] = None if item["fields"] is None else json.loads(item["fields"])
        item["skill_version"] = f"ver_{item['version_id']}"
        out.append(item)
    return out


def run_events(store, run_id: str) -> list[dict]:
    rows = store._read("SELECT event FROM run_events WHERE run_id=? ORDER BY id", (run_id,))
    return [json.loads(r["event"]) for r in rows]


def add_skill_version(store, version_id, zip_bytes: bytes, filename: str | None = None) -> int:
    """A package `GET skills/versions/ver_<n>/download` serves. Returns n."""
    number = version_number(version_id)
    with store._tx() as db:
        db.execute("INSERT OR REPLACE INTO skill_versions (id, filename, data, created_at) VALUES (?,?,?,?)",
                   (number, filename or f"skill-{number}.zip", zip_bytes, store.clock()))
    return number


def compact_json(content) -> str:
    """Go json.Marshal's bytes for a decoded value: compact, keys sorted, <>& escaped."""
    text = json.dumps(content, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def add_config_revision(store, instance_id: int, content: dict) -> int:
    """Publish a revision (ClawManager's operators do; the plane has no route for it): its
    checksum is sha256 over the compact JSON exactly as the plane serves it."""
    text = compact_json(content)
    checksum = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    with store._tx() as db:
        if not db.execute("SELECT 1 FROM instances WHERE id=?", (instance_id,)).fetchone():
            raise ValueError(f"there is no instance {instance_id}")
        number = db.execute("SELECT COALESCE(MAX(revision_no), 0) + 1 FROM config_revisions WHERE instance_id=?",
                            (instance_id,)).fetchone()[0]
        return db.execute("INSERT INTO config_revisions (instance_id, revision_no, content, checksum,"
                          " published_at) VALUES (?,?,?,?,?)",
                          (instance_id, number, text, checksum, store.clock())).lastrowid


# ---- a plane that can be told to fail (the product's PlaneServer never fails on purpose) ----

class _Fault:
    def __init__(self, method, path_regex, count, status=None, retry_after=None, body=None):
        self.method = method.upper()
        self.pattern = re.compile(path_regex)
        self.left = count
        self.status, self.retry_after, self.body = status, retry_after, body

    def matches(self, method: str, path: str) -> bool:
        return self.left > 0 and self.method in ("*", method) and bool(self.pattern.search(path))


class InjectingPlane(PlaneServer):
    """PlaneServer with faults: `inject()` answers the next matching requests with a status of
    choice (ClawManager's error envelope, or a given body), `drop()` closes the connection
    without an answer (recorded in `requests` with status 0)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._faults: list[_Fault] = []
        self._faults_lock = threading.Lock()

    def inject(self, method: str, path_regex: str, status: int, count: int = 1, retry_after=None,
               body=None) -> None:
        """Answer the next `count` requests matching (method or "*", regex searched in the path)."""
        with self._faults_lock:
            self._faults.append(_Fault(method, path_regex, count, status, retry_after, body))

    def drop(self, method: str, path_regex: str, count: int = 1) -> None:
        """Close the connection of the next `count` matching requests without answering."""
        with self._faults_lock:
            self._faults.append(_Fault(method, path_regex, count))

    def clear_faults(self) -> None:
        with self._faults_lock:
            self._faults.clear()

    def preauth(self, method, path, headers):
        """An injected fault goes before the token check."""
        with self._faults_lock:
            if any(fault.matches(method, path) for fault in self._faults):
                return None
        return super().preauth(method, path, headers)

    def handle(self, req):
        with self._faults_lock:
            fault = next((f for f in self._faults if f.matches(req.method, req.path)), None)
            if fault is not None:
                fault.left -= 1
        if fault is None:
            return super().handle(req)
        return None if fault.status is None else _fault_response(fault)


def _fault_response(fault: _Fault) -> api.Response:
    if fault.body is None:
        resp = api.error(fault.status, f"injected fault ({fault.status})")
    elif isinstance(fault.body, (bytes, str)):
        resp = api.Response(fault.status, fault.body.encode() if isinstance(fault.body, str) else fault.body)
    else:
        resp = api.Response(fault.status, json.dumps(fault.body).encode())
    if fault.retry_after is not None:
        resp.headers["Retry-After"] = str(fault.retry_after)
    return resp


# ---- fixtures (imported by the test modules: test-file basenames stay unique) ----

import pytest  # noqa: E402


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def plane(tmp_path, clock):
    server = InjectingPlane(tmp_path / "plane.db", tokens={BOOT: 1, "other-token": 2}, clock=clock).start()
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
