"""The built-in commands of seed 004: collect_system_info and health_check."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.errors import CalderaError
from caldera.protocol.handlers import Call

if TYPE_CHECKING:
    import threading

    from caldera.daemon.reporter import Reports
    from caldera.protocol.client import ControlPlaneClient
    from caldera.protocol.command import Command


class BuiltinCall(Call):
    """What the built-in commands use: the client (None when not connected), the reports,
    and how to ask the reporter for a fresh report once the 2 s floor allows."""

    __slots__ = ("client", "reports", "report_soon")

    client: ControlPlaneClient | None
    reports: Reports
    report_soon: Callable[[], None]

    def __init__(self, command: Command, cancel: threading.Event, deadline: float, client: ControlPlaneClient | None,
                 reports: Reports, report_soon: Callable[[], None]) -> None:
        super().__init__(command, cancel, deadline)
        self.client = client
        self.reports = reports
        self.report_soon = report_soon


def _send_now(ctx: BuiltinCall) -> tuple[dict[str, Any], bool]:
    """The state report that answers the command: one built less than the 2 s floor ago
    (`ReportFloor.recent`: one report answers many, and the command does not wait) when no
    change (a mutating command or verb: `Wakeups.report_now`) came after it was built, else
    one sampled and sent now through the floor. (the report, whether it was delivered).

    An undelivered report does not fail the command: the result carries the same
    summary, and the reporter loop delivers a fresh report once the plane is back.
    """
    if ctx.client is None:
        return ctx.reports.state_report(), False
    recent = ctx.reports.floor.recent()
    if recent is not None:
        ctx.report_soon()  # the reporter sends a fresh one once the floor allows
        return recent
    try:
        report, _ = ctx.reports.send(ctx.client, ctx.cancel, coalesce=True)
    except CalderaError:
        ctx.report_soon()
        return ctx.reports.floor.last_body or ctx.reports.state_report(), False
    if report is None:  # cancelled while waiting for the floor
        return ctx.reports.state_report(), False
    return report, True


def collect_system_info(ctx: BuiltinCall, payload: dict[str, Any]) -> dict[str, Any]:
    report, delivered = _send_now(ctx)
    return {"message": "system info collected", "system_info": report["system_info"],
            "metrics_collector": report["health"]["metrics_collector"], "report_delivered": delivered}


def health_check(ctx: BuiltinCall, payload: dict[str, Any]) -> dict[str, Any]:
    report, delivered = _send_now(ctx)
    health = report["health"]
    checks = {key: health.get(key) for key in ("runtime_process", "agent", "metrics_collector", "adapter")
              if key in health}
    worst = "ok" if all(v in ("ok", None) for v in checks.values()) else "degraded"
    return {"message": f"health {worst}", "health": health, "status": worst, "report_delivered": delivered,
            "openclaw_status": report["runtime"]["openclaw_status"]}
