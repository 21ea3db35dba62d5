"""The run's `model_catalog_json` on the AI gateway: Codex's bundled catalogue plus the gateway's
models it lacks.

Codex 0.169 takes `model_catalog_json` *instead of* its bundled catalogue: a file listing only
the gateway's models would strip a model Codex knows (gpt-5.5) of its base instructions (a
21,640-byte developer message), its reasoning effort and its tool set. So the file holds the
bundled models as Codex prints them (`codex debug models --bundled`: no network, measured 0.04 s
and 745 KB for 12 models with 0.169) and an entry (codex_config.gateway_model_entry) only for a
gateway model that is not among them; when every gateway model is known, no file at all.

The bundled list is read once per binary (path, mtime, size) and kept as its bytes. Reading it
is bounded (BUNDLED_TIMEOUT, BUNDLED_CAP) and fails safe: without it the run writes no
catalogue (Codex's own: a model it lacks then runs on its fallback metadata, without
apply_patch) rather than one that would replace what Codex knows.
"""
from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from typing import Any

from caldera.backends.codex.binary import PerBinary
from caldera.host import proc
from caldera.host.jsonlimits import loads

BUNDLED_TIMEOUT = 10.0
BUNDLED_CAP = 16 * 1024 * 1024
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"



def run_catalogue(binary: str, gateway: list[dict[str, Any]],
                  note: Callable[[str], None] | None = None) -> list[dict[str, Any]] | None:
    """The models of the run's `model_catalog_json`: the bundled ones and the `gateway` entries
    whose slug they lack; None when no file is to be written (every gateway model is known, or
    the bundled list cannot be read: `note` says so)."""
    bundled = bundled_models(binary)
    if bundled is None:
        if note is not None:
            note("codex debug models --bundled gave no catalogue: the gateway's models run on Codex's own "
                 "(a model it lacks gets its fallback metadata, without apply_patch)")
        return None
    known = {m["slug"] for m in bundled}
    missing = [entry for entry in gateway if entry["slug"] not in known]
    return bundled + missing if missing else None


def bundled_models(binary: str) -> list[dict[str, Any]] | None:
    """Codex's bundled catalogue (each model a dict with a string `slug`), or None."""
    raw = _bundled.get(binary)
    return None if raw is None else _models(raw)


def _read(binary: str) -> tuple[bytes | None, bool]:
    """(The bundled list as JSON, or None: the command failed, timed out, said too much or
    printed something else; whether that holds for this binary). Run with an empty CODEX_HOME
    (no config of anyone's is read)."""
    with tempfile.TemporaryDirectory(prefix="caldera-codex-models-") as home:
        result = proc.run([binary, "debug", "models", "--bundled"],
                          env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "HOME": home, "CODEX_HOME": home},
                          timeout=BUNDLED_TIMEOUT, stdout_cap=BUNDLED_CAP)
    if not result.ok:
        return None, not result.timed_out
    models = _models(result.stdout)
    return (json.dumps(models).encode() if models else None), True


_bundled: PerBinary[bytes] = PerBinary(_read)  # the bundled list's JSON, per binary


def _models(raw: bytes) -> list[dict[str, Any]] | None:
    try:
        doc = loads(raw, max_bytes=BUNDLED_CAP, what="codex debug models")
    except ValueError:  # JSONLimitError, or not JSON at all
        return None
    models = doc.get("models") if isinstance(doc, dict) else doc
    if not isinstance(models, list) or not all(isinstance(m, dict) and isinstance(m.get("slug"), str)
                                               for m in models):
        return None
    return models
