"""The status pages: figures as ClawManager's frontend computes them, the charts' SVG, the per-agent
page, escaping, and both pages in headless Chromium over a synthetic two-hour history."""
import itertools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests
from plane_helpers import AGENT, agent, all_points, clock, expected_xy, feed_history, plane, read_charts  # noqa: F401

from caldera.plane import figures

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
    figs = figures.figures(SYSTEM_INFO)
    assert figs["cpu"][0] == pytest.approx(0.25)
    assert figs["memory"][0] == pytest.approx(0.25)
    assert figs["disk"][0] == pytest.approx(0.9)
    assert figs["network"] == {"interfaces": ["eth0"], "rx_bytes": 2048, "tx_bytes": 1024}
    assert figures.figures({"cpu": {"cores": 1, "load": {"1m": 3.0}}})["cpu"][0] == 1.0  # capped
    assert figures.figures(None) == {"network": None}
    assert figures.figures({"cpu": "garbage", "memory": [1], "disk": None}) == {"network": None}


def test_state_level_prefers_the_adapter_then_the_process():
    assert figures.state_level({"agent_status": {"state": {"level": "bad"}},
                                "runtime": {"openclaw_status": "running"}}) == "bad"
    assert figures.state_level({"agent_status": None, "runtime": {"openclaw_status": "stopped"}}) == "off"
    assert figures.state_level({"agent_status": {"state": {"level": "<x>"}}}) is None
    assert figures.state_level("not a dict") is None


def _report(agent_):
    resp = agent_.report(system_info=SYSTEM_INFO, agent_status=AGENT_STATUS)
    assert resp.status_code == 200


def test_page_shows_presence_figures_gauges_and_commands(plane, agent, clock):
    agent.heartbeat()
    _report(agent)
    reported_at = clock()
    clock.advance(5)
    cid = plane.store.enqueue(1, "collect_system_info")
    agent.next()
    agent.finish(cid, result={"message": "system info collected"})
    resp = requests.get(plane.url + "/")
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/html")
    text = resp.text
    assert re.search(r'data-instance="1" data-presence="online"', text)
    assert re.search(r'data-instance="2" data-presence="offline"', text)  # never registered
    assert re.search(r'data-figure="cpu">25% &middot; load 1.00 / 4 cores<', text)
    assert re.search(r'data-figure="disk">90% ', text)
    assert 'data-bar="Daily quota"' in text and "width:62.0%" in text
    assert 'data-bar="Overflow"' in text and "width:100.0%" in text  # clamped
    assert "Paused by hand" in text
    assert f'data-command="{cid}"' in text and "system info collected" in text
    assert 'href="/agents/1"' in text
    charts = read_charts(text)[1]
    assert set(charts["charts"]) == {"cpu", "memory", "disk", "network"}
    cpu = charts["charts"]["cpu"]
    assert all_points(cpu, "cpu") == [pytest.approx(expected_xy(cpu, reported_at, 0.25), abs=0.06)]
    assert [s for *_, s in charts["strips"]["level"]] == ["warn"]
    assert [s for *_, s in charts["strips"]["presence"]] == ["online"]
    assert "http://" not in text.split("<body>")[1] and "<script" not in text  # no external assets


def test_page_escapes_what_agents_send(plane, agent):
    agent.report(agent_status={"state": {"level": "ok", "label": "<img src=x onerror=alert(1)>"}},
                 health={"<b>probe</b>": "<i>down</i>"})
    cid = plane.store.enqueue(1, "pause")
    agent.next()
    agent.finish(cid, status="failed", result={"message": "<script>x()</script>"}, error_message="<em>no</em>")
    for path in ("/", "/agents/1", "/agents/caldera-1-main"):
        text = requests.get(plane.url + path).text
        assert "<img src=x" not in text and "&lt;img src=x" in text
        assert "<script" not in text and "<em>" not in text and "&lt;em&gt;no&lt;/em&gt;" in text
    assert "&lt;b&gt;probe&lt;/b&gt;" in text and "<i>" not in text


