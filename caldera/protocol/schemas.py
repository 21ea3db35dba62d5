"""Where the published JSON schemas live, and validation against them.

The schemas travel inside the package (`caldera/schemas`, package data; in the source tree
a link to the top-level `schemas/`, their one copy): a checkout, an editable install, a
wheel and the Debian package all read them beside the caldera that runs (issue 35), as files
next to its `__init__.py`: every install of caldera is one on disk (no zip import), and
importlib.resources would bring `tempfile`, `shutil` (with bz2, lzma) and `zipfile` into the
daemon on its first command, 0.9 MiB of its PSS (docs/performance.md, section 10).
CALDERA_SCHEMA_DIR wins over them.

jsonschema is costly to import, in CPU and in memory (docs/performance.md), so it
is imported only when a validator is first asked for; local CLI verbs never ask.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import caldera
from caldera import TYPE_CHECKING, config

if TYPE_CHECKING:
    from typing import Any

    from jsonschema.protocols import Validator

class SchemaError(ValueError):
    """A document does not match its schema; the message names the place."""


def schema_dir() -> Path:
    override = config.schema_dir_override()
    if override:
        return override
    return _packaged()


@functools.cache
def _packaged() -> Path:
    found = Path(os.path.dirname(caldera.__file__)) / "schemas"
    if not found.is_dir():
        raise FileNotFoundError(f"caldera's schemas are not in its package ({found}): a broken install")
    return found


def schema_exists(name: str) -> bool:
    return (schema_dir() / name).is_file()


# Keywords that assert nothing: a schema with only these and `"type": "object"` is an
# object check (most command payloads: pause, resume, settings_get, health_check, …).
ANNOTATIONS = frozenset({"$schema", "$id", "title", "description"})


def _schema(name: str) -> dict[str, Any]:
    return _load(str(schema_dir()), name)


@functools.cache
def _load(where: str, name: str) -> dict[str, Any]:
    """`where`, the directory's name, keys the cache only (CALDERA_SCHEMA_DIR may change it)."""
    with (schema_dir() / name).open(encoding="utf-8") as fh:
        return json.load(fh)


def _only_an_object(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "object" and set(schema) <= ANNOTATIONS | {"type"}


@functools.cache
def _validator(name: str) -> Validator:
    import jsonschema  # deferred: see module docstring

    schema = _schema(name)
    # The schemas are checked against their metaschema by the test suite
    # (tests/protocol/test_protocol_schemas.py); check_schema here would cost more
    # than the validation itself on every start.
    return jsonschema.validators.validator_for(schema)(schema)


def validate(name: str, document: Any) -> None:
    """Raise SchemaError naming the first problem (by path) if `document` breaks schema `name`."""
    if _only_an_object(_schema(name)):
        # jsonschema's verdict and message, without importing it: a daemon that only gets
        # such commands never imports jsonschema (its RSS: docs/performance.md, section 2)
        if not isinstance(document, dict):
            raise SchemaError(f"(top level): {document!r} is not of type 'object'")
        return
    errors = sorted(_validator(name).iter_errors(document), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.path) or "(top level)"
        raise SchemaError(f"{where}: {err.message}")


def problems(name: str, document: Any) -> list[str]:
    """Every problem of `document` against schema `name`, "path: message", ordered by path
    (`caldera check` names each bad key, not only the first)."""
    errors = sorted(_validator(name).iter_errors(document), key=lambda e: [str(p) for p in e.path])
    return [f"{'.'.join(str(p) for p in e.path) or '(top level)'}: {e.message}" for e in errors]
