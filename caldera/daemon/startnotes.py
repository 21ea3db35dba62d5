"""What `caldera run` and `caldera report --once` say once at their start, that would
otherwise go unsaid (docs/runtime.md, "Warnings at start")."""
from __future__ import annotations

import logging

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from caldera.daemon.wiring import Parts

log = logging.getLogger("caldera.daemon")


def start_warnings(parts: Parts) -> None:
    """Said once at start, what would otherwise go unsaid: a CALDERA_* name in agent.env or
    secrets.env that caldera does not read (a misspelling is ignored silently), a --manifest
    agent's state an older caldera left under the current directory, and an agent
    whose command cannot start at all (a missing script): every adapter call would fail
    (python's exit 2 reads as "verb not known"), a process agent would be restarted again and
    again; a CALDERA_RUN_SANDBOX the code-agent runs refuse (docs/container.md). The daemon runs
    all the same (a fix needs a reload, or none)."""
    from caldera.agents.adapter.invoke import SAFE_PATH
    from caldera.agents.startprobe import start_problem
    from caldera.config import state_left_here, unknown_variables

    for file, name, close in unknown_variables(parts.paths):
        log.warning("%s: %s is not a variable caldera reads%s", file, name,
                    f" (did you mean {close}?)" if close else "")
    older = state_left_here(parts.paths)
    if older is not None:
        log.warning("%s holds this agent's state from an older caldera (it kept a --manifest agent's state under "
                    "the directory the command was typed in); its state is now %s: stop this runtime and move the "
                    "files there, or run it with --state-dir %s", older, parts.paths.state_dir, older)
    sandbox = run_sandbox_problem(parts.current.settings.env)
    if sandbox:
        log.warning("every code-agent run will be refused: %s", sandbox)
    manifest = parts.current.manifest
    if manifest is None or manifest.runtime_type not in ("adapter", "process"):
        return
    who = "adapter" if manifest.runtime_type == "adapter" else "agent"
    problem = start_problem(manifest.command, manifest.workdir, manifest.path, SAFE_PATH, who)
    if problem:
        log.warning("the %s cannot start: %s (caldera check names every problem of the manifest)", who, problem)


def run_sandbox_problem(env: Mapping[str, str]) -> str | None:
    """The sentence every code-agent run would be refused with because of CALDERA_RUN_SANDBOX
    (a bad value, or `external` on a host that is not a container); None when it is fine or unset."""
    if not env.get("CALDERA_RUN_SANDBOX"):
        return None
    from caldera.backends.registry import Refused, confinement

    try:
        confinement(env)
    except Refused as exc:
        return str(exc)
    return None
