"""How long ago, for people: "12 s ago", "5 min ago", "3 h ago" (logs, status, the plane's page)."""
from __future__ import annotations


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"
