"""`caldera turn` (one code-agent turn on this host, events as JSON lines) and
`caldera backends` (the backend profiles and their capabilities).

`caldera turn` works with an installed agent (its agent.env caps, secrets/ and
state dir) or standalone with `--secrets DIR` (state under --state-dir, else
$XDG_STATE_HOME/caldera/turn). The person at the host picks the workspace, so the
workspace-roots check of agent_run does not apply; the policy caps do.
"""
from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caldera import config
from caldera.backends import base, leftovers, service
from caldera.cli import add_agent_flags
from caldera.errors import ConfigError, UsageError
from caldera.host.stopsignals import on_signals
from caldera.redact import Redactor

if TYPE_CHECKING:
    import argparse

    from caldera.backends.registry import ActiveRuns

# (env, state_dir, secrets_dir, secret values) of the agent a turn runs for
AgentContext = tuple[dict[str, str], Path | None, Path | None, tuple[str, ...]]


def configure(parser: argparse.ArgumentParser, name: str) -> None:
    add_agent_flags(parser)
    if name == "turn":
        parser.add_argument("--workspace", required=True, metavar="DIR", help="the directory the agent works in")
        # The names come from the backend registry, the one list (schemas/commands/agent_run's
        # enum is checked against it by tests/backends/test_backends_profiles.py).
        parser.add_argument("--backend", default=base.DEFAULT_PROFILE, choices=tuple(base.PROFILES),
                            help=f"backend profile: {_or(base.PROFILES)} (default {base.DEFAULT_PROFILE})")
        parser.add_argument("--secrets", metavar="DIR",
                            help=f"secret projection elsewhere (DIR holds {', '.join(f'{p}/' for p in base.PROFILES)})")
        parser.add_argument("--timeout", type=int, metavar="S", help="execution_policy.timeout_seconds")
        parser.add_argument("--sandbox", choices=("read-only", "workspace-write"))
        parser.add_argument("--approval", choices=("never", "on-request"))
        parser.add_argument("--network", action="store_true", help="allow network access (if the caps do)")
        parser.add_argument("--model", help="model name (else the projection's)")
        parser.add_argument("--run-id", help="run id (default: a new one)")
        parser.add_argument("prompt", metavar="PROMPT")


def _or(names: Iterable[str]) -> str:
    """The names as "a, b or c"."""
    found = list(names)
    return ", ".join(found[:-1]) + f" or {found[-1]}" if len(found) > 1 else "".join(found)


def main(args: argparse.Namespace) -> int:
    if args.command == "backends":
        return _backends(args)
    return _turn(args)


def _agent_context(args: argparse.Namespace) -> AgentContext:
    """(env, state_dir, secrets_dir, redactor values) of the selected agent, or standalone."""
    explicit = args.agent or args.manifest or config.selected_agent()
    try:
        paths = config.agent_from_args(args)
        settings = config.load_settings(paths)
    except ConfigError:
        if explicit:
            raise
        return dict(os.environ), None, None, ()
    return dict(settings.env), paths.state_dir, paths.secrets_dir, settings.secret_values


def _standalone_state(args: argparse.Namespace) -> Path:
    if args.state_dir:
        return Path(args.state_dir)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "caldera" / "turn"


def _turn(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.workspace):
        raise UsageError(f"--workspace {args.workspace}: no such directory (the directory the code agent works in: "
                         "create it, or name one that exists)")
    env, state_dir, secrets_dir, secret_values = _agent_context(args)
    if state_dir is None:
        state_dir = _standalone_state(args)
    if args.secrets:
        if not Path(args.secrets).is_dir():
            raise UsageError(f"--secrets {args.secrets}: not a directory")
        secrets_dir = args.secrets
    redactor = Redactor(secret_values)
    environment = base.Environment(
        redactor=redactor, logs_dir=str(state_dir / "logs"), runs_dir=str(state_dir / "runs"),
        secrets_dir=str(secrets_dir) if secrets_dir else None,
        credentials_dir=env.get("CREDENTIALS_DIRECTORY"), env=env, **base.roots(env))
    leftovers.sweep(environment.runs_dir)  # what a runtime killed mid-run left (docs/backends.md)
    policy = {k: v for k, v in (("timeout_seconds", args.timeout), ("sandbox", args.sandbox),
                                ("approval", args.approval)) if v is not None}
    if args.network:
        policy["network"] = True
    request = {"run_id": args.run_id or f"turn-{uuid.uuid4().hex[:12]}", "prompt": args.prompt,
               "backend_profile": args.backend, "workspace": os.path.abspath(args.workspace),
               "execution_policy": policy, "model": args.model}
    registry = service.ActiveRuns()
    # The first SIGINT/SIGTERM interrupts the turn (from the relay thread, not from the
    # handler: caldera/host/stopsignals.py); a second one is the default action.
    restore = on_signals(lambda: _interrupt(registry, request["run_id"]), once=True)
    try:
        result = service.execute(request, environment, roots=None, registry=registry,
                                 listeners=[_printer(args.json, redactor)])
    finally:
        restore()
    if not args.json:
        print(f"{result['status']}" + (f" ({result['failure_kind']})" if result.get("failure_kind") else "")
              + f"; log: {result['log']}", file=sys.stderr)
        if result.get("failure_kind") == "secret-unavailable" and secrets_dir is None:
            print(NO_SECRETS_DIR, file=sys.stderr)
    return 0 if result["status"] == "completed" else 1


