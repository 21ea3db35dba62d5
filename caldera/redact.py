"""Redaction, in one place: every log line, event, CLI output, state report and
finish result passes through a Redactor before it leaves the process.

It removes (1) every known secret value (tokens, secrets.env values, projected
backend secrets) in the forms it can travel in: raw, each line of a multi-line
value, base64, JSON-escaped and URL-encoded; and (2) anything shaped like a
credential: Authorization headers, bearer tokens, sk-... keys, session tokens,
URL userinfo, credential query parameters and api_key/token/password fields.
"""
from __future__ import annotations

import json
import re
import threading
import urllib.parse

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

MASK = "[REDACTED]"
MIN_SECRET_LEN = 6  # shorter values would mask ordinary words
# What follows a prefix secret (`Redactor.add(value, prefix=True)`) and is masked with it: the
# characters of a token (hex, base64url), so that no part of the value it begins is left.
PREFIX_TAIL = r"[A-Za-z0-9_\-]*"
# What follows a prefix secret's base64 head (`_base64_heads`): the rest of a base64 blob, in the
# standard and the URL-safe alphabet (as `_forms` spells a whole secret), padding included.
BASE64_TAIL = r"[A-Za-z0-9+/=_\-]*"

_SECRET_KEY = (
    r"(?i)^(authorization|proxy-authorization|api[_-]?key|apikey|token|access[_-]?token|"
    r"refresh[_-]?token|id[_-]?token|session[_-]?token|bootstrap[_-]?token|password|passwd|"
    r"secret|client[_-]?secret|private[_-]?key|cookie|set-cookie)$"
)
# (pattern, replacement, triggers): a pattern runs only when one of its trigger
# substrings is in the lowercased text. Most log lines hold none, and a substring
# test costs a fraction of a regex scan (docs/performance.md, section 5). Every trigger
# is a substring every match must contain.
_PATTERN_SOURCES: list[tuple[str, str, tuple[str, ...]]] = [
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
     r"\1" + MASK, ("key", "_token", "passw", "secret")),
]


# The keys whose values are masked whole in a JSON-shaped structure, lowercased: a set,
# not a regex, so a quick CLI verb redacting its answer compiles nothing.
_SECRET_KEYS = frozenset(
    f"{head}{sep}{tail}" if tail else head
    for head, tail in (("authorization", ""), ("proxy-authorization", ""), ("api", "key"), ("apikey", ""),
                       ("token", ""), ("access", "token"), ("refresh", "token"), ("id", "token"),
                       ("session", "token"), ("bootstrap", "token"), ("password", ""), ("passwd", ""),
                       ("secret", ""), ("client", "secret"), ("private", "key"), ("cookie", ""),
                       ("set-cookie", ""))
    for sep in ("_", "-", "")
)


def secret_key(key: object) -> bool:
    """Whether a mapping key names a secret (_SECRET_KEY's verdict, as a set lookup)."""
    return isinstance(key, str) and key.lower() in _SECRET_KEYS


def _minimal(words: Iterable[str]) -> tuple[str, ...]:
    """The words no other word is a substring of: a text holding none of these holds none
    of `words` either, so testing these few is enough to rule them all out."""
    unique = set(words)
    return tuple(sorted(w for w in unique if not any(o != w and o in w for o in unique)))


class _Compiled:
    """The patterns, each compiled on its first use: importing this module (every quick
    CLI verb does) compiles nothing, and a text no trigger is in compiles nothing."""

    _triggers: tuple[str, ...] | None = None
    _split: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    _patterns: dict[int, re.Pattern[str]] = {}

    @classmethod
    def triggers(cls) -> tuple[str, ...]:
        if cls._triggers is None:
            cls._triggers = _minimal(t for _, _, ts in _PATTERN_SOURCES for t in ts)
        return cls._triggers

    @classmethod
    def split_triggers(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the triggers without "=", those with it): a text holding no "=" (one memchr)
        holds none of the second, so their scans are skipped (docs/performance.md, section 5)."""
        if cls._split is None:
            every = cls.triggers()
            cls._split = (tuple(t for t in every if "=" not in t), tuple(t for t in every if "=" in t))
        return cls._split

    @classmethod
    def pattern(cls, index: int) -> re.Pattern[str]:
        compiled = cls._patterns.get(index)
        if compiled is None:
            compiled = cls._patterns[index] = re.compile(_PATTERN_SOURCES[index][0])
        return compiled


_PLAIN = (int, float, bool)


def _has_trigger(low: str) -> bool:
    """Whether the lowercased text holds one of the patterns' trigger words."""
    plain, with_equals = _Compiled.split_triggers()
    for trigger in plain:
        if trigger in low:
            return True
    if "=" in low:
        for trigger in with_equals:
            if trigger in low:
                return True
    return False


def _base64_forms(value: str) -> set[str]:
    """A secret's base64 spellings: standard and URL-safe, with and without padding."""
    import base64  # here: every quick verb imports this module, few add a secret (docs/performance.md, section 1)

    raw = value.encode()
    texts = (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode())
    return {*texts, *(t.rstrip("=") for t in texts)}