def test_agent_page_health_and_command_history(plane, agent, clock):
    agent.report(system_info=SYSTEM_INFO, agent_status=AGENT_STATUS,
                 health={"runtime_process": "ok", "metrics_collector": "procfs", "agent": "warn"})
    done = plane.store.enqueue(1, "collect_system_info")
    failed = plane.store.enqueue(1, "run_now")
    waiting = plane.store.enqueue(1, "pause")
    agent.next()
    agent.start(done)
    clock.advance(2.5)
    agent.finish(done, result={"message": "collected", "cores": 4})
    agent.next()
    agent.start(failed)
    clock.advance(75)
    agent.finish(failed, status="failed", error_message="adapter exited 2")
    plane.store.enqueue(2, "pause")  # another instance's: not on this page
    text = requests.get(plane.url + "/agents/1").text
    rows = dict(re.findall(r"<tr data-command=\"(\d+)\">(.*?)</tr>", text, re.S))
    assert set(rows) == {str(done), str(failed), str(waiting)}
    assert "succeeded" in rows[str(done)] and "<td data-duration>2.5 s</td>" in rows[str(done)]
    assert "collected" in rows[str(done)] and "&quot;cores&quot;: 4" in rows[str(done)]
    assert "<td data-duration>1 min 15 s</td>" in rows[str(failed)]
    assert '<td class="wrap error" data-error>adapter exited 2</td>' in rows[str(failed)]
    assert "pending" in rows[str(waiting)] and "<td data-duration></td>" in rows[str(waiting)]
    assert re.search(r'data-health="agent"><td>agent</td><td class="level-warn">warn</td>', text)
    assert 'data-health="metrics_collector"' in text
    assert set(read_charts(text)[1]["charts"]) == {"cpu", "memory", "disk", "network"}
    assert requests.get(plane.url + "/agents/caldera-1-main").status_code == 200
    missing = requests.get(plane.url + "/agents/99")
    assert missing.status_code == 404 and "no instance or agent" in missing.text


def test_window_narrows_the_axis(plane, agent, clock):
    sent = feed_history(agent, clock, minutes=90, gap=(99, 99))
    whole = read_charts(requests.get(plane.url + "/").text)[1]["charts"]["cpu"]
    assert whole["t0"] == pytest.approx(sent[0]["at"]) and whole["t1"] == pytest.approx(clock())
    assert len(all_points(whole, "cpu")) == 90
    hour = read_charts(requests.get(plane.url + "/agents/1?window=1h").text)[1]["charts"]["cpu"]
    assert hour["t0"] == pytest.approx(clock() - 3600)
    inside = [s for s in sent if s["at"] >= clock() - 3600]
    want = sorted(expected_xy(hour, s["at"], figures.figures(s["system_info"])["cpu"][0]) for s in inside)
    assert all_points(hour, "cpu") == [pytest.approx(p, abs=0.06) for p in want]
    bogus = read_charts(requests.get(plane.url + "/?window=bogus").text)[1]["charts"]["cpu"]
    assert bogus["t0"] == whole["t0"]  # an unknown window: all the history keeps


def test_operator_json_reads(plane, agent):
    _report(agent)
    doc = requests.get(plane.url + "/plane/api/agents").json()
    assert doc["data"]["agents"][0]["agent_id"] == AGENT
    report = requests.get(plane.url + "/plane/api/reports?instance=1").json()["data"]["report"]
    assert report["body"]["agent_id"] == AGENT
    assert requests.get(plane.url + "/plane/api/reports").status_code == 400
    assert requests.get(plane.url + "/plane/api/nothing").status_code == 404


# ---- headless Chromium ----------------------------------------------------------------------

def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def need_chromium() -> None:
    """Skip without Chromium, unless CALDERA_REQUIRE_CHROMIUM=1 (CI) makes that a failure."""
    if chromium() is None:
        if os.environ.get("CALDERA_REQUIRE_CHROMIUM") == "1":
            pytest.fail("CALDERA_REQUIRE_CHROMIUM=1 but chromium is not installed")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars"]


def run_chromium(args, timeout=90):
    with tempfile.TemporaryDirectory(prefix="plane-chromium-") as profile:
        done = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout, start_new_session=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def dump_dom(url: str) -> str:
    return run_chromium(["--dump-dom", url])


