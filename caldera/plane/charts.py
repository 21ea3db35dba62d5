"""Inline SVG charts of an instance's history buckets (no script, no external asset).

Every chart and strip of one instance shares one time axis, t0..t1 (t1 = now,
t0 = the oldest kept bucket inside the window), so that a CPU peak, a presence
gap and a level change line up. x = (t - t0) / (t1 - t0) * width; a fraction
v in [0, 1] is drawn at y = PAD + (1 - v / vmax) * (height - 2 PAD). The
`data-t0/-t1/-vmax` attributes carry what a reader (or a test) needs to map
points back to figures.

A line breaks where the instance went silent for longer than `gap` seconds; a
window with more buckets than `max_points` merges neighbours into means (lines)
or the worst state (strips), so a week draws as fast as an hour.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import html
from typing import Any

from caldera.plane.store import ONLINE_SECONDS, STALE_SECONDS

Segment = tuple[float, float, str]  # (start, end, state) of a strip's stretch

PAD = 2.0
MIN_SPAN = 10.0  # seconds: a fresh instance's first points still spread over the chart
PRESENCE_RANK = {"online": 0, "stale": 1, "offline": 2}
LEVEL_RANK = {"ok": 0, "off": 1, "warn": 2, "bad": 3}


@dataclasses.dataclass(frozen=True)
class Axis:
    t0: float
    t1: float
    width: int
    height: int
    gap: float  # seconds of silence that break a line
    max_points: int

    def x(self, t: float) -> float:
        return (t - self.t0) / (self.t1 - self.t0) * self.width

    def y(self, value: float, vmax: float) -> float:
        value = max(0.0, min(value, vmax))
        return PAD + (1 - value / vmax) * (self.height - 2 * PAD)

    def resized(self, width: int, height: int) -> Axis:
        return dataclasses.replace(self, width=width, height=height, max_points=max(2, width // 3))


def axis_for(points: list[dict[str, Any]], now: float, window: float, bucket_seconds: int, width: int,
             height: int) -> Axis:
    """The shared time axis: from the oldest contact inside the window (or the window's start) to now."""
    start = now - window
    firsts = [p["first_at"] for p in points]
    t0 = max(start, min(firsts)) if firsts else start
    t0 = min(t0, now - MIN_SPAN)
    return Axis(t0, now, width, height, gap=max(3.0 * bucket_seconds, STALE_SECONDS),
                max_points=max(2, width // 3))


# ---- series ------------------------------------------------------------------------------

def series(points: list[dict[str, Any]], key: str, axis: Axis) -> list[tuple[float, float]]:
    """(time, value) of the buckets holding `key`, inside the axis, merged down to `max_points`."""
    pts = [(p["at"], p[key]) for p in points
           if p.get(key) is not None and p.get("at") is not None and axis.t0 <= p["at"] <= axis.t1]
    if len(pts) <= axis.max_points:
        return pts
    width = (axis.t1 - axis.t0) / axis.max_points
    bins: dict[int, list[tuple[float, float]]] = {}
    for t, v in pts:
        bins.setdefault(min(axis.max_points - 1, int((t - axis.t0) / width)), []).append((t, v))
    return [(sum(t for t, _ in b) / len(b), sum(v for _, v in b) / len(b)) for _, b in sorted(bins.items())]


def _segments(pts: list[tuple[float, float]], gap: float) -> list[list[tuple[float, float]]]:
    out: list[list[tuple[float, float]]] = []
    for t, v in pts:
        if out and t - out[-1][-1][0] <= gap:
            out[-1].append((t, v))
        else:
            out.append([(t, v)])
    return out


def line_chart(name: str, lines: list[tuple[str, list[tuple[float, float]]]], axis: Axis, vmax: float,
               label: str) -> str:
    """One chart: a polyline per unbroken stretch of each series, a dot for a lone point."""
    vmax = vmax if vmax > 0 else 1.0
    gap = max(axis.gap, 2.5 * (axis.t1 - axis.t0) / axis.max_points)
    w, h = axis.width, axis.height
    mid = axis.y(vmax / 2, vmax)
    parts = [f'<svg class="chart" data-chart="{_e(name)}" data-t0="{axis.t0:.6f}" data-t1="{axis.t1:.6f}"'
             f' data-vmax="{vmax:.6g}" viewBox="0 0 {w} {h}" role="img" aria-label="{_e(label)}">',
             f'<rect class="plot" x="0" y="0" width="{w}" height="{h}"/>',
             f'<line class="grid" x1="0" x2="{w}" y1="{mid:.1f}" y2="{mid:.1f}"/>']
    for series_name, pts in lines:
        for seg in _segments(pts, gap):
            coords = [(axis.x(t), axis.y(v, vmax)) for t, v in seg]
            if len(coords) == 1:
                parts.append(f'<circle class="dot s-{_e(series_name)}" data-series="{_e(series_name)}"'
                             f' cx="{coords[0][0]:.1f}" cy="{coords[0][1]:.1f}" r="2"/>')
            else:
                text = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
                parts.append(f'<polyline class="line s-{_e(series_name)}" data-series="{_e(series_name)}"'
                             f' points="{text}"/>')
    parts.append("</svg>")
    return "".join(parts)


# ---- strips ------------------------------------------------------------------------------

def presence_segments(points: list[dict[str, Any]], now: float) -> list[Segment]:
    """Presence over time from the contact times, with the store's thresholds (online <= 45 s ...)."""
    out: list[Segment] = []
    for i, p in enumerate(points):
        last = p["last_at"]
        following = points[i + 1]["first_at"] if i + 1 < len(points) else now
        gap = p.get("gap") or 0  # a merged point that was silent inside: its worst state, all over it
        inside = "offline" if gap > STALE_SECONDS else "stale" if gap > ONLINE_SECONDS else "online"
        _add(out, p["first_at"], min(last, following), inside)
        _add(out, min(last, following), min(last + ONLINE_SECONDS, following), "online")
        if following > last + ONLINE_SECONDS:
            _add(out, last + ONLINE_SECONDS, min(last + STALE_SECONDS, following), "stale")
        if following > last + STALE_SECONDS:
            _add(out, last + STALE_SECONDS, following, "offline")
    return out


def level_segments(points: list[dict[str, Any]], bucket_seconds: int, gap: float, now: float) -> list[Segment]:
    """Each bucket's worst state level, held until the next report unless the instance went silent."""
    levelled = [p for p in points if p.get("level")]
    out: list[Segment] = []
    held_until: float | None = None
    for i, p in enumerate(levelled):
        # a stretch held from the previous report starts at the bucket; a fresh one at the first contact
        start = p["bucket"] if held_until == p["bucket"] else max(p["bucket"], p["first_at"])
        end = min(p["bucket"] + bucket_seconds, now)
        if i + 1 < len(levelled) and levelled[i + 1]["bucket"] - end <= gap:
            end = levelled[i + 1]["bucket"]
        _add(out, start, end, p["level"])
        held_until = end
    return out


def _add(out: list[Segment], start: float, end: float, state: str) -> None:
    if end <= start:
        return
    if out and out[-1][2] == state and abs(out[-1][1] - start) < 1e-6:
        out[-1] = (out[-1][0], end, state)
    else:
        out.append((start, end, state))


def strip(name: str, segments: list[Segment], axis: Axis, rank: dict[str, int]) -> str:
    """A coloured band: one rect per stretch in one state (class `st-<state>`), a tooltip each."""
    clipped = [(max(s, axis.t0), min(e, axis.t1), state) for s, e, state in segments if e > axis.t0 and s < axis.t1]
    clipped = _merge_down(clipped, axis, rank)
    parts = [f'<svg class="strip" data-strip="{_e(name)}" data-t0="{axis.t0:.6f}" data-t1="{axis.t1:.6f}"'
             f' viewBox="0 0 {axis.width} {axis.height}" role="img" aria-label="{_e(name)} over time">',
             f'<rect class="plot" x="0" y="0" width="{axis.width}" height="{axis.height}"/>']
    for start, end, state in clipped:
        x0, x1 = axis.x(start), axis.x(end)
        parts.append(f'<rect class="st-{_e(state)}" data-state="{_e(state)}" x="{x0:.1f}" y="0"'
                     f' width="{max(0.5, x1 - x0):.1f}" height="{axis.height}">'
                     f'<title>{_e(state)} {clock_label(start)} to {clock_label(end)}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


def _merge_down(segments: list[Segment], axis: Axis, rank: dict[str, int]) -> list[Segment]:
    """More stretches than the strip has room for: one per bin, in the worst state of the bin."""
    if len(segments) <= axis.max_points:
        return segments
    width = (axis.t1 - axis.t0) / axis.max_points
    worst: dict[int, str] = {}
    for start, end, state in segments:
        first = int((start - axis.t0) / width)
        last = min(axis.max_points - 1, int((end - axis.t0) / width - 1e-9))
        for b in range(first, last + 1):
            if rank.get(state, 0) >= (rank.get(worst[b], -1) if b in worst else -1):
                worst[b] = state
    out: list[Segment] = []
    for b, state in sorted(worst.items()):
        _add(out, axis.t0 + b * width, axis.t0 + (b + 1) * width, state)
    return out


# ---- time labels ---------------------------------------------------------------------------

def clock_label(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%H:%M:%S")


def ticks(axis: Axis, count: int = 5) -> list[tuple[float, str]]:
    """(percent from the left, UTC label) for evenly spaced ticks; dates once the span passes a day."""
    span = axis.t1 - axis.t0
    fmt = "%b %d %H:%M" if span > 86400 else "%H:%M" if span > 600 else "%H:%M:%S"
    out = []
    for i in range(count):
        t = axis.t0 + span * i / (count - 1)
        out.append((100.0 * i / (count - 1), dt.datetime.fromtimestamp(t, dt.UTC).strftime(fmt)))
    return out


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))