def _base64_heads(value: str) -> set[str]:
    """What the base64 of anything holding `value` (a prefix secret) holds for certain: for each
    of the three byte alignments `value` can have in the encoded stream, the characters made of
    its bytes alone. The ones around them mix in the neighbouring bytes (the token after a
    prefix, "caldera-run-" before it), so the prefix's own base64 misses most tokens' base64."""
    import base64

    heads = set()
    for pad in range(3):
        bits = 8 * (pad + len(value.encode()))
        first, end = -(-8 * pad // 6), bits // 6  # whole 6-bit characters after the padding
        encoded = b"\0" * pad + value.encode()
        for text in (base64.b64encode(encoded).decode(), base64.urlsafe_b64encode(encoded).decode()):
            heads.add(text[first:end])
    return {h for h in heads if len(h) >= MIN_SECRET_LEN}


def _forms(value: str) -> set[str]:
    """The spellings a secret value can travel in."""
    forms = {value}
    for line in value.splitlines():
        if len(line.strip()) >= MIN_SECRET_LEN:
            forms.add(line.strip())
    forms |= _base64_forms(value)
    forms.add(json.dumps(value)[1:-1])

    forms.add(urllib.parse.quote(value, safe=""))
    forms.add(urllib.parse.quote_plus(value, safe=""))
    return {f for f in forms if len(f) >= MIN_SECRET_LEN}


class Redactor:
    """Thread-safe: loops add secrets (a new session token) while others redact."""

    def __init__(self, values: Iterable[object] = ()) -> None:
        self._lock = threading.Lock()
        self._forms: list[str] = []
        # form -> what is masked with it: the token characters after a prefix secret's forms, the
        # rest of a base64 blob after its base64 heads
        self._tails: dict[str, str] = {}
        # (regex of every form, _minimal(forms) as substring tests before it), replaced as one
        # object so that a reader never pairs a new regex with old probes.
        self._values: tuple[re.Pattern[str], tuple[str, ...]] | None = None
        for value in values:
            self.add(value)

    def add(self, value: object, prefix: bool = False) -> None:
        """Mask `value` from now on; `prefix`: it begins other secrets (one per process, their
        random rest after it), which are masked whole: it and the token characters after it."""
        if not isinstance(value, str) or len(value) < MIN_SECRET_LEN:
            return
        with self._lock:
            known = set(self._forms)
            forms = _forms(value)
            tails = dict(self._tails)
            # A prefix's base64 forms give way to its heads, which mask them and what follows (also
            # when it comes again as a plain value: a longer form first would cut a blob short).
            if prefix or value in tails:
                encoded = _base64_forms(value)
                heads = _base64_heads(value)
                forms = (forms - encoded) | heads
                known -= encoded
                tails.update(dict.fromkeys(forms - heads, PREFIX_TAIL) | dict.fromkeys(heads, BASE64_TAIL))
            if known | forms == set(self._forms) and tails == self._tails:
                return
            self._tails = tails
            # Longest first, so a value is masked whole before any of its parts (one secret that
            # begins another: the longer one first).
            self._forms = sorted(known | forms, key=len, reverse=True)
            alternatives = (re.escape(f) + tails.get(f, "") for f in self._forms)
            self._values = (re.compile("|".join(alternatives)), _minimal(self._forms))

    def _mask_values(self, text: str) -> str:
        """The known secret values masked; the one regex runs only when a probe is present.
        Plain loops, not any(generator): this runs on every string of every event."""
        values = self._values
        if values is not None:
            for probe in values[1]:
                if probe in text:
                    return values[0].sub(MASK, text)
        return text

    def text(self, value: str) -> str:
        # Substring tests first (str.find skips through text at memory speed), the regexes
        # only where they can match: a run's transcript is mostly text holding no secret.
        value = self._mask_values(value)
        low = value.lower()
        if not _has_trigger(low):  # the common case: nothing credential-shaped
            return value
        for index, (_, repl, triggers) in enumerate(_PATTERN_SOURCES):
            if any(t in low for t in triggers):
                value = _Compiled.pattern(index).sub(repl, value)
        return value

    def text_lines(self, lines: list[str]) -> str:
        """Lines (without newlines) redacted each as text() would, joined by newlines: the
        secret values in one pass over the whole, and a credential pattern only on the lines
        holding one of its triggers (not over the whole: a busy run log writes 64 KiB at once)."""
        block = self._mask_values("\n".join(lines))
        low = block.lower()
        if not _has_trigger(low):
            return block
        hits = [(index, triggers) for index, (_, _, triggers) in enumerate(_PATTERN_SOURCES)
                if any(t in low for t in triggers)]
        out = block.split("\n")
        for number, line_low in enumerate(low.split("\n")):
            for index, triggers in hits:
                if any(t in line_low for t in triggers):
                    out[number] = _Compiled.pattern(index).sub(_PATTERN_SOURCES[index][1], out[number])
        return "\n".join(out)

    def __call__(self, value: Any) -> Any:
        """Redact a str, bytes, or any JSON-shaped structure (a new object is returned)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bytes):
            return self.text(value.decode("utf-8", "replace"))
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for k, v in value.items():
                if secret_key(k) and v not in (None, ""):
                    out[k] = MASK
                elif v is None or type(v) in _PLAIN:  # nothing to redact in a number (most event fields)
                    out[k] = v
                else:
                    out[k] = self(v)
            return out
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        return value
