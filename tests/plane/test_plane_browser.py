"""Headless Chromium on the pages of a plane fed by a real `caldera run` (issue 17).

The daemon reports every 2 s to a plane whose history buckets are 1 s wide, so
each bucket holds (about) one report; the test reads the state reports the plane
received, stops the daemon, lets Chromium build both pages, and checks that every
chart point sits where that report's figure puts it, that the state strip follows
the adapter's levels, and that the command history shows status, result and error
(escaped).
"""
import math

import pytest
from core_helpers import BOOT, install_agent
from daemon_helpers import Daemon, wait_for
from plane_helpers import all_points, expected_xy, read_charts
from test_plane_page import dump_dom, need_chromium

from caldera.plane import figures
from caldera.plane.server import PlaneServer

INSTANCE = 1
RANK = {"ok": 0, "off": 1, "warn": 2, "bad": 3}

# The adapter's level flips every second status call, so the strip has something to follow.
ADAPTER = r"""
import json, os, sys
verb = sys.argv[1:]
if verb == ["status"]:
    n = int(open("n").read()) if os.path.exists("n") else 0
    open("n", "w").write(str(n + 1))
    level = "warn" if (n // 2) % 2 else "ok"
    print(json.dumps({"state": {"level": level, "label": level.upper()},
                      "gauges": [{"name": "Week", "used": 0.25}], "health": [{"name": "probe", "level": "ok"}]}))
elif verb == ["pause"]:
    print(json.dumps({"message": "<b>paused</b> by the plane"}))
elif verb[:2] == ["settings", "get"]:
    print(json.dumps({"values": {}}))
elif verb[:2] == ["log", "--list"]:
    print(json.dumps({"logs": []}))
else:
    sys.exit(2)
"""


@pytest.fixture
def plane(tmp_path):
    server = PlaneServer(str(tmp_path / "plane.db"), tokens={BOOT: INSTANCE}, heartbeat_interval=1,
                         poll_interval=1, history_bucket_seconds=1).start()
    yield server
    server.stop()


def _terminal(plane, ids):
    found = {c["id"]: c for c in plane.store.commands(INSTANCE)}
    return found if all(found[i]["status"] in ("succeeded", "failed") for i in ids) else None


def test_pages_of_a_real_runtime_in_chromium(caldera_env, plane):
    need_chromium()
    config = install_agent(caldera_env, base_url=plane.url, instance_id=INSTANCE,
                           extra_env="CALDERA_REPORT_INTERVAL_SECONDS=2\n")
    (config / "adapter.py").write_text(ADAPTER)
    daemon = Daemon()
    try:
        wait_for(lambda: len(plane.store.reports(INSTANCE)) >= 2, timeout=30, what="two state reports")
        ids = [plane.store.enqueue(INSTANCE, t) for t in ("collect_system_info", "pause", "make_coffee")]
        commands = wait_for(lambda: _terminal(plane, ids), timeout=30, what="three commands finished")
        wait_for(lambda: len(plane.store.reports(INSTANCE)) >= 5, timeout=30, what="five state reports")
    finally:
        assert daemon.stop() == 0, daemon.log()[-3000:]
    reports = plane.store.reports(INSTANCE)
    for path in ("/", f"/agents/{INSTANCE}"):
        dom = dump_dom(plane.url + path)
        assert f'data-instance="{INSTANCE}" data-presence="online"' in dom
        timeline = read_charts(dom)[INSTANCE]
        for key in ("cpu", "memory", "disk"):
            want = _expected_points(timeline["charts"][key], reports, key)
            assert want, f"the reports carry no {key} figure"
            assert all_points(timeline["charts"][key], key) == [pytest.approx(p, abs=0.06) for p in want], (path, key)
        assert [s for *_, s in timeline["strips"]["level"]] == _expected_levels(reports)
        assert [s for *_, s in timeline["strips"]["presence"]] == ["online"]
    rows = _command_rows(dom)
    assert "succeeded" in rows[ids[0]] and "succeeded" in rows[ids[1]] and "failed" in rows[ids[2]]
    assert "&lt;b&gt;paused&lt;/b&gt; by the plane" in rows[ids[1]] and "<b>" not in rows[ids[1]]
    assert commands[ids[2]]["error_message"] in rows[ids[2]]
    assert all(" s</td>" in rows[i] for i in ids)  # a duration each


def _expected_points(chart: dict, reports: list, key: str) -> list:
    """A point per 1-second bucket: the mean time and the mean figure of the reports in it."""
    buckets: dict[int, list] = {}
    for r in reports:
        figs = figures.figures(r["body"].get("system_info"))
        if key in figs:
            buckets.setdefault(math.floor(r["received_at"]), []).append((r["received_at"], figs[key][0]))
    return sorted(expected_xy(chart, sum(t for t, _ in b) / len(b), sum(v for _, v in b) / len(b))
                  for b in buckets.values())


def _expected_levels(reports: list) -> list:
    """The worst level of each bucket, consecutive repeats merged (the strip draws stretches)."""
    buckets: dict[int, str] = {}
    for r in reports:
        level = figures.state_level(r["body"])
        second = math.floor(r["received_at"])
        if level and RANK[level] >= RANK.get(buckets.get(second), -1):
            buckets[second] = level
    out = []
    for _, level in sorted(buckets.items()):
        if not out or out[-1] != level:
            out.append(level)
    return out


def _command_rows(dom: str) -> dict:
    import re

    return {int(i): row for i, row in re.findall(r'<tr data-command="(\d+)">(.*?)</tr>', dom, re.S)}
