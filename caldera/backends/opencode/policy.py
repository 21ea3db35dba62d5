"""The execution policy as OpenCode permission rules, given to each run's session.

OpenCode has no sandbox: its own tools obey the permission rules (a session's rules are
checked after the config's and the agent's, and the last match wins: measured on 1.18.33);
its Bash commands run with the server's rights, so they run only where bubblewrap confines
them (confine.py: writes only in the turn's workspace, the runtime's roots, secrets and the
server's own dir hidden, no capability, and with `network: false` no network at all); where it
cannot, Bash is denied.

| policy | rules |
| --- | --- |
| always | `question` deny (no one to answer), `task` deny (a subagent's session would not carry these rules) |
| no confinement (no bubblewrap, and not `CALDERA_RUN_SANDBOX=external`) | `bash` deny |
| sandbox read-only | `edit` and `bash` deny (a command could write); with approval on-request: ask |
| network false | `webfetch`, `websearch`, `codesearch` deny (they run in the server's process) |
| no `rg` on PATH | `grep`, `glob` deny (OpenCode would download ripgrep from GitHub into its data dir) |
| approval (never or on-request) | OpenCode's own asks (a path outside the workspace, a repeated call, |
|  | reading a .env) stay asks, and every ask is rejected: no one approves an unattended run |
"""
from __future__ import annotations

from typing import Any

from caldera.backends.base import Policy
from caldera.backends.confine import PROC1_READABLE

REJECT_MESSAGE = ("The execution policy of this unattended run allows no approvals: this call was "
                  "rejected. Continue without it, or stop and say what you needed.")


def rules(policy: Policy, confined: bool, search: bool = True) -> list[dict[str, Any]]:
    """The session's rules; `confined`: the server's commands run under bubblewrap; `search`:
    ripgrep (`rg`) is on the server's PATH."""
    out = [_rule("question", "deny"), _rule("task", "deny")]
    if not search:
        out += [_rule("grep", "deny"), _rule("glob", "deny")]
    if policy.sandbox == "read-only":
        action = "ask" if policy.approval == "on-request" else "deny"
        out += [_rule("edit", action), _rule("bash", action if confined else "deny")]
    elif not confined:
        out.append(_rule("bash", "deny"))
    if not policy.network:
        out += [_rule("webfetch", "deny"), _rule("websearch", "deny"), _rule("codesearch", "deny")]
    return out


def commands(policy: Policy, confined: bool) -> str:
    """What the run's Bash commands get, as `backend_status` `starting` says it."""
    if policy.sandbox == "read-only":
        return "denied (read-only: a command could write)"
    if policy.external:
        return ("unconfined by caldera (CALDERA_RUN_SANDBOX=external: the container is the sandbox)"
                + PROC1_READABLE)
    if not confined:
        return ("denied (bubblewrap is not there, cannot start here, or cannot nest in the server's sandbox: "
                "nothing would confine them)")
    return "confined (bubblewrap)" + ("" if policy.network else ", no network")


def _rule(permission: str, action: str, pattern: str = "*") -> dict[str, Any]:
    return {"permission": permission, "pattern": pattern, "action": action}


def search(found: bool) -> str:
    """What the run's grep and glob tools get, as `backend_status` `ready` says it."""
    if found:
        return "ripgrep"
    return "grep and glob denied: ripgrep (rg) is not on PATH, and OpenCode would download it (install ripgrep)"
