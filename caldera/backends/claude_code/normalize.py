"""Claude Code's stream-json messages -> the standard events (SPEC section 10), and its
failures -> failureKinds.

Rules from what Claude Code 2.1.332 sends (code-agents-notes.md, and measured here):
- `assistant` holds whole messages: its `text` blocks are the assistant_message (the
  deltas joined by the CLI), its `tool_use` blocks open a tool_call; an `assistant` with
  `is_api_error_message` is the provider's error told as text, not the model's answer.
- `user` carries the `tool_result` that closes a tool: Bash's becomes command_output
  (bounded), the others a tool_call completed/failed.
- `system/api_retry` is progress (backend_status "retrying"), never terminal;
  `system/permission_denied` is a tool_call "denied" (the policy said no).
- Only `result` ends a turn. Its `subtype` is "success" even for a provider failure:
  `is_error` and `api_error_status` tell. Status code wins over text.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from caldera.backends import failures as fk
from caldera.backends.events import short_text as _short

if TYPE_CHECKING:
    from caldera.backends.events import EventSink

Message = dict[str, Any]
ASSISTANT_MAX_PARTS = 8  # 64 KiB of assistant text in events; the rest is in the run log
OUTPUT_MAX_PARTS = 4  # 32 KiB of one command's output
TOOL_KINDS = {"Bash": "command", "Edit": "file_change", "Write": "file_change", "NotebookEdit": "file_change",
              "Read": "read", "WebFetch": "web_fetch", "WebSearch": "web_search"}
_ERROR_KINDS = {"authentication_failed": fk.PROVIDER_AUTH_FAILED, "authentication_error": fk.PROVIDER_AUTH_FAILED,
                "permission_error": fk.PROVIDER_AUTH_FAILED, "rate_limit": fk.PROVIDER_RATE_LIMITED,
                "rate_limit_error": fk.PROVIDER_RATE_LIMITED, "billing_error": fk.PROVIDER_RATE_LIMITED,
                "server_error": fk.PROVIDER_UNAVAILABLE, "overloaded": fk.PROVIDER_UNAVAILABLE,
                "overloaded_error": fk.PROVIDER_UNAVAILABLE, "api_error": fk.PROVIDER_UNAVAILABLE}
# No status: a cut or refused connection is only told in words.
_UNAVAILABLE_TEXT = re.compile(
    r"(?i)stream_?truncated|empty or malformed response|econnrefused|econnreset|socket hang up|"
    r"connection (?:error|refused|reset|closed)|timed? ?out|unable to connect|network error|fetch failed")
_EXIT_CODE = re.compile(r"^Exit code (\d+)\n")


def classify(status: Any, error_type: Any, text: str) -> str:
    """failureKind of a provider error: the HTTP status first, then the CLI's error name, then words."""
    if isinstance(status, int) and not isinstance(status, bool):
        if status in (401, 403):
            return fk.PROVIDER_AUTH_FAILED
        if status == 429:
            return fk.PROVIDER_RATE_LIMITED
        if 500 <= status <= 599:  # 529 "overloaded" included
            return fk.PROVIDER_UNAVAILABLE
        return fk.BACKEND_FAILED
    if isinstance(error_type, str) and error_type in _ERROR_KINDS:
        return _ERROR_KINDS[error_type]
    if _UNAVAILABLE_TEXT.search(text or ""):
        return fk.PROVIDER_UNAVAILABLE
    return fk.classify_turn_error({"message": text})  # the shared words (401 text, quota, …)


