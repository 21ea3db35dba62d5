"""The page's history store (per-bucket means, rates, levels, pruning) and the chart geometry."""
import pytest
from plane_helpers import Clock, system_info

from caldera.plane import charts
from caldera.plane.store import Store

MIN = 60


@pytest.fixture
def store(tmp_path):
    clock = Clock(1_800_000_000.0)  # a multiple of 60: minute buckets start here
    s = Store(tmp_path / "p.db", clock=clock, history_days=1)
    s.add_instance(1, "t1")
    s.add_instance(2, "t2")
    s.clock_ = clock
    yield s
    s.close()


def _report(store, cpu=0.5, rx=0, tx=0, level="ok", instance=1):
    body = {"agent_id": "a", "runtime": {"openclaw_status": "running"},
            "system_info": system_info(cpu, 0.5, 0.5, rx, tx),
            "agent_status": {"state": {"level": level}} if level else None}
    store.state_report(instance, body, None)


def test_a_bucket_holds_the_mean_of_its_reports_and_its_worst_level(store):
    _report(store, cpu=0.2, level="ok")
    store.clock_.advance(10)
    _report(store, cpu=0.4, level="bad")
    store.clock_.advance(10)
    _report(store, cpu=0.9, level="warn")
    store.clock_.advance(MIN)
    _report(store, cpu=0.1, level="ok")
    points = store.history_buckets(1, 0)
    assert [p["bucket"] for p in points] == [1_800_000_000, 1_800_000_060]
    assert points[0]["cpu"] == pytest.approx(0.5) and points[0]["reports"] == 3
    assert points[0]["at"] == pytest.approx(1_800_000_010)  # the mean report time
    assert points[0]["level"] == "bad" and points[1]["level"] == "ok"
    assert points[1]["cpu"] == pytest.approx(0.1)
    assert store.history_buckets(2, 0) == []  # per instance


def test_network_rate_between_reports_skips_gaps_and_counter_resets(store):
    _report(store, rx=1000, tx=100)
    store.clock_.advance(MIN)
    _report(store, rx=7000, tx=700)  # 100 B/s in, 10 B/s out
    store.clock_.advance(MIN)
    _report(store, rx=10, tx=10)  # the host rebooted: counters restarted
    store.clock_.advance(700)
    _report(store, rx=7010, tx=10)  # after more than 600 s of silence: no rate
    store.clock_.advance(MIN)
    _report(store, rx=7610, tx=70)
    rates = [(p["rx_rate"], p["tx_rate"]) for p in store.history_buckets(1, 0)]
    assert rates == [(None, None), (pytest.approx(100), pytest.approx(10)), (None, None), (None, None),
                     (pytest.approx(10), pytest.approx(1))]


def test_heartbeats_and_register_are_contacts_without_figures(store):
    store.register(1, {"agent_id": "a", "agent_version": "v", "protocol_version": "v1"}, None)
    store.clock_.advance(15)
    store.heartbeat(1, {"agent_id": "a"})
    (point,) = store.history_buckets(1, 0)
    assert point["contacts"] == 2 and point["reports"] == 0 and point["cpu"] is None
    assert point["first_at"] == 1_800_000_000 and point["last_at"] == 1_800_000_015


def test_history_is_pruned_by_age(store):
    for _ in range(3 * 24 * 60 // 10):  # three days, a report every ten minutes; one day is kept
        _report(store)
        store.clock_.advance(10 * MIN)
    _report(store)
    points = store.history_buckets(1, 0)
    assert len(points) <= 24 * 6 + 2
    assert points[0]["bucket"] >= store.clock_() - 86400 - MIN


def test_store_refuses_a_nonsense_history_size(tmp_path):
    with pytest.raises(ValueError):
        Store(tmp_path / "x.db", history_bucket_seconds=0)
    with pytest.raises(ValueError):
        Store(tmp_path / "y.db", history_days=0)


# ---- geometry --------------------------------------------------------------------------------

def _point(bucket, first=None, last=None, level=None, cpu=None):
    return {"bucket": bucket, "first_at": bucket if first is None else first,
            "last_at": bucket if last is None else last, "level": level, "cpu": cpu, "at": bucket}


def test_presence_segments_follow_the_store_thresholds():
    points = [_point(0, 0, 50), _point(60, 60, 100), _point(400, 400, 430)]
    segs = charts.presence_segments(points, now=500)
    assert segs == [(0, 145, "online"), (145, 220, "stale"), (220, 400, "offline"), (400, 475, "online"),
                    (475, 500, "stale")]


def test_level_segments_hold_until_the_next_report_unless_silent():
    points = [_point(0, level="ok"), _point(60, level="ok"), _point(120, level="warn"), _point(1000, level="ok")]
    assert charts.level_segments(points, 60, gap=180, now=1030) == [(0, 120, "ok"), (120, 180, "warn"),
                                                                   (1000, 1030, "ok")]


def test_lines_break_on_silence_and_long_windows_are_merged():
    axis = charts.Axis(0, 1000, width=100, height=40, gap=150, max_points=10)
    svg = charts.line_chart("cpu", [("cpu", [(0, 0.0), (100, 1.0), (500, 0.5)])], axis, 1.0, "cpu")
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1
    assert 'points="0.0,38.0 10.0,2.0"' in svg and 'cx="50.0" cy="20.0"' in svg
    many = [_point(t, cpu=(t % 20) / 20) for t in range(0, 1000, 2)]
    merged = charts.series(many, "cpu", axis)
    assert len(merged) == 10 and all(v == pytest.approx(0.45) for _, v in merged)


def test_a_crowded_strip_keeps_the_worst_state_per_bin():
    axis = charts.Axis(0, 100, width=30, height=10, gap=150, max_points=10)
    flapping = [(t, t + 1, "bad" if t == 55 else "ok") for t in range(0, 100)]
    svg = charts.strip("level", flapping, axis, charts.LEVEL_RANK)
    assert svg.count('data-state="bad"') == 1 and svg.count('data-state="ok"') == 2
    assert 'data-state="bad" x="15.0" y="0" width="3.0"' in svg


def test_wide_points_merge_buckets_in_the_store(store):
    for minute, cpu, level in ((0, 0.2, "ok"), (1, 0.4, "warn"), (5, 0.9, "ok"), (10, 0.3, "ok")):
        store.clock_.now = 1_800_000_000.0 + minute * MIN
        _report(store, cpu=cpu, level=level)
    merged = store.history_buckets(1, 0, step=10 * MIN)  # minutes 0-9 in one point, 10 in the next
    assert [p["bucket"] for p in merged] == [1_800_000_000, 1_800_000_600]
    first = merged[0]
    assert first["cpu"] == pytest.approx(0.5) and first["reports"] == 3 and first["level"] == "warn"
    assert first["gap"] == pytest.approx(4 * MIN)  # silent from minute 1 to minute 5
    assert first["first_at"] == 1_800_000_000 and first["last_at"] == 1_800_000_300
    segs = charts.presence_segments(merged, now=1_800_000_610)
    assert segs[0] == (1_800_000_000, 1_800_000_300, "offline")  # the merged point's worst presence
    assert store.history_buckets(1, 0, step=1) == store.history_buckets(1, 0)  # never below a bucket


def test_history_step_fits_the_kept_span_into_the_points(store):
    _report(store)
    assert store.history_step(1, 0, max_points=200) == MIN  # nothing long yet: one bucket a point
    store.clock_.advance(7 * 86400 - 1)
    assert store.history_step(1, store.clock_() - 86400, max_points=200) == 8 * MIN  # a day in 180 points
    assert store.history_step(2, 0, max_points=200) >= MIN  # no history at all
