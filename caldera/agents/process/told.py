"""What a config revision may tell a process agent (SPEC sections 7b and 11): the content of
its `instructions` file, and `mcp` url entries (changed or added). Never a `command` entry,
never a path: those come from the blueprint an operator installed. The rule is the trust
boundary's own (`caldera.agents.trust.check_update`); this adds what only process mode knows
(an instructions file must be declared, the text's size, each entry's shape). A revision that
breaks it is refused whole, naming the key.
"""
from __future__ import annotations

import copy

from caldera import TYPE_CHECKING
from caldera.agents.manifest import check_mcp_server
from caldera.agents.process import files
from caldera.errors import ConfigError
from caldera.host.fsutil import atomic_write_bytes, atomic_write_json, ensure_dir

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    from caldera.agents.process.spec import ProcessSpec


def check_told(spec: ProcessSpec, installed: dict[str, Any], content: dict[str, Any]) -> list[str]:
    """Why the revision's `instructions`/`mcp` may not be applied (one sentence each), or [].
    `installed`: the installed manifest's document (its mcp entries)."""
    problems: list[str] = []
    if "instructions" in content:
        text = content["instructions"]
        if spec.instructions is None:
            problems.append("instructions: the installed manifest declares no instructions file")
        elif not isinstance(text, str) or len(text.encode("utf-8", "surrogatepass")) > files.INSTRUCTIONS_MAX:
            problems.append("instructions: must be text of at most 1 MiB")
    if "mcp" in content:
        problems.extend(_mcp_problems(installed, content["mcp"]))
    return problems


def _mcp_problems(installed: dict[str, Any], proposed: Any) -> list[str]:
    """The trust boundary's own rule (agents/trust.check_update: url entries may change, a
    command entry never), then each entry's shape."""
    if not isinstance(proposed, dict):
        return ["mcp: must be a mapping of server name to {url: …}"]
    from caldera.agents import trust

    after = copy.deepcopy(installed)
    after["mcp"] = {**(installed.get("mcp") or {}), **proposed}
    problems = trust.check_update(installed, after)
    for name, server in proposed.items():
        if any(p.startswith(f"mcp.{name}") for p in problems):
            continue
        try:
            check_mcp_server(str(name), server, "revision")
        except ConfigError as exc:
            problems.append(str(exc).replace("revision: ", ""))
    return problems


def apply_told(state_dir: Path, content: dict[str, Any], files_changed: Callable[[], bool]) -> dict[str, Any]:
    """Write the overrides into the agent's state dir, then `files_changed()` (rebuild the
    agent's files, tell it: SIGHUP; True when a running agent was told). Checked before."""
    overrides = ensure_dir(files.overrides_dir(state_dir))
    applied = []
    if "instructions" in content:
        atomic_write_bytes(overrides / files.INSTRUCTIONS, content["instructions"].encode("utf-8"), mode=0o600)
        applied.append("instructions")
    if "mcp" in content:
        urls = {name: server["url"] for name, server in content["mcp"].items()}
        atomic_write_json(overrides / "mcp-urls.json", urls, mode=0o600)
        applied.append("mcp")
    told = files_changed()
    return {"applied": applied, "agent_told": told}
