"""The built-in commands of seed 004: collect_system_info and health_check."""
from __future__ import annotations

from caldera.loops.reporter import build_report


def _send_now(ctx) -> dict:
    """Sample, send a state report at once, and return it (the result carries the same summary)."""
    report = build_report(ctx.runtime)
    ctx.runtime.client.state_report(report)
    return report


def collect_system_info(ctx, payload: dict) -> dict:
    report = _send_now(ctx)
    return {"message": "system info collected", "system_info": report["system_info"],
            "metrics_collector": report["health"]["metrics_collector"]}


def health_check(ctx, payload: dict) -> dict:
    report = _send_now(ctx)
    health = report["health"]
    checks = {key: health.get(key) for key in ("runtime_process", "agent", "metrics_collector", "adapter")
              if key in health}
    worst = "ok" if all(v in ("ok", None) for v in checks.values()) else "degraded"
    return {"message": f"health {worst}", "health": health, "status": worst,
            "openclaw_status": report["runtime"]["openclaw_status"]}
