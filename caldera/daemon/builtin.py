"""The built-in commands of seed 004: collect_system_info and health_check."""
from __future__ import annotations

from caldera.errors import CalderaError


def _send_now(ctx) -> tuple[dict, bool]:
    """Sample, send a state report at once; (the report, whether it was delivered).

    An undelivered report does not fail the command: the result carries the same
    summary, and the reporter loop delivers a fresh report once the plane is back.
    """
    report = ctx.reports.state_report()
    try:
        ctx.client.state_report(report)
    except CalderaError:
        ctx.report_now()
        return report, False
    return report, True


def collect_system_info(ctx, payload: dict) -> dict:
    report, delivered = _send_now(ctx)
    return {"message": "system info collected", "system_info": report["system_info"],
            "metrics_collector": report["health"]["metrics_collector"], "report_delivered": delivered}


def health_check(ctx, payload: dict) -> dict:
    report, delivered = _send_now(ctx)
    health = report["health"]
    checks = {key: health.get(key) for key in ("runtime_process", "agent", "metrics_collector", "adapter")
              if key in health}
    worst = "ok" if all(v in ("ok", None) for v in checks.values()) else "degraded"
    return {"message": f"health {worst}", "health": health, "status": worst, "report_delivered": delivered,
            "openclaw_status": report["runtime"]["openclaw_status"]}
