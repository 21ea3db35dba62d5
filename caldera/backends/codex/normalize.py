"""Codex app-server notifications -> the standard events (SPEC section 10).

Rules taken from what Codex 0.169.0 sends (codex-notes sections 4 and 9):
- `error{willRetry:true}` is progress (a `backend_status` "retrying"), never terminal;
  only `turn/completed` (or the process dying) ends a turn.
- Command output comes from `item/completed.aggregatedOutput`: the deltas can miss
  the first chunk. Deltas are kept (capped) only to close an interrupted command.
- `turn/diff/updated` repeats the full diff; the latest one is sent once, capped, at the end.
- On interrupt, in-flight items never complete: they are closed here at the end.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from caldera.backends import failures as fk
from caldera.backends.events import cut_utf8

if TYPE_CHECKING:
    from caldera.backends.events import EventSink

Params = dict[str, Any]  # a notification's params (an object; {} when absent or not one)
Handler = Callable[[Params], None]

ASSISTANT_MAX_PARTS = 8  # 64 KiB of assistant text in events; the rest is in the run log
OUTPUT_MAX_PARTS = 4  # 32 KiB of one command's output
DELTA_KEEP_BYTES = 32 * 1024
TURN_STATUSES = {"completed": "completed", "interrupted": "cancelled", "failed": "failed"}
_IDLE = "idle timeout"  # Codex's words for a stream silent past its stream_idle_timeout_ms
_TOOL_ITEMS = {"commandExecution": "command", "fileChange": "file_change", "mcpToolCall": "mcp",
               "dynamicToolCall": "dynamic", "webSearch": "web_search", "collabAgentToolCall": "agent",
               "imageView": "image_view"}


class Normalizer:
    def __init__(self, sink: EventSink, stall_seconds: int = 0):
        self.sink = sink
        self.stall_seconds = stall_seconds  # Codex's stream_idle_timeout: a stall ends the turn, unretried
        self.open_items: dict[Any, dict[str, Any]] = {}  # item id -> the item as it started
        # item id -> [bytes kept, delta, delta, …]: a command's output seen before it completes
        self.deltas: dict[Any, list[Any]] = {}
        self.diff: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error_emitted = False
        self.last_error: dict[str, Any] | None = None
        self.retries = 0  # Codex's stream retries announced since the provider's last answer
        self._handlers: dict[str, Handler] = {
            "configWarning": self._config_warning,
            "warning": self._warning,
            "turn/started": self._turn_started,
            "item/started": self._item_started,
            "item/completed": self._item_completed,
            "item/commandExecution/outputDelta": self._output_delta,
            "turn/diff/updated": self._diff,
            "thread/tokenUsage/updated": self._usage,
            "error": self._error,
        }
        # handler_for(method): the function that takes `method`'s params (a dict), or None
        # (nothing to normalise). The dict's own get: no Python frame on every stdout line.
        self.handler_for: Callable[[str], Handler | None] = self._handlers.get

    # -- notifications ------------------------------------------------------

    def _config_warning(self, p: Params) -> None:
        self.sink.emit("backend_status", {"phase": "warning", "message": str(p.get("summary") or "")})

    def _warning(self, p: Params) -> None:
        self.sink.emit("backend_status", {"phase": "warning", "message": str(p.get("message") or "")})

    def _turn_started(self, p: Params) -> None:
        turn = p.get("turn") or {}
        self.sink.emit("backend_status", {"phase": "turn_started", "turn_id": turn.get("id")})

    def _item_started(self, p: Params) -> None:
        item = p.get("item")
        if not isinstance(item, dict) or not item.get("id"):
            return
        kind = item.get("type")
        if kind in _TOOL_ITEMS or kind == "agentMessage":
            self.open_items[item["id"]] = item
        if kind in _TOOL_ITEMS:
            self.sink.emit("tool_call", self._tool_summary(item, "started"))

    def _item_completed(self, p: Params) -> None:
        self.retries = 0  # the provider answered: the tries a failure names are those in a row
        item = p.get("item")
        if not isinstance(item, dict):
            return
        self.open_items.pop(item.get("id"), None)
        self.deltas.pop(item.get("id"), None)
        kind = item.get("type")
        if kind == "agentMessage":
            self.sink.text_events("assistant_message", {"item_id": item.get("id")}, "text",
                                  str(item.get("text") or ""), ASSISTANT_MAX_PARTS)
        elif kind == "commandExecution":
            self._command_output(item, str(item.get("status") or "completed"),
                                 str(item.get("aggregatedOutput") or ""))
        elif kind in _TOOL_ITEMS:
            self.sink.emit("tool_call", self._tool_summary(item, str(item.get("status") or "completed")))

    def _output_delta(self, p: Params) -> None:
        item_id = p.get("itemId")
        if item_id not in self.open_items:
            return
        parts = self.deltas.get(item_id)
        if parts is None:
            parts = self.deltas[item_id] = [0]
        if parts[0] < DELTA_KEEP_BYTES:
            delta = p.get("delta")
            delta = delta if type(delta) is str else str(delta or "")
            parts.append(delta)
            parts[0] += len(delta)

    def _diff(self, p: Params) -> None:
        if isinstance(p.get("diff"), str):
            self.diff = p["diff"]

    def _usage(self, p: Params) -> None:
        usage = p.get("tokenUsage")
        if isinstance(usage, dict) and isinstance(usage.get("total"), dict):
            self.usage = usage["total"]

    def _error(self, p: Params) -> None:
        raw = p.get("error")
        error: dict[str, Any] = raw if isinstance(raw, dict) else {"message": str(raw)}
        kind = fk.classify_turn_error(error)
        if p.get("willRetry"):
            if self.stall_seconds and _IDLE in f"{error.get('message')} {error.get('additionalDetails')}":
                # Codex would wait the same silence again for each retry: 3 x 60 s by default
                raise fk.BackendFailure(fk.PROVIDER_UNAVAILABLE, fk.stalled(self.stall_seconds))
            self.retries += 1
            attempt, most = fk.retry_attempt(error.get("message"))
            self.sink.emit("backend_status", {
                "phase": "retrying", "attempt": attempt or self.retries, "max_attempts": most,
                "message": str(error.get("message") or ""), "cause": kind,
                "details": error.get("additionalDetails")})
            return
        self.last_error = error
        self.emit_error(kind, error)

    # -- summaries ----------------------------------------------------------

    def _tool_summary(self, item: dict[str, Any], status: str) -> dict[str, Any]:
        kind: Any = item.get("type")
        data: dict[str, Any] = {"item_id": item.get("id"), "tool": _TOOL_ITEMS.get(kind, kind), "status": status}
        if kind == "commandExecution":
            data.update(command=_short(item.get("command")), cwd=item.get("cwd"))
        elif kind == "fileChange":
            data["changes"] = [{"path": c.get("path"), "kind": (c.get("kind") or {}).get("type")}
                               for c in (item.get("changes") or [])[:50] if isinstance(c, dict)]
        elif kind in ("mcpToolCall", "dynamicToolCall"):
            data.update(server=item.get("server"), name=item.get("tool"),
                        arguments=_short(item.get("arguments")))
        elif kind == "webSearch":
            data["query"] = _short(item.get("query"))
        return data

    def _command_output(self, item: dict[str, Any], status: str, output: str) -> None:
        base = {"item_id": item.get("id"), "command": _short(item.get("command")), "status": status,
                "exit_code": item.get("exitCode"), "duration_ms": item.get("durationMs")}
        self.sink.text_events("command_output", base, "output", output, OUTPUT_MAX_PARTS)

    def emit_error(self, kind: str, error: dict[str, Any] | None, message: str | None = None) -> None:
        error = error or {}
        data: dict[str, Any] = {"failure_kind": kind, "message": message or str(error.get("message") or kind)}
        if kind in fk.PROVIDER_KINDS:  # the stream attempts Codex announced, and the last
            data["tries"] = self.retries + 1
            data["message"] = fk.with_tries(kind, data["message"], self.retries + 1)
        if error.get("codexErrorInfo") is not None:
            data["codex_error_info"] = error["codexErrorInfo"]
        if error.get("additionalDetails"):
            data["details"] = _short(error["additionalDetails"])
        self.error_emitted = True
        self.sink.emit("error", data)

    # -- the end ------------------------------------------------------------

    def outcome(self, params: Any) -> tuple[str, str | None, str | None]:
        """(status, failure_kind, message) from `turn/completed`; BackendFailure if it is malformed."""
        turn = params.get("turn") if isinstance(params, dict) else None
        if not isinstance(turn, dict):
            turn = {}
        status = turn.get("status")
        if status not in TURN_STATUSES:
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID,
                                    f"turn/completed without a valid turn.status (got {status!r})")
        if status == "completed":
            return "completed", None, None
        if status == "interrupted":
            return "cancelled", fk.CANCELLED, "the turn was interrupted"
        error = turn.get("error") if isinstance(turn.get("error"), dict) else self.last_error
        message = str((error or {}).get("message") or "the turn failed")
        return "failed", fk.classify_turn_error(error), message

    def finish(self, status: str, kind: str | None, message: str | None, extra: dict[str, Any] | None = None) -> None:
        """Close open items, send the latest diff, the error if not yet sent, then terminal_status."""
        for item_id, item in list(self.open_items.items()):
            if item.get("type") == "commandExecution":
                kept = "".join(self.deltas.get(item_id, [0])[1:])
                self._command_output(item, "incomplete", kept)
            elif item.get("type") in _TOOL_ITEMS:
                self.sink.emit("tool_call", self._tool_summary(item, "incomplete"))
        self.open_items.clear()
        if self.diff:
            self.sink.diff(self.diff)
        if status == "failed" and not self.error_emitted:
            self.emit_error(kind or fk.BACKEND_FAILED, self.last_error if kind is None else None, message)
        data: dict[str, Any] = {"status": status, "failure_kind": kind if status != "completed" else None}
        if message and status != "completed":
            data["message"] = fk.with_tries(kind, message, self.retries + 1)
        if self.usage:
            data["usage"] = {k: v for k, v in self.usage.items() if isinstance(v, int)}
        data.update(extra or {})
        self.sink.emit("terminal_status", data)


def _short(value: Any, limit: int = 2048) -> str | None:
    """A summary field: strings (or lists joined) cut to 2 KiB."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = " ".join(str(v) for v in value)
    elif not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, default=str)
    text, cut = cut_utf8(value, limit)
    return text + "…" if cut else text
