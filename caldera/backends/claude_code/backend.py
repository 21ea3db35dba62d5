"""The Claude Code backend: one turn of `claude -p` over stream-json on stdin/stdout.

One run = one process (stdio.StdioProcess: own process group, reader threads) with a
private HOME and TMPDIR (0700, removed after), the run's settings (config.py: policy ->
permission mode, tools and the bubblewrap sandbox), and the run's loopback forwarder
(forwarder.py), which alone holds the credential. The turn loop parses the CLI's lines,
answers its permission requests (declined: no approver), interrupts on `agent_interrupt`,
cancel and the policy's deadline (the CLI's interrupt request, then a kill after a
grace), and ends on the `result` message.
"""
from __future__ import annotations

import os
import queue
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from caldera import config
from caldera.backends import failures as fk
from caldera.backends import leftovers
from caldera.backends.base import APPROVALS, SANDBOXES, Backend, Environment, RunRequest, stop_reason
from caldera.backends.claude_code import config as cc
from caldera.backends.claude_code.normalize import Normalizer
from caldera.backends.confine import other_workspace_roots, own_roots_in, runtime_roots
from caldera.backends.events import EVENT_TYPES, EventSink
from caldera.backends.forwarder import Forwarder, TokenRoute, Upstream, process_secret
from caldera.backends.projection import Projection
from caldera.backends.registry import Refused, gateway_settings
from caldera.backends.stdio import LINE_CAP, Handoff, HandoffItem, StdioProcess
from caldera.backends.workspace import Snapshot
from caldera.errors import ConfigError
from caldera.host import proc, runreaper
from caldera.host.fsutil import atomic_write_json
from caldera.host.jsonlimits import JSONLimitError, line_parser

if TYPE_CHECKING:
    from caldera.backends.runlog import RunLog

INIT_TIMEOUT = 30.0  # the CLI's answer to `initialize`
INTERRUPT_GRACE = 5.0
TIMEOUT_GRACE = 2.0
POLL = 0.05
STDERR_SETTLE = 2.0
HANDOFF_BLOCKS = 64
# Directories the CLI's sandbox creates in the workspace for its own bookkeeping (measured,
# 2.1.332: `.claude/.cc-writes/`, empty after the run), innermost first: removed after the
# run when they were not there before it and are empty (nothing of the agent's is touched).
CLI_WORKSPACE_DIRS = (".claude/.cc-writes", ".claude")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
PACKAGES = {"x86_64": "claude-code-linux-x64", "aarch64": "claude-code-linux-arm64"}
Message = dict[str, Any]


def find_binary(env: Mapping[str, str]) -> str | None:
    """CALDERA_CLAUDE_CODE_BIN, else `claude` on PATH (npm's bin/claude.exe resolved to the
    platform package's native binary: without npm's postinstall that file is a stub)."""
    explicit = config.claude_code_binary(env)
    if explicit:
        return explicit
    found = shutil.which("claude", path=env.get("PATH") or DEFAULT_PATH)
    if not found:
        return None
    real = Path(os.path.realpath(found))
    if real.name == "claude.exe" and real.parent.name == "bin":  # node_modules/@anthropic-ai/claude-code/bin
        native = real.parent.parent.parent / PACKAGES.get(os.uname().machine, PACKAGES["x86_64"]) / "claude"
        if os.access(native, os.X_OK):
            return str(native)
    return found


def hidden_paths(environment: Environment) -> tuple[list[str], list[str]]:
    """(roots, secrets): what the agent's commands and file tools may not read, real paths of
    those that exist. Roots: the runtime's config and state roots, the instance's persistent
    dir, the agent's own state dir and every private dir of this uid's Claude Code runs (other
    agents' secrets, session tokens, runs); the workspace may lie inside one of them and stays
    readable. Secrets: the projection, systemd's credentials, the run logs, `secrets.env`
    beside the projection (the bootstrap token) and `session.json` (the session token); a
    workspace inside one of them is refused."""
    state_dir = os.path.dirname(os.path.abspath(environment.logs_dir))
    roots = [*runtime_roots(environment.config_root, environment.state_root, environment.persistent_dir), state_dir]
    secrets = [environment.secrets_dir, environment.credentials_dir, environment.logs_dir,
               os.path.join(state_dir, "session.json")]
    if environment.secrets_dir:
        secrets.append(os.path.join(os.path.dirname(os.path.abspath(environment.secrets_dir)), "secrets.env"))

    def real(paths: Sequence[str | None]) -> list[str]:
        return sorted({os.path.realpath(p) for p in paths if p and os.path.lexists(p)})
    # The private root even when no run holds it yet: this run's own private dir makes it
    # before the CLI starts, and runs started after this one put their HOME and TMPDIR in it
    # (measured, bench_many: the first of three runs at once read the two others' HOMEs)
    private = os.path.realpath(leftovers.private_root())
    return sorted({*real(roots), private}), real(secrets)


