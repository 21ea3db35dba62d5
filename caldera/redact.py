"""Redaction, in one place: every log line, event, CLI output, state report and
finish result passes through a Redactor before it leaves the process.

It removes (1) every known secret value (tokens, secrets.env values, projected
backend secrets) in the forms it can travel in: raw, each line of a multi-line
value, base64, JSON-escaped and URL-encoded; and (2) anything shaped like a
credential: Authorization headers, bearer tokens, sk-... keys, session tokens,
URL userinfo, credential query parameters and api_key/token/password fields.
"""
from __future__ import annotations

import base64
import json
import re
import threading
import urllib.parse

MASK = "[REDACTED]"
MIN_SECRET_LEN = 6  # shorter values would mask ordinary words

_SECRET_KEY = (
    r"(?i)^(authorization|proxy-authorization|api[_-]?key|apikey|token|access[_-]?token|"
    r"refresh[_-]?token|id[_-]?token|session[_-]?token|bootstrap[_-]?token|password|passwd|"
    r"secret|client[_-]?secret|private[_-]?key|cookie|set-cookie)$"
)
# (pattern, replacement, triggers): a pattern runs only when one of its trigger
# substrings is in the lowercased text. Most log lines hold none, and a substring
# test costs a fraction of a regex scan: this keeps redaction at a few microseconds
# per line (bench/bench_codex.py). Every trigger is a substring every match must contain.
_PATTERN_SOURCES = [
    # Authorization: Bearer xxx / Basic xxx (header form, any case)
    ((r"(?i)\b((?:proxy-)?authorization\"?\s*[:=]\s*\"?)(?:(?:bearer|basic|token)\s+)?[^\s\"',}]+"),
     r"\1" + MASK, ("authorization",)),
    ((r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{8,}"), r"\1 " + MASK, ("bearer", "basic")),
    ((r"\bsk-[A-Za-z0-9_\-]{12,}"), MASK, ("sk-",)),
    ((r"\bagt_(?:sess|boot)_[A-Za-z0-9_\-]{6,}"), MASK, ("agt_",)),
    # scheme://user:password@host -> scheme://[REDACTED]@host
    ((r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s:@\"']+(?::[^/\s@\"']*)?@"), r"\1" + MASK + "@", ("@",)),
    # ?token=…&api_key=…
    ((r"(?i)([?&;](?:access_token|token|api[_-]?key|apikey|key|password|secret|sig|signature)=)[^&\s\"'#]+"),
     r"\1" + MASK, ("token=", "key=", "password=", "secret=", "sig=", "signature=")),
    # "api_key": "…" / api_key=… / token: … in free text
    ((r"(?i)(\"(?:api[_-]?key|apikey|token|access_token|refresh_token|id_token|password|secret|client_secret)\"\s*:\s*\")[^\"]*(\")"),
     r"\1" + MASK + r"\2", ('key"', 'token"', 'password"', 'secret"')),
    ((r"(?i)\b((?:api[_-]?key|apikey|access_token|refresh_token|password|passwd|client_secret)\s*[=:]\s*)[^\s,;\"'}]+"),
     r"\1" + MASK, ("key", "token", "passw", "secret")),
]


class _Compiled:
    """The patterns, compiled on first use: importing this module (every quick CLI
    verb does) costs no regex compilation; the first redaction pays it once."""

    _done = None

    @classmethod
    def get(cls):
        if cls._done is None:
            patterns = [(re.compile(src), repl, triggers) for src, repl, triggers in _PATTERN_SOURCES]
            trigger = re.compile("|".join(re.escape(t) for _, _, ts in _PATTERN_SOURCES for t in ts))
            cls._done = (patterns, trigger, re.compile(_SECRET_KEY))
        return cls._done



def _forms(value: str) -> set[str]:
    """The spellings a secret value can travel in."""
    forms = {value}
    for line in value.splitlines():
        if len(line.strip()) >= MIN_SECRET_LEN:
            forms.add(line.strip())
    raw = value.encode()
    for enc in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        text = enc.decode()
        forms.add(text)
        forms.add(text.rstrip("="))
    forms.add(json.dumps(value)[1:-1])

    forms.add(urllib.parse.quote(value, safe=""))
    forms.add(urllib.parse.quote_plus(value, safe=""))
    return {f for f in forms if len(f) >= MIN_SECRET_LEN}


class Redactor:
    """Thread-safe: loops add secrets (a new session token) while others redact."""

    def __init__(self, values=()):
        self._lock = threading.Lock()
        self._forms: list[str] = []
        self._regex: re.Pattern | None = None
        for value in values:
            self.add(value)

    def add(self, value) -> None:
        if not isinstance(value, str) or len(value) < MIN_SECRET_LEN:
            return
        with self._lock:
            known = set(self._forms)
            new = _forms(value) - known
            if not new:
                return
            # Longest first, so a value is masked whole before any of its parts.
            self._forms = sorted(known | new, key=len, reverse=True)
            self._regex = re.compile("|".join(re.escape(f) for f in self._forms))

    def text(self, value: str) -> str:
        regex = self._regex
        if regex is not None:
            value = regex.sub(MASK, value)
        low = value.lower()
        patterns, any_trigger, _ = _Compiled.get()
        if any_trigger.search(low) is None:  # the common case: nothing credential-shaped
            return value
        for pattern, repl, triggers in patterns:
            if any(t in low for t in triggers):
                value = pattern.sub(repl, value)
        return value

    def __call__(self, value):
        """Redact a str, bytes, or any JSON-shaped structure (a new object is returned)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bytes):
            return self.text(value.decode("utf-8", "replace"))
        if isinstance(value, dict):
            return {k: (MASK if isinstance(k, str) and _Compiled.get()[2].match(k) and v not in (None, "")
                        else self(v)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        return value

    redact = __call__
