"""The secret projection of one backend (SPEC section 10, seed 003's credential boundary):
`<secrets>/<backend>/`, else systemd's `$CREDENTIALS_DIRECTORY/<backend>/`, else the
credentials flat in `$CREDENTIALS_DIRECTORY`, named as `LoadCredential=<backend>:DIR`
names them (`<backend>_config.toml`, `<backend>_env_NAME`).

Read-only, bounded (1 MiB a file), and nothing read here is ever printed: a file that is
there but cannot be read is `secret-unavailable`, naming the file, never its content.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from caldera.backends.failures import SECRET_UNAVAILABLE, BackendFailure

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_SECRET_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Projection:
    """Read-only view of the projected files of one backend: under `root`, or flat in
    `flat` (systemd's credentials, named `<backend>_<name>`), or nowhere (both None)."""

    root: Path | None
    flat: Path | None = None
    label: str = "secrets/codex"
    backend: str = "codex"

    @classmethod
    def locate(cls, secrets_dir: str | os.PathLike[str] | None = None,
               credentials_dir: str | os.PathLike[str] | None = None, backend: str = "codex") -> Projection:
        # A directory that cannot be looked at counts as there: its reads then fail with a
        # sentence (secret-unavailable), never a PermissionError out of is_dir (issue 39).
        if secrets_dir and _is_dir(Path(secrets_dir, backend)):
            return cls(Path(secrets_dir, backend), label=f"{secrets_dir}/{backend}", backend=backend)
        if credentials_dir:
            cred = Path(credentials_dir)
            if _is_dir(cred / backend):
                return cls(cred / backend, label=f"$CREDENTIALS_DIRECTORY/{backend}", backend=backend)
            if _is_dir(cred):
                return cls(None, flat=cred, label="$CREDENTIALS_DIRECTORY", backend=backend)
        return cls(None, label=f"{secrets_dir or 'secrets'}/{backend}", backend=backend)

    def _path(self, name: str) -> Path | None:
        if self.root is not None:
            return self.root / name
        if self.flat is not None:
            return self.flat / (f"{self.backend}_" + name.replace("/", "_"))
        return None

    def read(self, name: str) -> bytes | None:
        """The file's bytes, None when absent; secret-unavailable when present but unreadable."""
        path = self._path(name)
        if path is None:
            return None
        try:
            with open(path, "rb") as fh:
                data = fh.read(MAX_SECRET_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BackendFailure(SECRET_UNAVAILABLE, f"{self.label}/{name}: cannot read ({exc.strerror})") from None
        if len(data) > MAX_SECRET_FILE_BYTES:
            raise BackendFailure(SECRET_UNAVAILABLE, f"{self.label}/{name}: larger than 1 MiB")
        return data

    def env_names(self) -> list[str]:
        if self.root is not None:
            try:
                entries = os.listdir(self.root / "env")
            except FileNotFoundError:
                return []
            except OSError as exc:
                raise BackendFailure(SECRET_UNAVAILABLE, f"{self.label}/env: cannot list ({exc.strerror})") from None
            return sorted(n for n in entries if ENV_NAME_RE.match(n))
        if self.flat is not None:
            prefix = f"{self.backend}_env_"
            try:
                entries = os.listdir(self.flat)
            except OSError as exc:
                raise BackendFailure(SECRET_UNAVAILABLE, f"{self.label}: cannot list ({exc.strerror})") from None
            names = (n[len(prefix):] for n in entries if n.startswith(prefix))
            return sorted(n for n in names if ENV_NAME_RE.match(n))
        return []

    def env(self) -> dict[str, str]:
        """Every `env/NAME` file's value (NAME -> text without its trailing newline)."""
        return {name: env_value(self.read(f"env/{name}") or b"", f"{self.label}/env/{name}")
                for name in self.env_names()}


def _is_dir(path: Path) -> bool:
    """A directory, or something this user may not look at (EACCES on the way)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except PermissionError:
        return True
    except OSError:
        return False


def env_value(raw: bytes, label: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BackendFailure(SECRET_UNAVAILABLE, f"{label}: not UTF-8") from None
    text = text.rstrip("\r\n")  # files usually end in a newline; the value does not
    if "\0" in text:
        raise BackendFailure(SECRET_UNAVAILABLE, f"{label}: holds a NUL byte")
    return text
