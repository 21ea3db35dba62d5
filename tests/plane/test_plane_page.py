"""The status page: figures as ClawManager's frontend computes them, bars, and a headless Chromium load."""
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests

from caldera.plane import page
from plane_helpers import AGENT, agent, clock, plane  # noqa: F401

SYSTEM_INFO = {
    "cpu": {"cores": 4, "load": {"1m": 1.0, "5m": 0.5, "15m": 0.2}},
    "memory": {"mem_total_bytes": 8 * 2**30, "mem_available_bytes": 6 * 2**30},
    "disk": {"root_total_bytes": 100 * 2**30, "root_free_bytes": 10 * 2**30},
    "network": {"interfaces": [{"name": "lo", "rx_bytes": 999, "tx_bytes": 999},
                               {"name": "eth0", "rx_bytes": 2048, "tx_bytes": 1024, "status": "up"}]},
}
AGENT_STATUS = {"state": {"level": "warn", "label": "Paused by hand"},
                "gauges": [{"name": "Daily quota", "used": 0.62, "label": "62 of 100 runs"},
                           {"name": "Overflow", "used": 1.7}]}


def test_figures_follow_the_frontend_formulas():
    figs = page.figures(SYSTEM_INFO)
    assert figs["cpu"][0] == pytest.approx(0.25)
    assert figs["memory"][0] == pytest.approx(0.25)
    assert figs["disk"][0] == pytest.approx(0.9)
    assert figs["network"] == {"interfaces": ["eth0"], "rx_bytes": 2048, "tx_bytes": 1024}
    assert page.figures({"cpu": {"cores": 1, "load": {"1m": 3.0}}})["cpu"][0] == 1.0  # capped
    assert page.figures(None) == {"network": None}


def _report(agent_):
    resp = agent_.report(system_info=SYSTEM_INFO, agent_status=AGENT_STATUS)
    assert resp.status_code == 200


def test_page_shows_presence_figures_gauges_and_commands(plane, agent):
    agent.heartbeat()
    _report(agent)
    cid = plane.store.enqueue(1, "collect_system_info")
    agent.next()
    agent.finish(cid, result={"message": "system info collected"})
    resp = requests.get(plane.url + "/")
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/html")
    text = resp.text
    assert re.search(r'data-instance="1" data-presence="online"', text)
    assert re.search(r'data-instance="2" data-presence="offline"', text)  # never registered
    assert 'data-bar="CPU"' in text and "width:25.0%" in text
    assert 'data-bar="Disk"' in text and "width:90.0%" in text
    assert 'data-bar="Daily quota"' in text and "width:62.0%" in text
    assert 'data-bar="Overflow"' in text and "width:100.0%" in text  # clamped
    assert "Paused by hand" in text and "rx 2.0 KiB" in text
    assert f'data-command="{cid}"' in text and "system info collected" in text
    assert "http://" not in text.split("<body>")[1] and "<script" not in text  # no external assets


def test_page_escapes_what_agents_send(plane, agent):
    agent.report(agent_status={"state": {"level": "ok", "label": "<img src=x onerror=alert(1)>"}})
    text = requests.get(plane.url + "/").text
    assert "<img src=x" not in text and "&lt;img src=x" in text


def test_operator_json_reads(plane, agent):
    _report(agent)
    doc = requests.get(plane.url + "/plane/api/agents").json()
    assert doc["data"]["agents"][0]["agent_id"] == AGENT
    assert requests.get(plane.url + "/plane/api/reports?instance=1").json()["data"]["report"]["body"]["agent_id"] == AGENT
    assert requests.get(plane.url + "/plane/api/reports").status_code == 400
    assert requests.get(plane.url + "/plane/api/nothing").status_code == 404


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars"]


def _run_chromium(args, timeout=90):
    with tempfile.TemporaryDirectory(prefix="plane-chromium-") as profile:
        return subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout, start_new_session=True)


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_page_in_headless_chromium(plane, agent, tmp_path):
    agent.heartbeat()
    _report(agent)
    plane.store.enqueue(1, "pause")
    done = _run_chromium(["--dump-dom", plane.url + "/"])
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-presence="online"' in dom and 'data-bar="Daily quota"' in dom and "pause" in dom
    shot = tmp_path / "plane-status-page.png"
    done = _run_chromium(["--window-size=1200,900", f"--screenshot={shot}", plane.url + "/"])
    assert done.returncode == 0 and shot.stat().st_size > 5000, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep = os.environ.get("CALDERA_PLANE_SCREENSHOT")  # CI keeps it as an artifact
    if keep:
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, keep)