def sandbox_helpers(env: Mapping[str, str]) -> dict[str, str | None]:
    path = env.get("PATH") or DEFAULT_PATH
    return {name: shutil.which(name, path=path) for name in cc.SANDBOX_HELPERS}


@dataclass
class ClaudeContext:
    run: RunRequest
    environment: Environment
    sink: EventSink
    normalizer: Normalizer
    binary: str
    private_dir: Path  # HOME and TMPDIR below it, removed after the run
    plan: cc.ClaudePlan
    retries: int
    stall_seconds: int  # how long the provider may say nothing in an answer (0: the CLI's own bound)
    deadline: float
    cancel: threading.Event | None = None
    cancel_is_timeout: Callable[[], bool] | None = None
    interrupt_event: threading.Event = field(default_factory=threading.Event)
    process: StdioProcess | None = None
    forwarder: Forwarder | None = None
    snapshot: Snapshot | None = None
    ended: bool = False  # the CLI and its sandbox are gone (the after-turn diff waits for it)
    reason: str | None = None  # "cancelled" | "timeout" once we stop the turn
    stop_sent_at: float = 0.0
    cli_dirs: list[Path] = field(default_factory=list)  # CLI_WORKSPACE_DIRS absent before the run
    initialised: bool = False
    started: float = field(default_factory=time.monotonic)

    @property
    def home(self) -> Path:
        return self.private_dir / "home"

    @property
    def tmp_dir(self) -> Path:
        return self.private_dir / "tmp"

    def should_stop(self) -> bool:
        """The command's cancel (its deadline or the operator's): a workspace walk ends."""
        return self.cancel is not None and self.cancel.is_set()