class Normalizer:
    def __init__(self, sink: EventSink):
        self.sink = sink
        self.open_tools: dict[str, Message] = {}  # tool_use id -> the block
        self.usage: dict[str, int] | None = None
        self.api_error: Message | None = None  # the last provider error told in an `assistant`
        self.retries = 0  # the CLI's retries since the provider's last answer
        self.session: Message = {}

    def handle(self, msg: Message) -> Message | None:
        """One message; the `result` message when it comes (the turn's end)."""
        kind = msg.get("type")
        if kind == "result":
            return msg
        if kind == "assistant":
            self._assistant(msg)
        elif kind == "user":
            self._user(msg)
        elif kind == "system":
            self._system(msg)
        return None

    # -- messages -----------------------------------------------------------

    def _message(self, msg: Message) -> Message:
        inner = msg.get("message")
        if not isinstance(inner, dict) or not isinstance(inner.get("content"), (list, str)):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID,
                                    f"a stream-json {msg.get('type')} message without message.content")
        return inner

    def _assistant(self, msg: Message) -> None:
        inner = self._message(msg)
        content = inner["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if msg.get("is_api_error_message") or msg.get("error"):
            text = " ".join(str(b.get("text") or "") for b in blocks if isinstance(b, dict))
            self.api_error = {"status": msg.get("api_error_status"),
                              "type": msg.get("api_error_type") or msg.get("error"), "message": text}
            return
        self.retries = 0  # the provider answered: the tries a failure names are those in a row
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and str(block.get("text") or "").strip():
                self.sink.text_events("assistant_message", {"item_id": inner.get("id")}, "text",
                                      str(block["text"]), ASSISTANT_MAX_PARTS)
            elif block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                self.open_tools[block["id"]] = block
                self.sink.emit("tool_call", self._tool_summary(block, "started"))

    def _user(self, msg: Message) -> None:
        inner = self._message(msg)
        if not isinstance(inner["content"], list):
            return
        for block in inner["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                self._tool_result(block)

    def _tool_result(self, block: Message) -> None:
        tool = self.open_tools.pop(str(block.get("tool_use_id")), None)
        if tool is None:
            return  # a denial's result (told by system/permission_denied) or an unknown tool
        failed = block.get("is_error") is True
        output = _text(block.get("content"))
        if tool.get("name") == "Bash":
            code = _EXIT_CODE.match(output)
            self.sink.text_events("command_output", {
                "item_id": tool["id"], "command": _short((tool.get("input") or {}).get("command")),
                "status": "failed" if failed else "completed",
                "exit_code": int(code.group(1)) if code else (None if failed else 0)}, "output", output,
                OUTPUT_MAX_PARTS)
        else:
            self.sink.emit("tool_call", self._tool_summary(tool, "failed" if failed else "completed"))

    def _system(self, msg: Message) -> None:
        sub = msg.get("subtype")
        if sub == "init":
            self.session = msg
            self.sink.emit("backend_status", {
                "phase": "session_started", "session_id": msg.get("session_id"), "model": msg.get("model"),
                "tools": msg.get("tools") if isinstance(msg.get("tools"), list) else None,
                "permission_mode": msg.get("permissionMode"), "version": msg.get("claude_code_version")})
        elif sub == "api_retry":
            self.retries += 1
            self.sink.emit("backend_status", {
                "phase": "retrying", "attempt": msg.get("attempt") or self.retries,
                "max_attempts": msg.get("max_retries"), "delay_ms": msg.get("retry_delay_ms"),
                "cause": classify(msg.get("error_status"), msg.get("error"), str(msg.get("error") or "")),
                "message": str(msg.get("error") or "")})
        elif sub == "permission_denied":
            tool_id = str(msg.get("tool_use_id"))
            block = self.open_tools.pop(tool_id, None) or {"id": tool_id, "name": msg.get("tool_name")}
            data = self._tool_summary(block, "denied")
            data["reason"] = _short(msg.get("decision_reason") or msg.get("decision_reason_type"))
            self.sink.emit("tool_call", data)

    def _tool_summary(self, block: Message, status: str) -> Message:
        name = str(block.get("name") or "")
        raw = block.get("input")
        args: Message = raw if isinstance(raw, dict) else {}
        data: Message = {"item_id": block.get("id"), "tool": TOOL_KINDS.get(name, name.lower() or "tool"),
                         "name": name, "status": status}
        if name == "Bash":
            data["command"] = _short(args.get("command"))
        elif name == "Read":
            data["path"] = _short(args.get("file_path"))
        elif "file_path" in args or "notebook_path" in args:
            data["changes"] = [{"path": _short(args.get("file_path") or args.get("notebook_path")),
                                "kind": "update" if name in ("Edit", "NotebookEdit") else "write"}]
        elif args:
            data["arguments"] = _short(args)
        return data

    # -- the end ------------------------------------------------------------

    def outcome(self, result: Message, stopping: str | None) -> tuple[str, str | None, str | None]:
        """(status, failure_kind, message) of a `result`; BackendFailure when it is malformed."""
        subtype, is_error = result.get("subtype"), result.get("is_error")
        if not isinstance(subtype, str) or not isinstance(is_error, bool):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID,
                                    "a stream-json result without a subtype string and an is_error boolean")
        if stopping is not None and (is_error or result.get("terminal_reason") == "aborted_streaming"):
            return "cancelled", fk.CANCELLED, "the turn was interrupted"  # the caller names a timeout
        if not is_error and subtype == "success":
            self._usage(result)
            return "completed", None, None
        self._usage(result)
        if result.get("terminal_reason") == "api_error" or result.get("api_error_status") is not None or self.api_error:
            error = self.api_error or {}
            status = result.get("api_error_status", error.get("status"))
            text = str(result.get("result") or error.get("message") or "the provider failed")
            return "failed", classify(status, error.get("type"), text), text
        text = str(result.get("result") or f"Claude Code ended the turn with {subtype}")
        return "failed", fk.BACKEND_FAILED, text

    def _usage(self, result: Message) -> None:
        usage = result.get("usage")
        if isinstance(usage, dict):
            self.usage = {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}

    def finish(self, status: str, kind: str | None, message: str | None, extra: Message | None = None,
               diff: str | None = None, failed_in_a_row: int = 0) -> None:
        """Close open tools, the diff, the error if failed, then terminal_status. A provider
        failure names its tries: the CLI's retries and the last, or `failed_in_a_row` (the
        forwarder's count: it sees the CLI's non-streaming fallback too) when more."""
        for block in list(self.open_tools.values()):
            self.sink.emit("tool_call", self._tool_summary(block, "incomplete"))
        self.open_tools.clear()
        if diff:
            self.sink.diff(diff)
        if status == "failed":
            error: Message = {"failure_kind": kind or fk.BACKEND_FAILED, "message": message or kind}
            if kind in fk.PROVIDER_KINDS:
                error["tries"] = max(self.retries + 1, failed_in_a_row)
                message = error["message"] = fk.with_tries(kind, message or str(kind), error["tries"])
            self.sink.emit("error", error)
        data: Message = {"status": status, "failure_kind": kind if status != "completed" else None}
        if message and status != "completed":
            data["message"] = message
        if self.usage:
            data["usage"] = self.usage
        data.update(extra or {})
        self.sink.emit("terminal_status", data)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""
