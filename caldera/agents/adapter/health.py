"""The manifest's health check as a health entry (SPEC section 7).

`health: {command: [...], interval_seconds, timeout_seconds}` runs in the
adapter's workdir with the adapter's environment (nothing of the runtime's);
exit 0 is ok, anything else (a timeout too) is bad with the reason.
"""
from __future__ import annotations

from caldera import TYPE_CHECKING
from caldera.agents.adapter import invoke

if TYPE_CHECKING:
    import threading
    from typing import Any

    from caldera.agents.manifest import Manifest

NAME = "Health check"
DEFAULT_INTERVAL = 60
REASON_MAX = 300


def interval(manifest: Manifest) -> int:
    return int((manifest.health or {}).get("interval_seconds") or DEFAULT_INTERVAL)


def check(manifest: Manifest, *, cancel: threading.Event | None = None) -> dict[str, Any]:
    """One run of the health check -> {name, level: ok|bad, reason}."""
    problem = invoke.workdir_problem(manifest.workdir)
    if problem:
        return {"name": NAME, "level": "bad", "reason": problem}
    result = invoke.run_health(manifest, cancel=cancel)
    failure = result.failure()
    said = _first_line(result.stdout) or _first_line(result.stderr)
    if failure:
        return {"name": NAME, "level": "bad", "reason": failure}
    if result.returncode == 0:
        return {"name": NAME, "level": "ok", "reason": said or "ok"}
    reason = f"exited with status {result.returncode}" + (f": {said}" if said else "")
    return {"name": NAME, "level": "bad", "reason": reason[:REASON_MAX]}


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()[:REASON_MAX]
    return ""