class ClaudeCodeBackend(Backend[ClaudeContext]):
    name = cc.PROFILE

    def resolve_profile(self, profile: str = cc.PROFILE, env: Mapping[str, str] | None = None,
                        probe: bool = False) -> dict[str, Any]:
        env = os.environ if env is None else env
        binary = find_binary(env)
        helpers = sandbox_helpers(env)
        found = bool(binary and os.access(binary, os.X_OK))
        info: dict[str, Any] = {
            "name": cc.PROFILE, "default": False, "transport": "claude -p (stream-json over stdio)",
            "binary": binary, "available": found and all(helpers.values()),
            "sandbox_helpers": helpers, "streaming": True, "interrupt": True, "resume": False,
            "tool_approval": "declined (no approver in an unattended run)",
            "sandboxes": list(SANDBOXES), "approvals": list(APPROVALS), "network": True,
            "events": list(EVENT_TYPES), "failure_kinds": list(fk.FAILURE_KINDS),
            "llm_gateway": gateway_settings(env) is not None}
        if found and not all(helpers.values()):
            info["unavailable"] = "its sandbox needs bubblewrap and socat on PATH"
        if probe and found and binary:
            info["version"] = _version(binary)
        return info

    def prepare(self, run: RunRequest, environment: Environment, sink: EventSink) -> ClaudeContext:
        """Everything that can fail before a process exists: projection, binary, sandbox, run dir."""
        redactor = environment.redactor
        projection = Projection.locate(environment.secrets_dir, environment.credentials_dir, backend=cc.PROFILE)
        plan = cc.plan_provider(projection, environment.env, run.model)
        for value in plan.secret_values:
            redactor.add(value)
        redactor.add(process_secret(), prefix=True)  # the run token, whole: one value for every run
        binary = find_binary(environment.env)
        sink.emit("backend_status", {
            "phase": "starting", "backend": cc.PROFILE, "profile": run.backend_profile, "binary": binary,
            "provider": "anthropic", "model": plan.model, "base_url": plan.upstream, "provider_source": plan.source,
            "proxy": plan.proxy.shown if plan.proxy is not None else None,
            "policy": run.policy.as_dict(), "settings_dropped": plan.dropped or None})
        if not binary:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED,
                                    "no Claude Code binary: set CALDERA_CLAUDE_CODE_BIN or put claude on PATH")
        missing = [name for name, path in sandbox_helpers(environment.env).items() if not path]
        if missing and not run.policy.external:  # external: the container is the sandbox
            raise Refused(f"the execution policy cannot be honoured: Claude Code keeps the agent's commands in "
                          f"the workspace and off the network only inside its bubblewrap sandbox, and "
                          f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH "
                          "(apt-get install bubblewrap socat)")
        try:
            retries = config.claude_code_retries(environment.env, cc.DEFAULT_MAX_RETRIES)
            stall = config.provider_stall_seconds(environment.env)
        except ConfigError as exc:
            raise fk.BackendFailure(fk.BACKEND_FAILED, str(exc)) from None
        workspace = os.path.realpath(run.workspace)
        roots, secrets = hidden_paths(environment)
        inside = next((p for p in secrets if workspace == p or workspace.startswith(p.rstrip("/") + "/")), None)
        if inside is not None:
            raise Refused(f"the workspace {run.workspace} lies inside the runtime's secrets ({inside}): "
                          "the agent's commands would read them")
        # the other agents' workspace roots denied too; this agent's own roots inside one stay readable
        own = [*config.workspace_roots(environment.env), workspace]
        others = other_workspace_roots(environment.config_root, own, [binary])
        private_dir = _private_dir()
        try:
            allowed = dict.fromkeys([workspace, str(private_dir), *own_roots_in(own, others)])
            confinement = cc.confine([*roots, *others, *secrets], list(allowed),
                                     cc.local_addresses() if run.policy.network else [])
            settings = cc.policy_settings(run.policy, run.workspace, confinement, plan.settings)
            for sub in ("home", "home/.claude", "tmp"):
                (private_dir / sub).mkdir(mode=0o700)
            atomic_write_json(private_dir / "home" / ".claude" / "settings.json", settings, mode=0o600)
        except BaseException as exc:
            shutil.rmtree(private_dir, ignore_errors=True)  # no context yet: finalize will not
            if isinstance(exc, OSError):
                raise fk.BackendFailure(fk.BACKEND_FAILED, f"cannot prepare the run's private dir: {exc}") from None
            raise
        return ClaudeContext(run=run, environment=environment, sink=sink, normalizer=Normalizer(sink), binary=binary,
                             private_dir=private_dir, plan=plan, retries=retries, stall_seconds=stall,
                             deadline=time.monotonic() + run.policy.timeout_seconds)

    def _process_env(self, context: ClaudeContext, forwarder_url: str) -> dict[str, str]:
        """What the CLI (and so every Bash command of the agent) sees: no credential, no
        variable of the runtime's own; the run's token and forwarder instead of the key."""
        env = {"PATH": context.environment.env.get("PATH") or DEFAULT_PATH, "LANG": "C.UTF-8",
               "HOME": str(context.home), "TMPDIR": str(context.tmp_dir),
               "ANTHROPIC_BASE_URL": forwarder_url, context.plan.key_var: context.plan.run_token,
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
               "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
               # No background task: one would outlive the turn's result, write after the diff
               # and race the runtime's walk of the workspace (the CLI then refuses
               # run_in_background; measured, 2.1.332).
               "CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1",
               "CLAUDE_CODE_MAX_RETRIES": str(context.retries)}
        if context.environment.env.get("TZ"):
            env["TZ"] = context.environment.env["TZ"]
        env.update(context.plan.env)
        return env

    def start_turn(self, context: ClaudeContext) -> None:
        runlog = context.sink.runlog
        plan = context.plan
        key_header = ("x-api-key", plan.key) if plan.key_var == "ANTHROPIC_API_KEY" else \
            ("authorization", f"Bearer {plan.key}")
        route = TokenRoute(Upstream.parse(plan.upstream, plan.proxy), plan.run_token, key_header, cc.FORWARDED_PATHS)
        forwarder = Forwarder(route, name="claude-forwarder", retry_after_cap=cc.RETRY_AFTER_CAP,
                              note=(runlog.note if runlog is not None else None))
        context.forwarder = forwarder
        url = forwarder.start()
        # The run's deadline bounds this walk too (the one after the turn has only the cancel).
        context.snapshot = Snapshot.take(
            context.run.workspace, should_stop=lambda: context.should_stop() or time.monotonic() >= context.deadline)
        if not context.snapshot.complete and runlog is not None:
            runlog.note(f"no diff for this turn: the workspace before it: {context.snapshot.reason}")
        context.cli_dirs = [path for path in (Path(context.run.workspace, rel) for rel in CLI_WORKSPACE_DIRS)
                            if not os.path.lexists(path)]
        handoff: queue.Queue[HandoffItem] = queue.Queue(HANDOFF_BLOCKS)
        settings = str(context.home / ".claude" / "settings.json")
        argv = cc.argv(context.binary, context.run.policy, settings, plan.model)
        if context.run.policy.external:  # no sandbox's pid namespace: a reaper ends what commands leave
            argv = runreaper.command(argv)
        process = StdioProcess(argv,
                               self._process_env(context, url), context.run.workspace, runlog,
                               context.environment.redactor, Handoff(handoff, runlog), "claude")
        context.process = process
        process.note(f"private HOME {context.home} and TMPDIR {context.tmp_dir} (removed after the run)")
        process.start()
        process.send({"type": "control_request", "request_id": "init_1", "request": {"subtype": "initialize"}})
        process.send({"type": "user", "session_id": "", "parent_tool_use_id": None,
                      "message": {"role": "user",
                                  "content": [{"type": "text", "text": cc.prompt_text(context.run.prompt)}]}})
        self._loop(context, process, handoff, Lines(runlog))

    def _loop(self, context: ClaudeContext, process: StdioProcess, handoff: queue.Queue[HandoffItem],
              lines: Lines) -> None:
        while True:
            if context.reason is None:
                context.reason = self._stop_reason(context)
                if context.reason:
                    self._send_interrupt(context, process)
            elif time.monotonic() - context.stop_sent_at > self._grace(context):
                process.note("no result after the interrupt request: killing the backend")
                process.kill()
                return self._end_stopped(context)
            if not context.initialised and time.monotonic() - context.started > INIT_TIMEOUT:
                process.kill()
                return self._finish(context, "failed", fk.BACKEND_FAILED,
                                    f"no answer to initialize within {INIT_TIMEOUT:.0f} s")
            if context.reason is None and self._stalled(context):
                # The CLI waits on for a stalled answer (past the 150 s measured, issue 44): the
                # turn ends now, and the CLI with it.
                process.kill()
                return self._finish(context, "failed", fk.PROVIDER_UNAVAILABLE,
                                    fk.stalled(context.stall_seconds))
            try:
                item = handoff.get(timeout=POLL)
            except queue.Empty:
                continue
            if item[0] == "raw":
                try:
                    for msg in lines.parse(item[1]):
                        result = self._dispatch(context, process, msg)
                        if result is not None:
                            return self._completed(context, result)
                except fk.BackendFailure as exc:
                    process.kill()
                    return self._finish(context, "failed", exc.kind, exc.message)
            elif item[0] == "fatal":
                process.kill()
                return self._finish(context, "failed", item[1].kind, item[1].message)
            else:
                return self._eof(context, process)

    def _stalled(self, context: ClaudeContext) -> bool:
        """The provider has said nothing in an answer (the forwarder's view) past the bound."""
        forwarder = context.forwarder
        return bool(context.stall_seconds and forwarder is not None
                    and forwarder.silence() > context.stall_seconds)

    def _dispatch(self, context: ClaudeContext, process: StdioProcess, msg: Message) -> Message | None:
        kind = msg.get("type")
        if kind == "control_response":
            response = _obj(msg.get("response"))
            if response.get("request_id") == "init_1" and not context.initialised:
                context.initialised = True
                context.sink.emit("backend_status", {"phase": "ready", "subtype": response.get("subtype")})
            return None
        if kind == "control_request":
            self._answer(context, process, msg)
            return None
        return context.normalizer.handle(msg)

    def _answer(self, context: ClaudeContext, process: StdioProcess, msg: Message) -> None:
        """The CLI asks: a permission is declined (the policy is never widened), the rest refused."""
        request = _obj(msg.get("request"))
        rid = msg.get("request_id")
        if request.get("subtype") == "can_use_tool":
            decision = {"behavior": "deny", "message": "the execution policy allows no approvals in unattended runs"}
            process.send({"type": "control_response",
                          "response": {"subtype": "success", "request_id": rid, "response": decision}})
            tool_input = _obj(request.get("input"))
            context.sink.emit("tool_call", {
                "item_id": request.get("tool_use_id"), "tool": "approval", "status": "declined",
                "request": request.get("tool_name"),
                "command": tool_input.get("command") if isinstance(tool_input.get("command"), str) else None,
                "reason": "the execution policy allows no approvals in unattended runs"})
        else:
            process.send({"type": "control_response", "response": {
                "subtype": "error", "request_id": rid, "error": f"caldera does not support {request.get('subtype')}"}})

    def _stop_reason(self, context: ClaudeContext) -> str | None:
        return stop_reason(context)

    def _grace(self, context: ClaudeContext) -> float:
        return TIMEOUT_GRACE if context.reason == "timeout" else INTERRUPT_GRACE

    def _send_interrupt(self, context: ClaudeContext, process: StdioProcess) -> None:
        context.stop_sent_at = time.monotonic()
        context.sink.emit("backend_status", {"phase": "interrupting", "reason": context.reason})
        process.send({"type": "control_request", "request_id": "interrupt_1", "request": {"subtype": "interrupt"}})

    def _completed(self, context: ClaudeContext, result: Message) -> None:
        try:
            status, kind, message = context.normalizer.outcome(result, context.reason)
        except fk.BackendFailure as exc:
            return self._finish(context, "failed", exc.kind, exc.message)
        if status == "cancelled" and context.reason == "timeout":
            status, kind, message = "failed", fk.BACKEND_TIMEOUT, self._timeout_message(context)
        self._finish(context, status, kind, message)

    def _eof(self, context: ClaudeContext, process: StdioProcess) -> None:
        if context.reason:
            return self._end_stopped(context)
        rc = process.returncode(wait=2.0)
        hint = process.stderr_summary(settle=STDERR_SETTLE)
        kind = fk.BACKEND_FAILED if context.initialised else fk.BACKEND_SPAWN_FAILED
        self._finish(context, "failed", kind, f"claude exited (rc {rc}) before the turn's result"
                     + (f": {hint}" if hint else ""))

    def _end_stopped(self, context: ClaudeContext) -> None:
        if (context.reason or self._stop_reason(context)) == "timeout":
            return self._finish(context, "failed", fk.BACKEND_TIMEOUT, self._timeout_message(context))
        self._finish(context, "cancelled", fk.CANCELLED, "the run was cancelled")

    def _timeout_message(self, context: ClaudeContext) -> str:
        return f"the run passed its timeout of {context.run.policy.timeout_seconds} s"

    def _finish(self, context: ClaudeContext, status: str, kind: str | None, message: str | None) -> None:
        # The CLI and everything in its sandbox are gone first: a write after the walk would be
        # missing from the diff, and one during it could swap what the walk opens.
        self._end_process(context)
        diff = ""
        if context.snapshot is not None:
            diff = context.snapshot.diff(should_stop=context.should_stop)
            if context.snapshot.reason and context.sink.runlog is not None:
                context.sink.runlog.note(f"no diff for this turn: {context.snapshot.reason}")
        streak = context.forwarder.streak() if context.forwarder is not None else 0
        context.normalizer.finish(status, kind, message,
                                  {"duration_ms": int((time.monotonic() - context.started) * 1000)}, diff, streak)

    def _end_process(self, context: ClaudeContext) -> None:
        """Close the CLI (stdin, grace, TERM -> KILL of its group), then end what is left of
        its sandbox: a process still holding the run's private dir in its environment (the
        sandbox's own session is outside the CLI's group) is killed and waited for."""
        if context.ended:
            return
        context.ended = True
        process = context.process
        if process is None or process.proc is None:
            return
        rc = process.close()
        process.note(f"claude ended, rc {rc}")
        left = leftovers.kill_holders([str(context.private_dir)])
        if left:
            process.note(f"{left} process(es) of the run's sandbox outlived the CLI; killed")

    def interrupt(self, context: ClaudeContext) -> bool:
        already = context.interrupt_event.is_set()
        context.interrupt_event.set()
        return not already

    def finalize(self, context: ClaudeContext) -> dict[str, Any]:
        try:
            self._end_process(context)
        finally:
            if context.forwarder is not None:
                context.forwarder.close()
            shutil.rmtree(context.private_dir, ignore_errors=True)
            if context.private_dir.exists() and context.sink.runlog is not None:
                context.sink.runlog.note(f"could not remove {context.private_dir}")
            # the private root too, once no run is left in it: the run's TMPDIR is left as it was
            _remove_empty_dirs([*context.cli_dirs, context.private_dir.parent])
        return context.sink.terminal_data()


