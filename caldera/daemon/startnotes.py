"""What `caldera run` and `caldera report --once` say once at their start, that would
otherwise go unsaid (docs/runtime.md, "Warnings at start")."""
from __future__ import annotations

import logging

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from caldera.daemon.wiring import Parts

log = logging.getLogger("caldera.daemon")


def start_warnings(parts: Parts) -> None:
    """Said once at start, what would otherwise go unsaid: a CALDERA_* name in agent.env or
    secrets.env that caldera does not read (a misspelling is ignored silently), a --manifest
    agent's state an older caldera left under the current directory, and an agent
    whose command cannot start at all (a missing script): every adapter call would fail
    (python's exit 2 reads as "verb not known"), a process agent would be restarted again and
    again. The daemon runs all the same (a fix needs a reload, or none)."""
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
    manifest = parts.current.manifest
    if manifest is None or manifest.runtime_type not in ("adapter", "process"):
        return
    who = "adapter" if manifest.runtime_type == "adapter" else "agent"
    problem = start_problem(manifest.command, manifest.workdir, manifest.path, SAFE_PATH, who)
    if problem:
        log.warning("the %s cannot start: %s (caldera check names every problem of the manifest)", who, problem)
