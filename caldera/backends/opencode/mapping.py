"""OpenCode's events of one session (and its children) -> the standard events, and
OpenCode's errors -> the failure kinds (seed 003; docs/backends.md "OpenCode").

| OpenCode | standard |
| --- | --- |
| `message.part.updated` text (assistant's, once `time.end` is set) | `assistant_message` (≤ 8 KiB parts) |
| `message.part.updated` tool pending/running | `tool_call {status: started}` once |
| tool completed / error | `tool_call {completed / failed / declined}`; Bash also `command_output` |
| `message.part.updated` step-finish | token usage (summed) |
| edit / write / patch tools | `diff` (their diffs, once, before the terminal) |
| `session.status {type: retry}` | `backend_status {phase: retrying}` (counted in a row: the driver's cap) |
| `permission.asked` | answered `reject` by the driver; `tool_call {tool: approval, status: declined}` |
| `session.error` | `error {failure_kind}` (kind below); the terminal when the session goes idle |
| `session.idle` | the end of the turn |

Failure kinds of `session.error`: the forwarder's status for the session wins (it saw the
provider's answer); else `APIError.data.statusCode` (401/403 auth, 429 rate, 5xx
unavailable, other 4xx backend-failed); else `ProviderAuthError` auth; else the text
(as for Codex: "rate limit", "unavailable", "cannot connect" …); else `backend-failed`.
"""
from __future__ import annotations

import re
from typing import Any

from caldera.backends import failures as fk
from caldera.backends.events import DIFF_CAP_BYTES, EventSink, cut_utf8
from caldera.backends.events import short_text as _short
from caldera.backends.forwarder import Failure

Event = dict[str, Any]
MESSAGE_PARTS = 8
OUTPUT_PARTS = 4
OUTPUT_PART_BYTES = 8 * 1024
FILE_TOOLS = {"edit", "write", "patch", "multiedit", "apply_patch"}
WEB_TOOLS = {"webfetch", "websearch", "codesearch"}
_RATE_TEXT = re.compile(r"(?i)\b429\b|too many requests|rate.?limit|quota|resource.?exhausted")
_UNAVAILABLE_TEXT = re.compile(
    r"(?i)\b5\d\d\b|unavailable|overloaded|bad gateway|gateway timeout|internal server error|"
    r"cannot connect|connection (?:refused|reset|failed|closed)|econnrefused|econnreset|socket|"
    r"timed? ?out|terminated|stream (?:disconnected|closed)|cannot reach the provider")
_AUTH_TEXT = re.compile(r"(?i)\b40[13]\b|unauthori[sz]ed|forbidden|invalid api key|incorrect api key|authentication")
_REJECTED = "rejected permission"


def obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (OpenCode's events are untrusted)."""
    return value if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def kind_of_status(status: int | None) -> str | None:
    if status in (401, 403):
        return fk.PROVIDER_AUTH_FAILED
    if status == 429:
        return fk.PROVIDER_RATE_LIMITED
    if status is not None and 500 <= status <= 599:
        return fk.PROVIDER_UNAVAILABLE
    if status is not None and 400 <= status <= 499:
        return fk.BACKEND_FAILED
    return None


def kind_of_text(text: str, default: str = fk.BACKEND_FAILED) -> str:
    if _AUTH_TEXT.search(text):
        return fk.PROVIDER_AUTH_FAILED
    if _RATE_TEXT.search(text):
        return fk.PROVIDER_RATE_LIMITED
    if _UNAVAILABLE_TEXT.search(text):
        return fk.PROVIDER_UNAVAILABLE
    return default


def classify_error(error: Any, upstream: Failure | None = None) -> tuple[str, str]:
    """(failure kind, message) of a `session.error` `{name, data: {message, statusCode, …}}`."""
    if not isinstance(error, dict):
        return fk.BACKEND_FAILED, "OpenCode reported an error it did not describe"
    name = str(error.get("name") or "Error")
    data = obj(error.get("data"))
    message = str(data.get("message") or name).split("\n    at ")[0][:1000]  # no stack trace
    status = data.get("statusCode") if isinstance(data.get("statusCode"), int) else None
    if upstream is not None and kind_of_status(upstream.status) and status is None:
        status = upstream.status
    by_status = kind_of_status(status)
    if by_status is not None:
        return by_status, f"{name}: HTTP {status}: {message}"
    if name == "ProviderAuthError":
        return fk.PROVIDER_AUTH_FAILED, f"{name}: {message}"
    if name == "APIError" or upstream is not None:
        default = fk.PROVIDER_UNAVAILABLE if data.get("isRetryable") or upstream is not None else fk.BACKEND_FAILED
        return kind_of_text(message, default), f"{name}: {message}"
    return kind_of_text(message) if "Model not found" not in message else fk.BACKEND_FAILED, f"{name}: {message}"


def retry_kind(message: str, upstream: Failure | None) -> str:
    """The kind a `session.status retry` would end as: OpenCode retries only what it deems
    transient, so unavailable unless the status or the text says rate limit (or auth)."""
    if upstream is not None and kind_of_status(upstream.status):
        return kind_of_status(upstream.status) or fk.PROVIDER_UNAVAILABLE
    return kind_of_text(message, fk.PROVIDER_UNAVAILABLE)




class TurnMapper:
    """The events of one turn. The driver feeds `handle(event)` and reads the state."""

    def __init__(self, sink: EventSink, session_id: str):
        self.sink = sink
        self.sessions = {session_id}
        self.root = session_id
        self.user_messages: set[str] = set()
        self.emitted_text: set[str] = set()
        self.open_text: dict[str, str] = {}  # part id -> latest text of an assistant part not yet ended
        self.tools: dict[str, dict[str, Any]] = {}  # part id -> latest tool part
        self.tool_done: set[str] = set()
        self.tool_started: set[str] = set()
        self.usage: dict[str, int] = {}
        self.diffs: list[str] = []
        self.models: set[tuple[str, str]] = set()  # (provider, model) of the assistant messages
        self.steps = 0  # step-finish parts: answers the model completed
        self.error: Any = None  # the first session.error's `error` (classified at the end: the forwarder knows more)
        self.retries = 0  # session.status retries and broken-off answers (a "cut": see _step) in a row
        self.with_content: set[str] = set()  # assistant messages that produced text or a tool call
        self.active = False  # the session did something since the prompt
        self.idle = False

    def ours(self, props: dict[str, Any]) -> bool:
        sid = props.get("sessionID")
        if sid is None and isinstance(props.get("info"), dict):
            sid = props["info"].get("sessionID") or props["info"].get("id")
        if sid is None and isinstance(props.get("part"), dict):
            sid = props["part"].get("sessionID")
        return sid in self.sessions

    def handle(self, event: Event) -> tuple[str, Any] | None:
        """One event; an action for the driver: ("permission", props), ("question", props),
        ("retry", status), ("cut", step part) or ("model", (provider, model)) — or None."""
        kind, props = event.get("type"), event.get("properties")
        if not isinstance(props, dict):
            return None
        if kind == "session.created":
            info = props.get("info") or {}
            if isinstance(info, dict) and info.get("parentID") in self.sessions and isinstance(info.get("id"), str):
                self.sessions.add(info["id"])
            return None
        if not self.ours(props):
            return None
        if kind == "message.part.updated" and isinstance(props.get("part"), dict):
            self.active = True
            return self._part(props["part"])
        elif kind == "message.updated" and isinstance(props.get("info"), dict):
            return self._message(props["info"])
        elif kind == "session.status" and isinstance(props.get("status"), dict):
            return self._status(props)
        elif kind == "session.idle" and props.get("sessionID") == self.root:
            self.idle = self.active or self.error is not None
        elif kind == "session.error" and self.error is None:
            self.active = True
            self.error = props.get("error") or {"name": "UnknownError"}
        elif kind == "permission.asked":
            return ("permission", props)
        elif kind == "question.asked":
            return ("question", props)
        return None

    def _status(self, props: dict[str, Any]) -> tuple[str, Any] | None:
        status = props["status"]
        if status.get("type") in ("busy", "retry") and props.get("sessionID") == self.root:
            self.active = True
        if status.get("type") == "retry":
            self.retries += 1
            return ("retry", status)
        if status.get("type") == "idle" and props.get("sessionID") == self.root:
            self.idle = self.active or self.error is not None
        return None

    def _message(self, info: dict[str, Any]) -> tuple[str, Any] | None:
        if info.get("role") == "user" and isinstance(info.get("id"), str):
            self.user_messages.add(info["id"])
            return None
        if info.get("role") == "assistant":
            self.active = True
            pair = (str(info.get("providerID")), str(info.get("modelID")))
            if pair not in self.models:
                self.models.add(pair)
                return ("model", pair)
        return None

    # ------------------------------------------------------------ parts

    def _part(self, part: dict[str, Any]) -> tuple[str, Any] | None:
        ptype, pid = part.get("type"), part.get("id")
        if not isinstance(pid, str):
            return None
        if ptype == "text":
            self._text(part, pid)
        elif ptype == "tool":
            self.with_content.add(str(part.get("messageID")))
            self._tool(part, pid)
        elif ptype == "step-finish":
            self._tokens(part.get("tokens"))
            return self._step(part)
        return None

    def _step(self, part: dict[str, Any]) -> tuple[str, Any] | None:
        """A step that ended without a finish reason and produced nothing is an answer the
        provider broke off: OpenCode 1.18.33 does not retry it as an error but starts the
        next step at once, for ever (measured: hundreds of requests a minute); it counts
        as a retry here, so the driver's cap ends it."""
        if part.get("reason") in ("unknown", "error", None) and part.get("messageID") not in self.with_content:
            self.retries += 1
            return ("cut", part)
        self.steps += 1
        self.retries = 0  # an answer came whole: the failures the driver bounds are those in a row
        return None

    def _text(self, part: dict[str, Any], pid: str) -> None:
        # A user's (the prompt) text part has no `time`; an assistant's has start, then end.
        if part.get("synthetic") or part.get("ignored") or part.get("messageID") in self.user_messages:
            return
        timing = part.get("time")
        if not isinstance(timing, dict) or pid in self.emitted_text:
            return
        text = str(part.get("text") or "")
        if timing.get("end") is None:
            self.open_text[pid] = text
            if text.strip():
                self.with_content.add(str(part.get("messageID")))
            return
        self.open_text.pop(pid, None)
        self.emitted_text.add(pid)
        if text.strip():
            self.with_content.add(str(part.get("messageID")))
            self.sink.text_events("assistant_message", {"item_id": pid}, "text", text, MESSAGE_PARTS)

    def _tool(self, part: dict[str, Any], pid: str) -> None:
        if pid in self.tool_done:
            return
        state = obj(part.get("state"))
        status = state.get("status")
        self.tools[pid] = part
        if status in ("pending", "running"):
            if status == "running" and pid not in self.tool_started:
                self.tool_started.add(pid)
                self.sink.emit("tool_call", self.summary(part, "started"))
            return
        if status not in ("completed", "error"):
            return
        self.tool_done.add(pid)
        self.tools.pop(pid, None)
        error = str(state.get("error") or "")
        final = "completed" if status == "completed" else ("declined" if _REJECTED in error else "failed")
        self.sink.emit("tool_call", self.summary(part, final))
        if part.get("tool") == "bash":
            self._command_output(part, final)
        if status == "completed" and part.get("tool") in FILE_TOOLS:
            self._diff(part)

    def summary(self, part: dict[str, Any], status: str) -> dict[str, Any]:
        state = obj(part.get("state"))
        args = obj(state.get("input"))
        name = str(part.get("tool") or "")
        data: dict[str, Any] = {"item_id": part.get("id"), "status": status, "name": name}
        if name == "bash":
            data.update(tool="command", command=_short(args.get("command")), cwd=_short(args.get("workdir")))
        elif name in FILE_TOOLS:
            data.update(tool="file_change", changes=self._changes(name, args, state))
        elif name in WEB_TOOLS:
            data.update(tool="web_search", query=_short(args.get("url") or args.get("query")))
        else:
            data.update(tool="dynamic", arguments=_short(args))
        if status in ("failed", "declined") and state.get("error"):
            data["error"] = _short(str(state["error"]))
        return data

    def _changes(self, name: str, args: dict[str, Any], state: dict[str, Any]) -> list[dict[str, str]]:
        meta = obj(state.get("metadata"))
        if name == "write":
            kind = "add" if meta.get("exists") is False else "update"
            return [{"path": str(args.get("filePath")), "kind": kind}]
        if isinstance(args.get("filePath"), str):
            return [{"path": args["filePath"], "kind": "update"}]
        files = meta.get("files")
        if isinstance(files, list):
            return [{"path": str(f.get("filePath") or f.get("path") if isinstance(f, dict) else f), "kind": "update"}
                    for f in files[:50]]
        return []

    def _command_output(self, part: dict[str, Any], status: str) -> None:
        state = obj(part.get("state"))
        meta = obj(state.get("metadata"))
        args = obj(state.get("input"))
        output = state.get("output") if isinstance(state.get("output"), str) else meta.get("output")
        if not isinstance(output, str):
            output = str(state.get("error") or "")
        timing = obj(state.get("time"))
        duration = None
        if isinstance(timing.get("start"), int) and isinstance(timing.get("end"), int):
            duration = timing["end"] - timing["start"]
        base = {"item_id": part.get("id"), "command": _short(args.get("command")), "status": status,
                "exit_code": meta.get("exit") if isinstance(meta.get("exit"), int) else None, "duration_ms": duration}
        self.sink.text_events("command_output", base, "output", output, OUTPUT_PARTS)

    def _diff(self, part: dict[str, Any]) -> None:
        state = part["state"]
        meta = obj(state.get("metadata"))
        args = obj(state.get("input"))
        if isinstance(meta.get("diff"), str):
            self.diffs.append(meta["diff"].rstrip("\n") + "\n")
        elif part.get("tool") == "write" and isinstance(args.get("content"), str):
            path = str(args.get("filePath"))
            lines = args["content"].splitlines()
            head = "--- /dev/null" if meta.get("exists") is False else f"--- {path} (rewritten)"
            self.diffs.append(f"{head}\n+++ {path}\n@@ -0,0 +1,{len(lines)} @@\n"
                              + "".join(f"+{line}\n" for line in lines))

    def _tokens(self, tokens: Any) -> None:
        if not isinstance(tokens, dict):
            return
        cache = obj(tokens.get("cache"))
        for key, value in (("inputTokens", tokens.get("input")), ("outputTokens", tokens.get("output")),
                           ("reasoningOutputTokens", tokens.get("reasoning")), ("cachedInputTokens", cache.get("read")),
                           ("totalTokens", tokens.get("total"))):
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[key] = self.usage.get(key, 0) + value

    # ------------------------------------------------------------ the end

    def close_open(self) -> None:
        """Items still open at the end: text as it stood, tools as incomplete."""
        for pid, text in list(self.open_text.items()):
            if text.strip():
                self.sink.text_events("assistant_message", {"item_id": pid, "incomplete": True}, "text", text,
                                      MESSAGE_PARTS)
        self.open_text.clear()
        for part in list(self.tools.values()):
            self.sink.emit("tool_call", self.summary(part, "incomplete"))
            if part.get("tool") == "bash":
                self._command_output(part, "incomplete")
        self.tools.clear()
        if self.diffs:
            text = self.sink.redactor.text("".join(self.diffs))
            capped, cut = cut_utf8(text, DIFF_CAP_BYTES)
            data: dict[str, Any] = {"diff": capped, "bytes": len(text.encode("utf-8"))}
            if cut:
                data["truncated"] = True
            self.sink.emit("diff", data)
            self.diffs = []


def turn_outcome(mapper: TurnMapper, failure: tuple[str, str] | None, upstream: Failure | None,
                 model: str) -> tuple[str, str | None, str | None]:
    """(status, failure kind, message) of a turn whose session went idle (not cancelled, not
    timed out): our own abort's failure; else OpenCode's error; else, when the model never
    completed an answer, a failure (OpenCode goes idle without an error when it fell back to
    a model it cannot reach); else completed."""
    if failure is not None:
        return "failed", failure[0], failure[1]
    if mapper.error is not None:
        kind, message = classify_error(mapper.error, upstream)
        return "failed", kind, message
    if mapper.steps == 0:
        return "failed", fk.BACKEND_FAILED, (f"OpenCode went idle without an answer from {model} and without "
                                             "an error: the model could not be reached")
    return "completed", None, None