# A standalone turn (no installed agent, no --secrets) has no secret projection at all;
# the backend's sentence names a relative secrets/codex that is nowhere.
NO_SECRETS_DIR = ("no secrets dir here: give --secrets DIR (with DIR/codex/config.toml), or --agent NAME for an "
                  "installed agent's, or set CLAWMANAGER_LLM_BASE_URL and CLAWMANAGER_LLM_API_KEY (docs/backends.md)")


def _interrupt(registry: ActiveRuns, run_id: str) -> None:
    handle = registry.get(run_id)
    if handle is not None:
        handle.interrupt()


def _printer(as_json: bool, redactor: Redactor) -> Callable[[dict[str, Any]], None]:
    def emit(event: dict[str, Any]) -> None:
        if as_json:
            line = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        else:
            line = _human(event)
        # Events are redacted at the sink; the CLI passes its output through the Redactor again.
        print(redactor.text(line), flush=True)
    return emit


def _human(event: dict[str, Any]) -> str:
    data, kind = event["data"], event["type"]
    if kind == "assistant_message":
        return data.get("text", "")
    if kind == "command_output":
        return f"$ {data.get('command')}  (exit {data.get('exit_code')})\n{data.get('output', '')}".rstrip()
    if kind == "terminal_status":
        extra = f" {data['failure_kind']}" if data.get("failure_kind") else ""
        return f"[{data['status']}]{extra} {data.get('message') or ''}".rstrip()
    if kind == "error":
        return f"[error] {data.get('failure_kind')}: {data.get('message')}"
    if kind == "diff":
        return data.get("diff", "")
    if kind == "tool_call":
        return f"[tool] {data.get('tool')} {data.get('status')} {data.get('command') or ''}".rstrip()
    return f"[{data.get('phase', kind)}] " + " ".join(
        f"{k}={v}" for k, v in data.items() if k != "phase" and v not in (None, "", [], {}))


HOW_TO_GET = {
    "codex": ("install the Codex CLI on PATH, or set CALDERA_CODEX_BIN to its binary (in a checkout, "
              ".ci/install-codex.sh DIR installs the pinned one and prints its path; docs/backends.md)"),
    "claude-code": ("install Claude Code (npm @anthropic-ai/claude-code) on PATH, or set CALDERA_CLAUDE_CODE_BIN to "
                    "its binary (in a checkout, .ci/install-claude-code.sh DIR installs the pinned one and prints "
                    "its path; docs/backends.md)"),
    "opencode": ("install OpenCode (npm opencode-ai) on PATH, or set CALDERA_OPENCODE_BIN to its binary (in a "
                 "checkout, .ci/install-opencode.sh DIR installs the pinned one and prints its path; "
                 "docs/backends.md)"),
}


def _backends(args: argparse.Namespace) -> int:
    env, _, secrets_dir, secret_values = _agent_context(args)
    info = base.describe(env, probe=True)
    if secrets_dir is not None:  # an agent's: its projection as its runs will meet it
        _add_projection(info, env, secrets_dir, args)
    info = Redactor(secret_values)(info)
    if args.json:
        print(json.dumps(info, separators=(",", ":")))
        return 0
    for backend in info["backends"]:
        name = f"{backend['name']}{' (default)' if backend['default'] else ''}"
        if not backend["available"]:
            where = f" at {backend['binary']}" if backend.get("binary") else ""
            print(f"{name}: not found{where}: {HOW_TO_GET.get(backend['name'], 'see docs/backends.md')}")
        else:
            print(f"{name}: available {backend.get('version') or ''} {backend.get('binary') or ''}".rstrip())
        if "projection" in backend:
            print(f"  projection: {backend['projection']['problem'] or 'usable'}")
    print("capabilities: " + ", ".join(info["capabilities"]))
    return 0


def _add_projection(info: dict[str, Any], env: dict[str, str], secrets_dir: Path, args: argparse.Namespace) -> None:
    """Each backend with a projection gets `projection: {ok, problem}`: the sentence its run
    would end with (caldera.backends.readiness; `caldera check` says the same)."""
    from caldera.backends import readiness
    from caldera.host import privdrop

    # `backends` stays root (it opens no state dir); as root it reads as the account root's
    # `caldera check` or `caldera turn` would become: the installed agent's (caldera.host.privdrop).
    becomes = None
    if not args.manifest and not config.state_in_persistent_dir():
        becomes = privdrop.service_user_for(config.state_root(), agent=config.agent_from_args(args).name)
    who = readiness.reader(becomes.pw_name if becomes is not None else None)
    found = {item.profile: item.problem
             for item in readiness.check(env, str(secrets_dir), env.get("CREDENTIALS_DIRECTORY"), who)}
    for backend in info["backends"]:
        if backend["name"] in found:
            backend["projection"] = {"ok": found[backend["name"]] is None, "problem": found[backend["name"]]}
