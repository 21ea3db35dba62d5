"""A code-agent run's events as a person reads a turn: the one reading of each event type that
`caldera plane turn|run` print and the run page (`run_page.py`) draws.

`blocks(event)` gives an event's parts as (kind, text) pairs: `head` (a line saying what
happened: "$ make test", "assistant", "turn failed: backend-timeout"), `body` (the model's
words, a command's output), `diff`. The CLI joins them as lines; the page puts them in
elements. Every text is the model's or the agent's, never trusted: the terminal's control
characters are shown as escapes here (`terminal_safe`), the page escapes HTML itself.
"""
from __future__ import annotations

import json
from typing import Any

from caldera.host.jsonlimits import terminal_safe

Block = tuple[str, str]  # (kind, text): kind is head | body | diff | end
_SHOWN_STATUS_KEYS = ("message", "model", "attempt", "max_attempts", "cause", "reason")


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def blocks(event: dict[str, Any]) -> list[Block]:
    kind = event.get("type")
    data = _obj(event.get("data"))
    reader = _READERS.get(str(kind))
    if reader is None:
        return [("head", f"{_str(kind)}: {_str(data)}")]
    return reader(data)


def _backend_status(data: dict[str, Any]) -> list[Block]:
    said = ", ".join(f"{k} {_str(data[k])}" for k in _SHOWN_STATUS_KEYS if data.get(k) not in (None, ""))
    return [("head", f"· {_str(data.get('phase')) or 'status'}{': ' + said if said else ''}")]


def _assistant(data: dict[str, Any]) -> list[Block]:
    part = data.get("part")
    out: list[Block] = [] if isinstance(part, int) and part > 1 else [("head", "assistant")]
    out.append(("body", _str(data.get("text"))))
    if data.get("truncated"):
        out.append(("head", f"  (cut: {_str(data.get('total_bytes'))} bytes in all; the rest is in the run log)"))
    return out


def _tool_call(data: dict[str, Any]) -> list[Block]:
    status = _str(data.get("status"))
    tool = _str(data.get("tool") or data.get("name")) or "tool"
    if data.get("command"):
        what = f"$ {_str(data['command'])}"
    elif data.get("changes"):
        changes = data["changes"] if isinstance(data["changes"], list) else []
        what = f"{tool}: " + ", ".join(f"{_str(_obj(c).get('kind'))} {_str(_obj(c).get('path'))}".strip()
                                       for c in changes)
    else:
        detail = data.get("path") or data.get("query") or data.get("arguments")
        name = _str(data.get("name")) if data.get("name") and data.get("name") != tool else ""
        what = " ".join(x for x in (tool, name, _str(detail)) if x)
    reason = f" ({_str(data['reason'])})" if data.get("reason") else ""
    return [("head", f"{what}  [{status or '?'}]{reason}")]


def _command_output(data: dict[str, Any]) -> list[Block]:
    part = data.get("part")
    out: list[Block] = []
    if not (isinstance(part, int) and part > 1):
        facts = [f"exit {data['exit_code']}" if data.get("exit_code") is not None else _str(data.get("status")),
                 f"{data['duration_ms']} ms" if isinstance(data.get("duration_ms"), (int, float)) else ""]
        out.append(("head", f"$ {_str(data.get('command'))}  [{', '.join(f for f in facts if f)}]"))
    text = _str(data.get("output"))
    if text:
        out.append(("body", text))
    if data.get("truncated"):
        out.append(("head", f"  (cut: {_str(data.get('total_bytes'))} bytes in all; the rest is in the run log)"))
    return out


def _diff(data: dict[str, Any]) -> list[Block]:
    cut = " (cut; the whole diff is in the run log)" if data.get("truncated") else ""
    return [("head", f"diff, {_str(data.get('bytes'))} bytes{cut}"), ("diff", _str(data.get("diff")))]


def _error(data: dict[str, Any]) -> list[Block]:
    return [("head", f"error: {_str(data.get('failure_kind'))}: {_str(data.get('message'))}")]


def _terminal(data: dict[str, Any]) -> list[Block]:
    return [("end", end_sentence(_str(data.get("status")), data.get("failure_kind"), data.get("message")))]


_ENDINGS = {"cancelled": "was cancelled", "blocked": "was refused"}


def end_sentence(status: str, failure_kind: Any, message: Any) -> str:
    """How a run ended, plainly: "the turn completed", "the turn failed (backend-timeout): …",
    "the turn was refused: …" (blocked: the runtime did not start it)."""
    text = f"the turn {_ENDINGS.get(status, status or 'ended')}"
    if failure_kind and failure_kind != status:
        text += f" ({_str(failure_kind)})"
    if message:
        text += f": {_str(message)}"
    return text


def run_duration(run: dict[str, Any], now: float) -> str:
    return span(run["started_at"], run["ended_at"], now)


def span(begun: float | None, end: float | None, now: float) -> str:
    """How long something took ("12.5 s", "3 min 4 s"), "… so far" while it goes on, "" before it began."""
    if begun is None:
        return ""
    seconds = max(0.0, (end if end is not None else now) - begun)
    text = f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return text if end is not None else f"{text} so far"


_READERS = {"backend_status": _backend_status, "assistant_message": _assistant, "tool_call": _tool_call,
            "command_output": _command_output, "diff": _diff, "error": _error, "terminal_status": _terminal}


def text_lines(event: dict[str, Any]) -> list[str]:
    """The event as terminal lines: heads as they are, bodies and diffs indented by two spaces."""
    lines: list[str] = []
    for kind, text in blocks(event):
        safe = terminal_safe(text.rstrip("\n"))
        if kind == "body" or kind == "diff":
            lines.append("  " + safe.replace("\n", "\n  "))
        else:
            lines.append(f"── {safe}" if kind == "end" else safe)
    return lines