def _private_dir() -> Path:
    """A new private dir for one run (mkdtemp: 0700) under this uid's private root, claimed
    (leftovers.claim). Short, because the sandbox's bridge sockets live in its TMPDIR and a
    socket's path is at most 108 bytes. The root is refused unless it is this uid's own
    directory, 0700 (in a shared /tmp another user could have made it first)."""
    root = leftovers.private_root()
    try:
        for attempt in range(3):  # another run's end may remove the root, empty, in between
            root.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(root)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                raise fk.BackendFailure(fk.BACKEND_FAILED, f"{root} is not a directory of this user's: remove "
                                                           "it (another user may have made it to see the runs' files)")
            if st.st_mode & 0o077:
                os.chmod(root, 0o700)
            try:
                private = Path(tempfile.mkdtemp(dir=root))
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
    except OSError as exc:
        raise fk.BackendFailure(fk.BACKEND_FAILED, f"cannot make the run's private dir under {root}: {exc}") from None
    try:
        leftovers.claim(private)
    except OSError as exc:
        shutil.rmtree(private, ignore_errors=True)
        raise fk.BackendFailure(fk.BACKEND_FAILED, f"cannot make the run's private dir under {root}: {exc}") from None
    return private


class Lines:
    """stdout blocks -> messages: the run log (s2c), then the bounded parse. A line that is
    not JSON stops the run (backend-json-parse-error): the stream can no longer be trusted."""

    def __init__(self, runlog: RunLog | None):
        self.runlog = runlog
        self.parse_line = line_parser(max_bytes=LINE_CAP * 2, what="Claude Code stdout line")

    def parse(self, data: bytes) -> list[Message]:
        lines = [line.rstrip("\r") for line in data.decode("utf-8", "replace").split("\n")]
        lines = [line for line in lines if line and not line.isspace()]
        if self.runlog is not None and lines:
            self.runlog.write_lines("s2c", lines)
        return [self._one(line) for line in lines]

    def _one(self, line: str) -> Message:
        try:
            msg = self.parse_line(line)
        except JSONLimitError as exc:
            raise fk.BackendFailure(fk.BACKEND_JSON_PARSE_ERROR, str(exc)) from None
        except ValueError:
            raise fk.BackendFailure(fk.BACKEND_JSON_PARSE_ERROR,
                                    f"Claude Code stdout line is not JSON: {line[:200]!r}") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            raise fk.BackendFailure(fk.BACKEND_PROTOCOL_ERROR,
                                    "Claude Code sent a JSON line that is not an object with a type")
        return msg


def _remove_empty_dirs(paths: list[Path]) -> None:
    """rmdir each (innermost first): only an empty real directory goes, never a file, a
    symlink or anything the agent left in it."""
    for path in paths:
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
        except OSError:
            pass  # not empty (the agent's files), or gone: left as it is


def _obj(value: Any) -> Message:
    return value if isinstance(value, dict) else {}


def _version(binary: str) -> str | None:
    result = proc.run([binary, "--version"], env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "HOME": "/nonexistent",
                                                  "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
                      timeout=10, stdout_cap=4096)
    return result.stdout.decode("utf-8", "replace").strip() or None if result.ok else None
