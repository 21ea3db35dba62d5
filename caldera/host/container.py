"""Whether this host is a container, and what says so.

`CALDERA_RUN_SANDBOX=external` (the code agents' commands run without the backends' own
sandbox: the container is the sandbox) is taken only where the host is one; on a machine
that is not, the setting would take every command out of its sandbox with nothing around
it, so it is refused (backends/registry.confinement). The evidence is what container
runtimes leave behind, as systemd-detect-virt reads it, plus caldera's own: `caldera run`
as PID 1 of its PID namespace (docs/container.md, "PID 1"), which happens only in one.

| evidence | left by |
| --- | --- |
| `container=NAME` in this process's or PID 1's environment | systemd-nspawn, Podman, LXC, systemd's own convention |
| `/run/systemd/container` | systemd-nspawn (and systemd inside any container) |
| `/.dockerenv` | Docker |
| `/run/.containerenv` | Podman, CRI-O |
| `KUBERNETES_SERVICE_HOST` in the environment | every container of a Kubernetes pod (a ClawManager instance) |
| PID 1 is `caldera run` | caldera as an image's command |

A machine where none of them holds is "not a container". A container that leaves none
(a runtime of its own making) sets `container=NAME` in the image's environment.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

MARKER_FILES = (("/run/systemd/container", "systemd's"), ("/.dockerenv", "Docker's"),
                ("/run/.containerenv", "Podman's"))
READ_CAP = 64 * 1024  # /proc/1/environ and cmdline are small; never read more


def evidence(environ: Mapping[str, str] | None = None, root: str = "/") -> str | None:
    """What says this host is a container (one short phrase), or None. `environ`: this
    process's environment (os.environ; never an agent's agent.env, which its configuration
    writes); `root`: for tests."""
    env = os.environ if environ is None else environ
    if env.get("container"):
        return f"container={env['container']} in the environment"
    pid1_env = _nul_fields(os.path.join(root, "proc/1/environ"))
    named = next((f for f in pid1_env if f.startswith(b"container=") and len(f) > 10), None)
    if named is not None:
        return f"{named.decode('utf-8', 'replace')} in PID 1's environment"
    for path, whose in MARKER_FILES:
        if os.path.exists(os.path.join(root, path.lstrip("/"))):
            return f"{path} ({whose})"
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "KUBERNETES_SERVICE_HOST (a Kubernetes pod)"
    argv = _nul_fields(os.path.join(root, "proc/1/cmdline"))
    if any(os.path.basename(a) == b"caldera" for a in argv[:2]) and b"run" in argv[1:3]:
        return "caldera run is PID 1"
    return None


def _nul_fields(path: str) -> list[bytes]:
    """A /proc file's NUL-separated fields; [] when it cannot be read (another user's PID 1)."""
    try:
        with open(path, "rb") as fh:
            return [f for f in fh.read(READ_CAP).split(b"\0") if f]
    except OSError:
        return []
