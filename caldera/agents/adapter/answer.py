"""What an adapter call came to, and the plain-Python contract checks on its stdout.

These checks give the verdict the published schemas give (tests hold them
together); they are plain Python so a local verb never imports jsonschema.
"""
from __future__ import annotations

import json

from caldera import TYPE_CHECKING
from caldera.agents.contract import ContractError  # noqa: F401 -- the adapter's answers raise it; re-exported
from caldera.host.jsonlimits import JSONLimitError, loads, scrub

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

# Answer.kind
DONE, REFUSED, UNSUPPORTED, FAILED = "done", "refused", "unsupported", "failed"
MESSAGE_MAX = 1000
HELD_MAX_ITEMS = 50
JSON_MAX_BYTES = 512 * 1024  # above every verb's stdout cap: the cap that matters is the verb's
STDERR_SHOWN_LINES = 3  # the end of a traceback; python's one "can't open file" line
STDERR_SHOWN_WIDTH = 200


class Answer:
    """One verb's outcome. A plain class, not a dataclass: a local verb must start fast, and
    `dataclasses` would cost it its import (docs/performance.md, section 1)."""

    __slots__ = ("verb", "kind", "message", "held", "data", "text", "truncated", "reason",
                 "returncode", "duration", "stderr", "stdout")

    def __init__(self, verb: str, kind: str, message: str | None = None, held: Iterable[str] | None = None,
                 data: dict[str, Any] | None = None, reason: str | None = None) -> None:
        self.verb, self.kind = verb, kind  # kind: done|refused|unsupported|failed
        self.message: str | None = message
        self.held: list[str] = list(held or [])
        self.data: dict[str, Any] | None = data  # the parsed JSON object, for JSON verbs
        self.text: str | None = None  # log NAME: the tail, decoded
        self.truncated = False  # log NAME: more than the kept tail was printed
        self.reason: str | None = reason  # why it failed (kind == failed)
        self.returncode: int | None = None
        self.duration = 0.0
        self.stderr = ""  # the tail, for diagnostics only (never shown to Caldera)
        self.stdout = b""  # as printed (capped), for `caldera check`

    def __repr__(self) -> str:
        return f"Answer({self.verb!r}, {self.kind!r}, message={self.message!r}, reason={self.reason!r})"

    @property
    def ok(self) -> bool:
        return self.kind == DONE

    def payload(self) -> dict[str, Any]:
        """The CLI's `--json` object and a command's finish result: {ok, message, held}."""
        return {"ok": self.ok, "message": self.message, "held": list(self.held)}


def parse_object(stdout: bytes, verb: str) -> dict[str, Any]:
    """Exactly one JSON object and nothing else (whitespace aside), or ContractError.

    Parsed by the one bounded parser (caldera.host.jsonlimits): 20,000 nested
    arrays are "output nested deeper than 64 levels", one failed call, never a
    RecursionError in a loop."""
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise ContractError(f"{verb}: stdout is not UTF-8") from None
    if not text.strip():
        raise ContractError(f"{verb}: printed nothing; one JSON object was expected")
    try:
        value = loads(stdout, max_bytes=JSON_MAX_BYTES, what="output")
    except json.JSONDecodeError as exc:
        why = describe_stdout(text, exc)
        raise ContractError(f"{verb}: stdout must hold exactly one JSON object ({why})") from None
    except JSONLimitError as exc:
        raise ContractError(f"{verb}: {exc}") from None
    if not isinstance(value, dict):
        raise ContractError(f"{verb}: printed a JSON {type(value).__name__}, not an object")
    return value


def describe_stdout(text: str, exc: json.JSONDecodeError) -> str:
    """Name the usual breach: two objects, or diagnostics around the JSON."""
    if exc.msg == "Extra data":
        rest = text[exc.pos:].lstrip()
        if rest.startswith("{"):
            return "it printed more than one JSON object"
        return f"text after the JSON object: {rest[:60]!r}"
    if "{" in text and not text.lstrip().startswith("{"):
        return f"text before the JSON object: {text.lstrip()[:60]!r}; diagnostics belong on stderr"
    return f"not JSON: {exc.msg} at character {exc.pos}"


def check_answer_body(body: dict[str, Any], verb: str) -> tuple[str | None, list[str]]:
    """(message, held) of a pause/resume/run-now/settings-set answer; ContractError if malformed."""
    message, held = body.get("message"), body.get("held", [])
    if message is not None and not isinstance(message, str):
        raise ContractError(f"{verb}: 'message' must be a string")
    if not isinstance(held, list) or not all(isinstance(h, str) for h in held):
        raise ContractError(f"{verb}: 'held' must be a list of strings")
    # Sentences a person reads: a lone surrogate (a "\ud800" escape) becomes U+FFFD, so
    # printing or encoding them can never fail.
    message = scrub(message[:MESSAGE_MAX]) if message else message
    return message, [scrub(h[:MESSAGE_MAX]) for h in held[:HELD_MAX_ITEMS]]


def with_held(message: str | None, held: list[str]) -> str:
    """The message a person reads: each held item it does not already name, as "Held: …"."""
    text = (message or "").strip()
    for item in held:
        if item and item not in text:
            text = f"{text} Held: {item}." if text else f"Held: {item}."
    return text


def stderr_excerpt(stderr: str, redact: Callable[[str], str]) -> list[str]:
    """The end of an adapter's stderr as a person at the host is shown it (a failed verb,
    `caldera check`): redacted whole first (a secret cut in two would pass the Redactor),
    then its last non-empty lines, each cut to a width, control characters escaped (an
    adapter's bytes never drive the terminal). Never sent to the control plane."""
    lines = [line.rstrip() for line in redact(stderr).splitlines() if line.strip()][-STDERR_SHOWN_LINES:]
    return [_printable(line if len(line) <= STDERR_SHOWN_WIDTH else line[:STDERR_SHOWN_WIDTH - 1] + "…")
            for line in lines]


def _printable(line: str) -> str:
    if line.isprintable():
        return scrub(line)
    return scrub("".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in line.replace("\t", " ")))
