"""The execution policy as OpenCode permission rules, given to each run's session.

OpenCode has no sandbox: what the policy forbids, its permission rules must (a session's
rules are checked after the config's and the agent's, and the last match wins: measured
on 1.18.33). Its commands (Bash) run with the server's rights; `network: false` can only
take away its web tools, not a command's sockets (docs/backends.md says so).

| policy | rules |
| --- | --- |
| always | `question` deny (no one to answer), `task` deny (a subagent's session would not carry these rules) |
| sandbox read-only | `edit` and `bash` deny (a command could write); with approval on-request: ask |
| network false | `webfetch`, `websearch`, `codesearch` deny |
| approval (never or on-request) | OpenCode's own asks (a path outside the workspace, a repeated call, |
|  | reading a .env) stay asks, and every ask is rejected: no one approves an unattended run |
"""
from __future__ import annotations

from typing import Any

from caldera.backends.base import Policy

REJECT_MESSAGE = ("The execution policy of this unattended run allows no approvals: this call was "
                  "rejected. Continue without it, or stop and say what you needed.")


def rules(policy: Policy) -> list[dict[str, Any]]:
    out = [_rule("question", "deny"), _rule("task", "deny")]
    if policy.sandbox == "read-only":
        action = "ask" if policy.approval == "on-request" else "deny"
        out += [_rule("edit", action), _rule("bash", action)]
    if not policy.network:
        out += [_rule("webfetch", "deny"), _rule("websearch", "deny"), _rule("codesearch", "deny")]
    return out


def _rule(permission: str, action: str, pattern: str = "*") -> dict[str, Any]:
    return {"permission": permission, "pattern": pattern, "action": action}
