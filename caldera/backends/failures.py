"""The eleven failureKinds of seed 003, and the mapping from Codex's errors to them.

The mapping follows what Codex 0.169.0 was observed to send (codex-notes section 5):
401/403 arrive as `httpConnectionFailed{httpStatusCode}` (not as "unauthorized"),
5xx as `internalServerError`, `httpConnectionFailed{5xx}` or
`responseStreamDisconnected{5xx}`, and a cut stream or idle timeout only as
`"other"` plus a message. So the status code is looked for in every variant key,
and the message text is matched last. Provider availability problems must never
become `backend-failed`.
"""
from __future__ import annotations

import re
from typing import Any

SECRET_UNAVAILABLE = "secret-unavailable"
PROVIDER_AUTH_FAILED = "provider-auth-failed"
PROVIDER_RATE_LIMITED = "provider-rate-limited"
PROVIDER_UNAVAILABLE = "provider-unavailable"
BACKEND_PROTOCOL_ERROR = "backend-protocol-error"
BACKEND_JSON_PARSE_ERROR = "backend-json-parse-error"
BACKEND_RESPONSE_INVALID = "backend-response-invalid"
BACKEND_SPAWN_FAILED = "backend-spawn-failed"
BACKEND_FAILED = "backend-failed"
BACKEND_TIMEOUT = "backend-timeout"
CANCELLED = "cancelled"

FAILURE_KINDS = (
    SECRET_UNAVAILABLE, PROVIDER_AUTH_FAILED, PROVIDER_RATE_LIMITED, PROVIDER_UNAVAILABLE,
    BACKEND_PROTOCOL_ERROR, BACKEND_JSON_PARSE_ERROR, BACKEND_RESPONSE_INVALID,
    BACKEND_SPAWN_FAILED, BACKEND_FAILED, BACKEND_TIMEOUT, CANCELLED,
)

PROVIDER_KINDS = (PROVIDER_AUTH_FAILED, PROVIDER_RATE_LIMITED, PROVIDER_UNAVAILABLE)


def tries(count: int) -> str:
    """"1 try", "3 tries": how often the provider was asked, for a failure's message."""
    return f"{count} {'try' if count == 1 else 'tries'}"


def with_tries(kind: str | None, message: str, count: int) -> str:
    """A provider failure's message with the tries it took ("…; 3 tries"); others as they are."""
    return f"{message}; {tries(count)}" if kind in PROVIDER_KINDS else message


def stalled(seconds: float) -> str:
    """The message of a turn ended because its provider fell silent within an answer."""
    return f"the provider stopped sending its answer: nothing for {seconds:.0f} s (CALDERA_PROVIDER_STALL_SECONDS)"


# Codex error-info variants that carry {httpStatusCode}.
_STATUS_VARIANTS = ("httpConnectionFailed", "responseStreamDisconnected",
                    "responseStreamConnectionFailed", "responseTooManyFailedAttempts")
_AUTH_INFO = {"unauthorized"}
_RATE_INFO = {"usageLimitExceeded", "rateLimitExceeded"}
_UNAVAILABLE_INFO = {"internalServerError", "serverOverloaded", "flexUnavailable",
                     "policyCapacityUnavailable"}
_UNAVAILABLE_TEXT = re.compile(
    r"(?i)stream disconnected before completion|idle timeout|service unavailable|"
    r"temporar(?:il)?y unavailable|provider unavailable|bad gateway|gateway timeout|"
    r"connection failed|error sending request|overloaded")
_AUTH_TEXT = re.compile(r"(?i)\b40[13]\b.*(?:unauthori[sz]ed|forbidden)|incorrect api key|invalid api key")
_RATE_TEXT = re.compile(r"(?i)\b429\b|too many requests|rate limit|quota exceeded")
_SECRET_TEXT = re.compile(r"(?i)missing environment variable")


class BackendFailure(Exception):
    """A run's failure with its kind; the message is safe to show once redacted."""

    def __init__(self, kind: str, message: str):
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message


def http_status(error_info: Any) -> int | None:
    """The HTTP status inside a CodexErrorInfo, whichever variant holds it."""
    if isinstance(error_info, dict):
        for key in _STATUS_VARIANTS:
            inner = error_info.get(key)
            if isinstance(inner, dict):
                code = inner.get("httpStatusCode")
                if isinstance(code, int):
                    return code
    return None


def _has_null_connection_failure(error_info: Any) -> bool:
    inner = error_info.get("httpConnectionFailed") if isinstance(error_info, dict) else None
    return isinstance(inner, dict) and inner.get("httpStatusCode") is None


def classify_turn_error(error: Any) -> str:
    """failureKind for a Codex TurnError `{message, codexErrorInfo, additionalDetails}`."""
    if not isinstance(error, dict):
        return BACKEND_FAILED
    raw_info = error.get("codexErrorInfo")
    text = " ".join(str(error.get(k) or "") for k in ("message", "additionalDetails"))
    status = http_status(raw_info)
    info = raw_info if isinstance(raw_info, str) else None  # object variants carry only the status
    if info in _AUTH_INFO or status in (401, 403):
        return PROVIDER_AUTH_FAILED
    if info in _RATE_INFO or status == 429:
        return PROVIDER_RATE_LIMITED
    if (info in _UNAVAILABLE_INFO or (status is not None and 500 <= status <= 599)
            or _has_null_connection_failure(raw_info)):
        return PROVIDER_UNAVAILABLE
    if status is None:
        # No status: only the text tells (cut streams, idle timeouts arrive as "other").
        if _SECRET_TEXT.search(text):
            return SECRET_UNAVAILABLE
        if _AUTH_TEXT.search(text):
            return PROVIDER_AUTH_FAILED
        if _RATE_TEXT.search(text):
            return PROVIDER_RATE_LIMITED
        if _UNAVAILABLE_TEXT.search(text):
            return PROVIDER_UNAVAILABLE
    return BACKEND_FAILED


_RETRY_RE = re.compile(r"Reconnecting\.\.\.\s*(\d+)\s*/\s*(\d+)")


def retry_attempt(message: str | None) -> tuple[int | None, int | None]:
    """(attempt, max) from "Reconnecting... n/N", else (None, None)."""
    m = _RETRY_RE.search(message or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)
