"""The host's verbs in process mode: `caldera pause|resume|run-now|settings|log` ask the
daemon that owns the agent, over its control socket. Without a daemon there is no
process to act on: the verb says so and exits 1 (SPEC section 7b)."""
from __future__ import annotations

import os

from caldera import TYPE_CHECKING
from caldera.agents.adapter.answer import DONE, FAILED, REFUSED, Answer
from caldera.agents.process import control
from caldera.errors import UsageError

if TYPE_CHECKING:
    import argparse
    from typing import Any

    from caldera.agents.manifest import Manifest
    from caldera.config import AgentPaths

NO_DAEMON = ("no caldera runtime is running for agent {name}; in process mode the verbs act through it "
             "(start it: {start})")
SYSTEMD_BOOTED = "/run/systemd/system"  # sd_booted()'s test: the unit can be started here


def how_to_start(args: argparse.Namespace, name: str) -> str:
    """The runtime's start for the agent as this command named it: a --manifest agent has no unit."""
    if getattr(args, "manifest", None):
        state = f" --state-dir {args.state_dir}" if getattr(args, "state_dir", None) else ""
        return f"caldera run --manifest {args.manifest}{state}"
    if os.path.isdir(SYSTEMD_BOOTED):
        return f"systemctl start caldera@{name}, or caldera run --agent {name}"
    return f"caldera run --agent {name}"


def ask(paths: AgentPaths, verb: str, args: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The daemon's reply, or None when no daemon listens."""
    try:
        return control.call(paths.state_dir, verb, args)
    except control.NoDaemon:
        return None
    except PermissionError:
        return {"ok": False, "message": f"{paths.state_dir}: permission denied (run as the runtime's user or root)",
                "held": []}


def to_answer(verb: str, reply: dict[str, Any]) -> Answer:
    ok = bool(reply.get("ok"))
    answer = Answer(verb=reply.get("verb") or verb, kind=DONE if ok else REFUSED, message=reply.get("message"),
                    held=reply.get("held") or [])
    answer.data = reply.get("data")
    answer.text, answer.truncated = reply.get("text"), bool(reply.get("truncated"))
    return answer


def dispatch(args: argparse.Namespace, paths: AgentPaths, manifest: Manifest) -> Answer:
    if args.command in ("pause", "resume", "run-now"):
        verb, payload = args.command, None
    elif args.command == "settings" and args.action == "get":
        verb, payload = "settings get", None
    elif args.command == "settings":
        from caldera.agents.settings import parse_pairs

        try:
            values = parse_pairs(args.pairs, manifest.settings_schema)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        verb, payload = "settings set", {"values": values}
    elif args.name is not None and not args.list:
        verb, payload = "log", {"name": args.name}
    else:
        verb, payload = "log --list", None
    reply = ask(paths, verb, payload)
    if reply is None:
        return Answer(verb=verb, kind=FAILED, message=no_daemon(args, paths))
    return to_answer(verb, reply)


def no_daemon(args: argparse.Namespace, paths: AgentPaths) -> str:
    """No runtime listens at this state dir: how to start one, unless this agent's runtime runs
    with another state dir (a second one would start a second copy of the agent)."""
    from caldera.host.procscan import naming, runtime_elsewhere

    other = runtime_elsewhere(paths)
    if other is None:
        return NO_DAEMON.format(name=paths.name, start=how_to_start(args, paths.name))
    if other.state_dir is None:
        where = "another state dir, which this user cannot see (its environment is another user's)"
    else:
        where = f"state dir {other.state_dir}: name that one ({naming(paths, other)})"
    return (f"no caldera runtime holds the state dir {paths.state_dir} of agent {paths.name}, but pid {other.pid} "
            f"runs it with {where}; starting another would start a second copy of the agent")
