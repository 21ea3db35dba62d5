"""Request bodies checked against schemas/protocol/ the way Go decodes them.

Go's encoding/json refuses 5.0 for an int field, and jsonschema's "integer"
accepts it; the type checker here is redefined so that only a JSON integer
passes. jsonschema is imported on first use (the operator CLI never needs it).
"""
from __future__ import annotations

import datetime as dt
import functools
import json
from typing import TYPE_CHECKING, Any

from caldera.host.jsonlimits import JSONLimitError
from caldera.host.jsonlimits import loads as bounded_loads
from caldera.protocol import schemas

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

BODY_MAX_BYTES = 8 * 1024 * 1024  # JSON bodies; the server refuses larger ones (413) before reading them


class BodyError(ValueError):
    """The body breaks its schema; the message names the place (answered as 400)."""


@functools.cache
def _validator(name: str) -> Validator:
    import jsonschema  # deferred: see module docstring

    with (schemas.schema_dir() / "protocol" / name).open(encoding="utf-8") as fh:
        schema = json.load(fh)
    base = jsonschema.validators.validator_for(schema)
    base.check_schema(schema)
    strict = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return jsonschema.validators.extend(base, type_checker=strict)(schema)


def check(name: str, document: Any) -> None:
    """Raise BodyError with the first problem (by path) when `document` breaks `name`."""
    errors = sorted(_validator(name).iter_errors(document), key=lambda e: [str(p) for p in e.path])
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.path) or "(top level)"
        raise BodyError(f"{name.split('.')[0]}: {where}: {err.message}")


def parse_json_body(raw: bytes) -> Any:
    """The decoded body (the one bounded parser: 64 levels deep at most); an empty body is
    Go's 'EOF', bad JSON names the place. Every failure is a BodyError, answered as 400."""
    if not raw.strip():
        raise BodyError("EOF")
    try:
        return bounded_loads(raw, max_bytes=BODY_MAX_BYTES, what="body")
    except JSONLimitError as exc:
        raise BodyError(str(exc)) from None
    except ValueError as exc:
        raise BodyError(f"invalid JSON: {exc}") from None


def parse_time(value: str | None, field: str) -> float | None:
    """An RFC 3339 time (the schema checked its shape) as a Unix time; None when unset."""
    if value is None:
        return None
    text = value.replace("Z", "+00:00").replace("z", "+00:00")
    if "." in text:  # Python keeps microseconds; Go sends up to nanoseconds
        head, _, rest = text.partition(".")
        digits = rest[:len(rest) - len(rest.lstrip("0123456789"))]  # the leading ASCII digits
        text = f"{head}.{digits[:6].ljust(6, '0')}{rest[len(digits):]}"
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise BodyError(f"{field}: parsing time {value!r}: {exc}") from None
    if when.tzinfo is None:
        raise BodyError(f"{field}: parsing time {value!r}: no time zone offset")
    return when.timestamp()
