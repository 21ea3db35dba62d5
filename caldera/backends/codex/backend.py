"""The Codex backend: one turn of the native `codex app-server`.

One run = one process (appserver.py: its own process group, JSON-RPC over stdio) with a
private CODEX_HOME (0700) built by `codex_config`. The turn loop answers approval requests
from the policy (declined: there is no approver in a control-plane run, and the policy is
never widened), normalises notifications, and interrupts on `agent_interrupt`, on cancel
and on the policy's deadline (then kills after a grace: backend-timeout).
"""
from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from caldera import __version__, config
from caldera.backends import failures as fk
from caldera.backends import leftovers
from caldera.backends.base import APPROVALS, SANDBOXES, Backend, Environment, Policy, RunRequest, stop_reason
from caldera.backends.codex import catalogue as codex_catalogue
from caldera.backends.codex import config as codex_config
from caldera.backends.codex import gateway as codex_gateway
from caldera.backends.codex import sandbox
from caldera.backends.codex import seed as codex_seed
from caldera.backends.codex.appserver import AppServer, Batch, Message
from caldera.backends.codex.binary import DEFAULT_PATH, find_binary
from caldera.backends.codex.normalize import Normalizer
from caldera.backends.events import EVENT_TYPES, EventSink
from caldera.backends.forwarder import process_secret
from caldera.backends.registry import gateway_settings
from caldera.errors import ConfigError
from caldera.host import proc, runreaper

if TYPE_CHECKING:
    from caldera.backends.confine import Box
    from caldera.backends.forwarder import Forwarder
    from caldera.redact import Redactor

REQUEST_TIMEOUT = 30.0  # initialize / thread/start / turn/start
INTERRUPT_GRACE = 5.0  # after turn/interrupt on cancel, before the kill
TIMEOUT_GRACE = 2.0  # after turn/interrupt on the policy deadline, before the kill
POLL = 0.05  # the turn loop's tick: how often it looks at its stop reasons while codex is quiet
STDERR_SETTLE = 2.0  # after an early exit: how long to wait for the stderr that explains it
_ExcInfo = tuple[type[BaseException], BaseException, TracebackType]


# ---------------------------------------------------------------- the turn

def handle_batch(batch: Batch, normalizer: Normalizer, answer: Callable[[Message], None]) -> Message | None:
    """One ("batch", …) inbox item through the normalizer (requests to `answer`); the
    turn/completed message when it comes (what follows it in the batch is dropped, as
    the inbox's rest was when the loop ended one message at a time)."""
    handler_for = normalizer.handler_for  # bound once: this loop runs for every stdout line
    for kind, msg in batch:
        if kind == "notification":
            method = msg["method"]  # the Dispatcher batches only messages with a method
            if method == "turn/completed":
                return msg
            handler = handler_for(method)
            if handler is not None:  # a line no handler wants (rate limits, …) costs no call
                params = msg.get("params")
                handler(params if isinstance(params, dict) else {})
        else:
            answer(msg)
    return None


class _Stop(Exception):
    """Cancel or deadline reached while waiting for a response (before the turn loop)."""


@dataclass
class CodexContext:
    run: RunRequest
    environment: Environment
    sink: EventSink
    normalizer: Normalizer
    binary: str
    run_dir: Path
    plan: codex_config.ProviderPlan
    deadline: float  # time.monotonic() of the policy timeout
    box: Box | None  # caldera's bubblewrap around the app-server (codex/sandbox.py); None: none
    cancel: threading.Event | None = None  # the command's cancel (timeout or operator)
    cancel_is_timeout: Callable[[], bool] | None = None  # was the cancel the command's own deadline?
    interrupt_event: threading.Event = field(default_factory=threading.Event)
    server: AppServer | None = None
    forwarder: Forwarder | None = None  # on the AI gateway: the run's, the only holder of its key
    thread_id: str | None = None
    turn_id: str | None = None
    reason: str | None = None  # "cancelled" | "timeout" once we stop the turn
    stop_sent_at: float = 0.0  # time.monotonic() when the reason was set and turn/interrupt sent
    started: float = field(default_factory=time.monotonic)

    @property
    def redactor(self) -> Redactor:
        return self.environment.redactor

    @property
    def external(self) -> bool:
        """The container is the sandbox (CALDERA_RUN_SANDBOX=external): Codex runs the commands
        in it without its own bubblewrap, and nothing else wraps the app-server either."""
        return self.run.policy.external