def screenshot(url: str, path: Path, size: str = "1280,1000") -> None:
    run_chromium([f"--window-size={size}", f"--screenshot={path}", url])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_history_in_headless_chromium(plane, agent, clock, tmp_path):
    """Two hours with a 12-minute outage: the DOM Chromium built draws every report where it belongs."""
    need_chromium()
    sent = feed_history(agent, clock, minutes=120, gap=(80, 92))
    cid = plane.store.enqueue(1, "collect_system_info")
    agent.next()
    agent.finish(cid, result={"message": "system info collected"})
    plane.store.enqueue(1, "pause")
    for path in ("/", "/agents/1"):
        dom = dump_dom(plane.url + path)
        assert 'data-presence="online"' in dom and 'data-bar="Weekly quota"' in dom
        timeline = read_charts(dom)[1]
        for key in ("cpu", "memory", "disk"):
            chart = timeline["charts"][key]
            want = sorted(expected_xy(chart, s["at"], figures.figures(s["system_info"])[key][0]) for s in sent)
            assert all_points(chart, key) == [pytest.approx(p, abs=0.06) for p in want], (path, key)
            assert len(chart["series"][key]) == 2  # the outage breaks the line
        _check_network(timeline["charts"]["network"], sent)
        assert [s for *_, s in timeline["strips"]["level"]] == ["ok", "warn", "bad", "off", "ok", "ok"]
        _check_presence(timeline["strips"]["presence"], timeline["charts"]["cpu"], sent)
    shot = tmp_path / "plane-status-page.png"
    screenshot(plane.url + "/", shot, size="1280,740")
    keep = os.environ.get("CALDERA_PLANE_SCREENSHOT")  # CI keeps it as an artifact; docs/ has one
    if keep:
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, keep)


def _check_network(chart: dict, sent: list) -> None:
    """In and out bytes/s between consecutive reports; none across the outage (> 600 s)."""
    rates = {"rx": [], "tx": []}
    for old, new in itertools.pairwise(sent):
        elapsed = new["at"] - old["at"]
        if elapsed > 600:
            continue
        for name, key in (("rx", "rx_bytes"), ("tx", "tx_bytes")):
            delta = (figures.figures(new["system_info"])["network"][key]
                     - figures.figures(old["system_info"])["network"][key])
            rates[name].append((new["at"], delta / elapsed))
    assert chart["vmax"] == pytest.approx(max(v for r in rates.values() for _, v in r), rel=1e-5)
    for name, values in rates.items():
        want = sorted(expected_xy(chart, at, v) for at, v in values)
        assert all_points(chart, name) == [pytest.approx(p, abs=0.06) for p in want], name


def _check_presence(strip: list, chart: dict, sent: list) -> None:
    """online, then stale 45 s after the last contact before the outage, offline from 120 s, online again."""
    assert [s for *_, s in strip] == ["online", "stale", "offline", "online"]
    last_before = max(s["at"] for s in sent if s["at"] < sent[80]["at"]) + 45  # three heartbeats follow
    x_stale = expected_xy(chart, last_before + 45, 0)[0]
    x_offline = expected_xy(chart, last_before + 120, 0)[0]
    x_back = expected_xy(chart, sent[80]["at"], 0)[0]
    assert strip[1][0] == pytest.approx(x_stale, abs=0.1) and strip[2][0] == pytest.approx(x_offline, abs=0.1)
    assert strip[3][0] == pytest.approx(x_back, abs=0.1)


def test_a_revision_older_than_the_reported_outcomes_is_not_called_not_applied_yet(plane, agent):
    """Reports carry 5 outcomes, the page lists 20 revisions: an older applied one read
    "not applied yet"."""
    revs = [plane.store.publish_revision(1, {"settings": {"n": n}}, desired=False) for n in range(8)]
    recent = [{"revision_id": r, "outcome": "applied", "reason": "settings", "via": "command"} for r in revs[2:7]]
    agent.report(system_info=SYSTEM_INFO, agent_status=AGENT_STATUS,
                 runtime={"openclaw_status": "running", "openclaw_pid": None, "current_config_revision_id": revs[6]},
                 health={"config_revisions": {"level": "ok", "last": recent[-1], "recent": recent[::-1]}})
    text = requests.get(plane.url + "/agents/1").text
    outcome = dict(re.findall(r'<tr data-revision="(\d+)" data-outcome="([^"]*)"', text))
    assert outcome[str(revs[0])] == outcome[str(revs[1])] == "no"  # "no outcome reported"
    assert outcome[str(revs[3])] == "applied" and outcome[str(revs[7])] == "not"  # "not applied yet"
    assert "no outcome reported" in text and "not applied yet" in text
