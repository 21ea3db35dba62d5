"""What a config revision may tell a process agent (SPEC sections 7b and 11): the content of
its `instructions` file, and the `url` of the `mcp` servers the manifest installed as url
servers. Never a `command` entry, never a new server, never a path: those come from the
blueprint an operator installed. A revision that breaks this is refused whole, naming the key.

(The general rule for whole-manifest updates is the trust boundary of issue 14,
`caldera.agents.trust`; this checks only the two content keys a revision carries.)
"""
from __future__ import annotations

from caldera.agents.process import files
from caldera.agents.manifest import check_mcp_server
from caldera.errors import ConfigError
from caldera.host.fsutil import atomic_write_bytes, atomic_write_json, ensure_dir

TOLD = ("instructions", "mcp")


def check_told(driver, content: dict) -> list[str]:
    """Why the revision's `instructions`/`mcp` may not be applied (one sentence each), or []."""
    spec = getattr(driver, "spec", None)
    if spec is None or not hasattr(driver, "supervisor"):
        return [f"{key}: only a process-mode agent is told {key}" for key in TOLD if key in content]
    problems = []
    if "instructions" in content:
        text = content["instructions"]
        if spec.instructions is None:
            problems.append("instructions: the installed manifest declares no instructions file")
        elif not isinstance(text, str) or len(text.encode("utf-8", "surrogatepass")) > files.INSTRUCTIONS_MAX:
            problems.append("instructions: must be text of at most 1 MiB")
    if "mcp" in content:
        problems.extend(_mcp_problems(spec.mcp, content["mcp"]))
    return problems


def _mcp_problems(installed: dict, proposed) -> list[str]:
    if not isinstance(proposed, dict):
        return ["mcp: must be a mapping of server name to {url: …}"]
    problems = []
    for name, server in proposed.items():
        base = installed.get(name)
        if not isinstance(base, dict) or "url" not in base:
            kind = "not installed" if base is None else "a command server the host starts"
            problems.append(f"mcp.{name}: {kind}; a revision may only replace the url of an installed url server")
            continue
        if not isinstance(server, dict) or set(server) != {"url"}:
            problems.append(f"mcp.{name}: a revision may carry only {{url: …}}, never a command")
            continue
        try:
            check_mcp_server(name, server, "revision")
        except ConfigError as exc:
            problems.append(str(exc).replace("revision: ", ""))
    return problems


def apply_told(driver, content: dict) -> dict:
    """Write the overrides, rebuild the agent's files, tell it (SIGHUP). Checked before."""
    overrides = ensure_dir(files.overrides_dir(driver.paths.state_dir))
    applied = []
    if "instructions" in content:
        atomic_write_bytes(overrides / files.INSTRUCTIONS, content["instructions"].encode("utf-8"), mode=0o600)
        applied.append("instructions")
    if "mcp" in content:
        urls = {name: server["url"] for name, server in content["mcp"].items()}
        atomic_write_json(overrides / "mcp-urls.json", urls, mode=0o600)
        applied.append("mcp")
    told = driver.files_changed()
    return {"applied": applied, "agent_told": told}