def sandbox_policy(policy: Policy) -> Message | None:
    """turn/start's `sandboxPolicy` for an external run: Codex's `externalSandbox` (commands run
    unsandboxed, the caller vouching for what is around them; the network setting is what the
    model is told, not enforced by Codex). None: thread/start's `sandbox` mode stands."""
    if not policy.external:
        return None
    return {"type": "externalSandbox", "networkAccess": "enabled" if policy.network else "restricted"}


class CodexBackend(Backend[CodexContext]):
    name = "codex"

    def resolve_profile(self, profile: str = "codex", env: Mapping[str, str] | None = None,
                        probe: bool = False) -> dict[str, Any]:
        env = os.environ if env is None else env
        binary = find_binary(env)
        available = bool(binary and os.access(binary, os.X_OK))
        info: dict[str, Any] = {
            "name": "codex", "default": True, "transport": "codex app-server (JSON-RPC over stdio)",
            "binary": binary, "available": available,
            "sandboxes": list(SANDBOXES), "approvals": list(APPROVALS), "network": True,
            "interrupt": True, "events": list(EVENT_TYPES), "failure_kinds": list(fk.FAILURE_KINDS),
            "llm_gateway": gateway_settings(env) is not None}
        if probe and available and binary:
            info["version"] = _version(binary)
        return info

    def prepare(self, run: RunRequest, environment: Environment, sink: EventSink) -> CodexContext:
        """Everything that can fail before a process exists: binary, projection, CODEX_HOME."""
        redactor = environment.redactor
        projection = codex_config.Projection.locate(environment.secrets_dir, environment.credentials_dir)
        plan = codex_config.plan_provider(projection, environment.env, run.model)
        for value in plan.secret_values:
            redactor.add(value)
        if plan.run_token is not None:  # the gateway's: masked whole by its prefix, one value for every run
            redactor.add(process_secret(), prefix=True)
        binary = find_binary(environment.env)
        # CALDERA_RUN_SANDBOX=external: the container is the sandbox, no bubblewrap of caldera's
        box, commands = sandbox.plan(environment, binary, environment.env.get("PATH") or DEFAULT_PATH,
                                     confined=not run.policy.external, workspace=run.workspace)
        if plan.auth_json is not None:  # a ChatGPT login's or the built-in provider's (codex/config.py)
            commands += "; its commands can read the projection's auth.json in CODEX_HOME"
        sink.emit("backend_status", {
            "phase": "starting", "backend": "codex", "profile": run.backend_profile, "binary": binary,
            "provider": plan.provider, "model": plan.model, "base_url": plan.base_url,
            "provider_source": plan.source, "policy": run.policy.as_dict(), "commands": commands})
        if not binary:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED,
                                    "no Codex binary: set CALDERA_CODEX_BIN or put codex on PATH")
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):  # said before its dir is looked at
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED, f"cannot start {binary}: not an executable file")
        if not os.path.isdir(run.workspace):
            raise fk.BackendFailure(fk.BACKEND_FAILED, f"workspace {run.workspace} is not a directory")
        run_dir = Path(environment.runs_dir) / run.run_id
        try:
            request_retries, stream_retries = config.codex_retries(
                environment.env, codex_config.DEFAULT_REQUEST_MAX_RETRIES, codex_config.DEFAULT_STREAM_MAX_RETRIES)
            stall = config.provider_stall_seconds(environment.env)
        except ConfigError as exc:
            raise fk.BackendFailure(fk.BACKEND_FAILED, str(exc)) from None
        context = CodexContext(run=run, environment=environment, sink=sink, normalizer=Normalizer(sink, stall),
                               binary=binary, run_dir=run_dir, plan=plan, box=box,
                               deadline=time.monotonic() + run.policy.timeout_seconds)
        codex_toml = codex_config.enforce(plan, network=run.policy.network, request_retries=request_retries,
                                          stream_retries=stream_retries, stall_seconds=stall)
        runlog = sink.runlog
        note = runlog.note if runlog is not None else None
        if plan.catalogue is not None:  # the gateway's models, beside Codex's own (codex/catalogue.py)
            plan.catalogue = codex_catalogue.run_catalogue(binary, plan.catalogue, note)
        raw = projection.read("config.toml") or b""
        try:
            run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(run_dir, 0o700)
            leftovers.claim(run_dir)  # a runtime killed mid-run: the next start's sweep removes it
            # Opened here, inside the try: a run that fails to prepare must not leave the
            # forwarder (a thread and a loopback listener holding the key) behind.
            context.forwarder = codex_gateway.open_forwarder(plan, codex_toml, note)
            for line in codex_config.withheld_lines(raw.decode("utf-8", "replace"), codex_config.dump_toml(codex_toml)):
                redactor.add(line)  # no line of the config reaches an event beyond base URL, model, profile
            codex_config.write_codex_home(run_dir / "codex-home", plan, codex_toml)
            codex_seed.seed_home(binary, run_dir / "codex-home", note)  # ≈ 60 ms of Codex's start (codex/seed.py)
            (run_dir / "home").mkdir(mode=0o700, exist_ok=True)
            # A private TMPDIR: nothing of the run lands in the shared /tmp, and CODEX_HOME is then
            # not "under the temporary dir", where Codex refuses to make the helper a system
            # bubblewrap needs (codex-notes section 9, gotcha 13).
            (run_dir / "tmp").mkdir(mode=0o700, exist_ok=True)
        except BaseException as exc:
            if context.forwarder is not None:
                context.forwarder.close()
            shutil.rmtree(run_dir, ignore_errors=True)  # it may hold a partial auth.json
            if isinstance(exc, OSError):
                raise fk.BackendFailure(fk.BACKEND_FAILED, f"cannot prepare the run directory: {exc}") from None
            raise
        return context

    def _process_env(self, context: CodexContext) -> dict[str, str]:
        # Only what Codex needs: nothing of the runtime's own environment (its tokens) leaks in.
        env = {"PATH": context.environment.env.get("PATH") or DEFAULT_PATH,
               "HOME": str(context.run_dir / "home"), "LANG": "C.UTF-8",
               "CODEX_HOME": str(context.run_dir / "codex-home"), "TMPDIR": str(context.run_dir / "tmp")}
        if context.environment.env.get("TZ"):
            env["TZ"] = context.environment.env["TZ"]
        env.update(context.plan.env)
        return env

    def start_turn(self, context: CodexContext) -> None:
        argv = sandbox.argv(context.box, context.run, context.run_dir, [context.binary, "app-server"])
        if context.run.policy.external:  # no box's pid namespace: a reaper ends what commands leave
            argv = runreaper.command(argv)
        server = AppServer(argv, self._process_env(context),
                           context.run.workspace, context.sink.runlog, context.redactor)
        context.server = server
        server.start()
        try:
            self._handshake(context, server)
        except _Stop:
            self._end_stopped(context)
            return
        self._loop(context, server)

    def _handshake(self, context: CodexContext, server: AppServer) -> None:
        sink, run = context.sink, context.run
        init = self._request(context, server, "initialize", {
            "clientInfo": {"name": "caldera", "title": "caldera", "version": __version__},
            "capabilities": None}, before_init=True)
        sink.emit("backend_status", {"phase": "ready", "user_agent": init.get("userAgent"),
                                     "platform": init.get("platformOs")})
        server.notify("initialized")
        params = {"cwd": run.workspace, "approvalPolicy": run.policy.approval,
                  "sandbox": run.policy.sandbox, "ephemeral": True, "modelProvider": context.plan.provider}
        if context.plan.model:
            params["model"] = context.plan.model
        started = self._request(context, server, "thread/start", params)
        thread = started.get("thread")
        if not isinstance(thread, dict) or not isinstance(thread.get("id"), str):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID, "thread/start result has no thread.id")
        context.thread_id = thread["id"]
        sink.emit("backend_status", {
            "phase": "thread_started", "thread_id": context.thread_id, "model": started.get("model"),
            "model_provider": started.get("modelProvider"), "sandbox": run.policy.sandbox,
            "approval": run.policy.approval, "network": run.policy.network, "cwd": run.workspace,
            "confinement": run.policy.confinement})
        turn_params: Message = {"threadId": context.thread_id,
                                "input": [{"type": "text", "text": run.prompt, "text_elements": []}]}
        external = sandbox_policy(run.policy)
        if external is not None:
            turn_params["sandboxPolicy"] = external
        turn = self._request(context, server, "turn/start", turn_params).get("turn")
        if not isinstance(turn, dict) or not isinstance(turn.get("id"), str):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID, "turn/start result has no turn.id")
        context.turn_id = turn["id"]

    def _request(self, context: CodexContext, server: AppServer, method: str, params: Message,
                 before_init: bool = False) -> Message:
        """Send a request and wait for its result; notifications queue up meanwhile."""
        slot = server.call(method, params)
        limit = time.monotonic() + REQUEST_TIMEOUT
        while not slot.event.is_set():
            if self._stop_reason(context):
                raise _Stop()
            if time.monotonic() >= limit:
                raise fk.BackendFailure(fk.BACKEND_FAILED, f"no answer to {method} within {REQUEST_TIMEOUT:.0f} s")
            try:
                server.channel.pump(POLL)  # the response is routed here; notifications queue for the loop
            except queue.Empty:
                continue
        msg = slot.message
        if msg is None:  # the process went away
            failure = server.channel.queued_failure()  # a parse/protocol failure explains it better
            if failure is not None:
                raise failure
            rc = server.returncode(wait=2.0)
            kind = fk.BACKEND_SPAWN_FAILED if before_init else fk.BACKEND_FAILED
            raise fk.BackendFailure(kind, f"codex app-server exited (rc {rc}) before answering {method}: "
                                          f"{server.stderr_summary(settle=STDERR_SETTLE) or 'no stderr'}")
        if "error" in msg:
            error = msg["error"] if isinstance(msg["error"], dict) else {"message": str(msg["error"])}
            raise fk.BackendFailure(fk.BACKEND_FAILED, f"{method} failed: {error.get('message')}")
        if "result" not in msg or not isinstance(msg["result"], dict):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID, f"{method} response has no result object")
        return msg["result"]

    def _stop_reason(self, context: CodexContext) -> str | None:
        return stop_reason(context)

    def _loop(self, context: CodexContext, server: AppServer) -> None:
        norm = context.normalizer
        while True:
            if context.reason is None:
                context.reason = self._stop_reason(context)
                if context.reason:
                    self._send_interrupt(context, server)
            elif time.monotonic() - context.stop_sent_at > self._grace(context):
                server.note("no turn/completed after turn/interrupt: killing the backend")
                server.kill()
                return self._end_stopped(context)
            try:
                item = server.channel.next(POLL)
            except queue.Empty:
                continue
            if item[0] == "batch":
                try:
                    done = handle_batch(item[1], norm, lambda request: self._answer(context, server, request))
                except fk.BackendFailure as exc:  # the normaliser's end of the turn (a stalled provider)
                    server.kill()
                    return norm.finish("failed", exc.kind, exc.message, self._extra(context))
                if done is not None:
                    return self._completed(context, server, done.get("params"))
            elif item[0] == "fatal":
                server.kill()
                return norm.finish("failed", item[1].kind, item[1].message, self._extra(context))
            else:  # EOF: codex is gone
                if context.reason:
                    return self._end_stopped(context)
                rc = server.returncode(wait=2.0)
                hint = server.stderr_summary(settle=STDERR_SETTLE)
                return norm.finish("failed", fk.BACKEND_FAILED,
                                   f"codex app-server exited (rc {rc}) before the turn completed"
                                   + (f": {hint}" if hint else ""), self._extra(context))

    def _grace(self, context: CodexContext) -> float:
        return TIMEOUT_GRACE if context.reason == "timeout" else INTERRUPT_GRACE

    def _send_interrupt(self, context: CodexContext, server: AppServer) -> None:
        context.stop_sent_at = time.monotonic()
        context.sink.emit("backend_status", {"phase": "interrupting", "reason": context.reason})
        if context.thread_id and context.turn_id:
            server.call("turn/interrupt", {"threadId": context.thread_id, "turnId": context.turn_id})

    def _completed(self, context: CodexContext, server: AppServer, params: Any) -> None:
        norm = context.normalizer
        turn = (params or {}).get("turn") if isinstance(params, dict) else None
        if isinstance(turn, dict) and context.turn_id and turn.get("id") not in (None, context.turn_id):
            server.note(f"turn/completed for another turn {turn.get('id')!r}")
        try:
            status, kind, message = norm.outcome(params)
        except fk.BackendFailure as exc:
            return norm.finish("failed", exc.kind, exc.message, self._extra(context))
        if status == "cancelled" and context.reason == "timeout":
            status, kind, message = "failed", fk.BACKEND_TIMEOUT, self._timeout_message(context)
        norm.finish(status, kind, message, self._extra(context))

    def _end_stopped(self, context: CodexContext) -> None:
        reason = context.reason or self._stop_reason(context) or "cancelled"
        if reason == "timeout":
            context.normalizer.finish("failed", fk.BACKEND_TIMEOUT, self._timeout_message(context),
                                      self._extra(context))
        else:
            context.normalizer.finish("cancelled", fk.CANCELLED, "the run was cancelled", self._extra(context))

    def _timeout_message(self, context: CodexContext) -> str:
        return f"the run passed its timeout of {context.run.policy.timeout_seconds} s"

    def _extra(self, context: CodexContext) -> dict[str, Any]:
        return {"duration_ms": int((time.monotonic() - context.started) * 1000)}

    def _answer(self, context: CodexContext, server: AppServer, msg: Message) -> None:
        """Server-to-client requests: approvals are declined (the policy is never widened), the rest refused."""
        method, params = msg.get("method"), msg.get("params") or {}
        if method in ("item/commandExecution/requestApproval", "item/fileChange/requestApproval"):
            server.respond(msg["id"], {"decision": "decline"})
        elif method in ("execCommandApproval", "applyPatchApproval"):
            server.respond(msg["id"], {"decision": "denied"})
        else:
            server.respond(msg["id"], error={"code": -32601, "message": f"caldera does not support {method}"})
        context.sink.emit("tool_call", {
            "item_id": params.get("itemId"), "tool": "approval", "status": "declined", "request": method,
            "command": params.get("command") if isinstance(params.get("command"), str) else None,
            "reason": "the execution policy allows no approvals in unattended runs"})

    def interrupt(self, context: CodexContext) -> bool:
        """Ask the turn loop to interrupt (turn/interrupt, then kill after the grace)."""
        already = context.interrupt_event.is_set()
        context.interrupt_event.set()
        return not already

    def finalize(self, context: CodexContext) -> dict[str, Any]:
        try:
            if context.server is not None and context.server.proc is not None:
                rc = context.server.close()
                context.server.note(f"codex app-server ended, rc {rc}")
        finally:
            if context.forwarder is not None:
                context.forwarder.close()
            shutil.rmtree(context.run_dir, ignore_errors=False, onerror=_note_rmtree(context))
        return context.sink.terminal_data()


def _note_rmtree(context: CodexContext) -> Callable[[Callable[..., object], str, _ExcInfo], None]:
    def onerror(func: Callable[..., object], path: str, exc_info: _ExcInfo) -> None:
        if context.sink.runlog is not None:
            context.sink.runlog.note(f"could not remove {path}: {exc_info[1]}")
    return onerror


def _version(binary: str) -> str | None:
    result = proc.run([binary, "--version"], env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"},
                      timeout=10, stdout_cap=4096)
    return result.stdout.decode("utf-8", "replace").strip() or None if result.ok else None
