"""The OpenCode backend: one turn = one session on the agent's `opencode serve`.

prepare: the provider (projection, ClawManager's OPENCODE_CONFIG_CONTENT or the gateway
variables), the run's model (refused -> blocked), the binary, the commands' sandbox (or
none: Bash denied); nothing is spawned.
start_turn: the server from the agent's ServerOwner (the daemon's; else one of the turn's
own, stopped at its end), its event stream for the workspace, a session carrying the
policy's permission rules, the prompt; then the events until the session is idle.
Stops: `agent_interrupt`/cancel -> abort -> `cancelled`; the deadline -> abort ->
`backend-timeout`; a provider that fails more than `max_retries` times in a row (OpenCode's
retries, or what the forwarder saw of its requests) -> abort -> the failure's kind; an answer
silent past the stall bound (the forwarder's view) -> abort -> `provider-unavailable`; an
answer from another model than the configured one -> abort -> `backend-failed`; an event
stream that is not JSON, or an event without its type and properties ->
`backend-json-parse-error` / `backend-response-invalid`, at once. A
session that does not go idle within the grace after its abort, or a garbled stream,
poisons the server (stopped once the turns on it are done).
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caldera import config
from caldera.backends import failures as fk
from caldera.backends import leftovers
from caldera.backends.base import APPROVALS, SANDBOXES, Backend, Environment, RunRequest, stop_reason
from caldera.backends.confine import other_workspace_roots, runtime_roots
from caldera.backends.events import EVENT_TYPES, EventSink
from caldera.backends.opencode import confine, project
from caldera.backends.opencode import policy as policy_rules
from caldera.backends.opencode import provider as prov
from caldera.backends.opencode import server as srv
from caldera.backends.opencode.mapping import TurnMapper, items, obj, retry_kind, turn_outcome
from caldera.backends.opencode.owner import DEFAULT_IDLE_SECONDS, Lease, ServerOwner
from caldera.backends.opencode.route import process_secret
from caldera.backends.registry import BINARIES, Refused, gateway_settings
from caldera.errors import ConfigError
from caldera.host import proc

DEFAULT_MAX_RETRIES = 2  # provider retries a turn allows before it is aborted (why 2: docs/backends.md)
RETRY_BUDGET = 60.0  # seconds from the first retry: a retry announced to come later aborts the turn now
INTERRUPT_GRACE = 5.0
TIMEOUT_GRACE = 2.0
CONNECT_WAIT = 10.0  # for the event stream's server.connected
POLL = 0.05
INSTRUCTIONS = "AGENTS.md"
INSTRUCTIONS_CAP = 32 * 1024
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
PLATFORM_PACKAGES = {"x86_64": "opencode-linux-x64", "aarch64": "opencode-linux-arm64"}


# ---------------------------------------------------------------- the binary

def find_binary(env: Mapping[str, str]) -> str | None:
    """Its variable, else its program on PATH (registry.BINARIES, as `installed` looks for it),
    the npm launcher resolved to the native binary."""
    variable, program = BINARIES[prov.PROFILE]
    explicit = variable(env)
    if explicit:
        return explicit
    found = shutil.which(program, path=env.get("PATH") or DEFAULT_PATH)
    return native_for(found) if found else None


def native_for(path: str) -> str:
    """The platform package's binary when `path` is opencode-ai's launcher that is not one
    (`bin/opencode.exe` stays a shell stub when npm ran no postinstall)."""
    real = os.path.realpath(path)
    try:
        with open(real, "rb") as fh:
            if fh.read(4) == b"\x7fELF":
                return path
    except OSError:
        return path
    package = Path(real).parent.parent  # node_modules/opencode-ai
    name = PLATFORM_PACKAGES.get(os.uname().machine, PLATFORM_PACKAGES["x86_64"])
    for base in (package / "node_modules", package.parent):
        candidate = base / name / "bin" / "opencode"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return path


def _workspace_roots(env: Mapping[str, str], workspace: str) -> list[str]:
    """What the agent's commands may read of its workspaces: its workspace roots (one server
    serves every workspace below them), else the run's workspace alone. Each command writes
    only in its own turn's workspace (confine.Admitted)."""
    real = os.path.realpath(workspace)
    roots = config.workspace_roots(env)
    if any(real == os.path.realpath(r) or real.startswith(os.path.realpath(r).rstrip("/") + "/") for r in roots):
        return roots
    return [workspace]


def read_instructions(workspace: str) -> str | None:
    """The workspace's AGENTS.md (OpenCode's project config, which would read it, is off):
    a regular file, never through a symlink, at most 32 KiB."""
    path = os.path.join(workspace, INSTRUCTIONS)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, INSTRUCTIONS_CAP)
    finally:
        os.close(fd)
    text = raw.decode("utf-8", "replace").strip()
    return f"Instructions from: {path}\n{text}" if text else None


# ---------------------------------------------------------------- the context

@dataclass
class OpenCodeContext:
    run: RunRequest
    environment: Environment
    sink: EventSink
    launch: srv.Launch
    provider: str
    model: str
    owner: ServerOwner
    private_owner: bool  # the turn's own (caldera turn, or no daemon owner): closed at the end
    max_retries: int  # failures in a row a turn allows before it is aborted
    stall_seconds: int  # an answer's silence a turn allows (0: no bound of caldera's)
    deadline: float
    instructions: str | None = None
    search: bool = True  # `rg` on the server's PATH: grep and glob allowed (policy.rules)
    cancel: threading.Event | None = None
    cancel_is_timeout: Callable[[], bool] | None = None
    interrupt_event: threading.Event = field(default_factory=threading.Event)
    lease: Lease | None = None
    stream: srv.EventStream | None = None
    session_id: str | None = None
    mapper: TurnMapper | None = None
    reason: str | None = None  # "cancelled" | "timeout" | "failure" once we abort the session
    failure: tuple[str, str] | None = None  # (kind, message) of a "failure" abort
    tries: int | None = None  # the provider requests in a row the failure took
    abort_sent_at: float = 0.0
    poison: bool = False
    first_retry: float | None = None  # time.monotonic() of the first retry announced in a row
    started: float = field(default_factory=time.monotonic)


def owner_of(environment: Environment, idle_seconds: float) -> ServerOwner | None:
    """The agent's owner of its OpenCode server, held by the daemon (`Environment.servers`:
    made by the first OpenCode run, closed in the daemon's stop sequence); None without one
    (`caldera turn`, or a daemon already stopping): the turn then starts a server of its own."""
    if environment.servers is None:
        return None
    return environment.servers.get(prov.PROFILE, lambda runs_dir: ServerOwner(runs_dir, idle_seconds=idle_seconds))


class OpenCodeBackend(Backend[OpenCodeContext]):
    name = "opencode"

    def resolve_profile(self, profile: str = "opencode", env: Mapping[str, str] | None = None,
                        probe: bool = False) -> dict[str, Any]:
        env = os.environ if env is None else env
        binary = find_binary(env)
        available = bool(binary and os.access(binary, os.X_OK))
        info: dict[str, Any] = {
            "name": "opencode", "default": False,
            "transport": "opencode serve (HTTP and server-sent events on 127.0.0.1, one server per agent)",
            "binary": binary, "available": available,
            "sandboxes": list(SANDBOXES), "approvals": list(APPROVALS), "network": True,
            "interrupt": True, "events": list(EVENT_TYPES), "failure_kinds": list(fk.FAILURE_KINDS),
            "llm_gateway": gateway_settings(env) is not None or bool(env.get("OPENCODE_CONFIG_CONTENT"))}
        if probe and available and binary:
            info["version"] = _version(binary, env)
        return info

    def prepare(self, run: RunRequest, environment: Environment, sink: EventSink) -> OpenCodeContext:
        """Everything that can fail before a process exists: provider, model, binary, settings."""
        env = environment.env
        redactor = environment.redactor
        if env.get("OPENCODE_SERVER_PASSWORD"):
            redactor.add(env["OPENCODE_SERVER_PASSWORD"])  # ClawManager's: the gateway token
        spec = prov.plan_server(env, environment.secrets_dir, environment.credentials_dir, run.model)
        for value in spec.secrets:
            redactor.add(value)
        binary = find_binary(env)
        provider, model = prov.choose_model(spec, env, run.model)  # Refused: the run ends blocked
        try:
            retries, idle = config.opencode_settings(env, retries=DEFAULT_MAX_RETRIES,
                                                     idle_seconds=DEFAULT_IDLE_SECONDS)
            stall = config.provider_stall_seconds(env)
        except ConfigError as exc:
            raise fk.BackendFailure(fk.BACKEND_FAILED, str(exc)) from None
        owner = owner_of(environment, idle)
        path = env.get("PATH") or DEFAULT_PATH
        state_dir = os.path.dirname(owner.runs_dir if owner is not None else os.path.abspath(environment.runs_dir))
        hidden = confine.private_paths(environment.secrets_dir, state_dir, environment.credentials_dir)
        # The runtime's TMPDIR whole, not only Claude Code's private root in it: that root exists
        # only while a Claude Code run does (removed after), and a dir missing at the server's
        # launch is not covered. And the other agents' workspace roots (wherever they lie).
        roots = _workspace_roots(env, run.workspace)
        others = other_workspace_roots(environment.config_root, [*roots, run.workspace], [binary])
        covered = [*runtime_roots(environment.config_root, environment.state_root, environment.persistent_dir),
                   str(leftovers.tmp_root()), *others]
        sandbox = None if run.policy.external else confine.plan(roots, covered, hidden, run.policy.network, path)
        sink.emit("backend_status", {
            "phase": "starting", "backend": "opencode", "profile": run.backend_profile, "binary": binary,
            "provider": provider, "model": model, "base_url": spec.base_url(provider),
            "provider_source": spec.source, "policy": run.policy.as_dict(),
            "server": "agent" if owner is not None else "turn",
            "commands": policy_rules.commands(run.policy, sandbox is not None or run.policy.external)})
        if not binary:
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED,
                                    "no OpenCode binary: set CALDERA_OPENCODE_BIN or put opencode on PATH")
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            # said here, before the agent's running server is replaced by one that cannot start
            raise fk.BackendFailure(fk.BACKEND_SPAWN_FAILED, f"cannot start {binary}: not an executable file")
        if not os.path.isdir(run.workspace):
            raise fk.BackendFailure(fk.BACKEND_FAILED, f"workspace {run.workspace} is not a directory")
        launch = srv.Launch(binary=binary, spec=spec, path=path, tz=env.get("TZ"), sandbox=sandbox,
                            external=run.policy.external)
        return OpenCodeContext(
            run=run, environment=environment, sink=sink, launch=launch, provider=provider, model=model,
            owner=owner or ServerOwner(environment.runs_dir, idle_seconds=idle), private_owner=owner is None,
            max_retries=retries, stall_seconds=stall, deadline=time.monotonic() + run.policy.timeout_seconds,
            instructions=read_instructions(run.workspace), search=shutil.which("rg", path=path) is not None)

    # ------------------------------------------------------------ the turn

    def start_turn(self, context: OpenCodeContext) -> None:
        planted = project.plugin_file(context.run.workspace)
        if planted is not None:  # before every turn: an earlier turn may have written it
            raise Refused(project.refusal(planted))
        try:
            context.lease = context.owner.get(context.launch, lambda: self._stop_reason(context) is not None)
        except srv.Stopped:
            return self._finish_stopped(context)
        server = context.lease.server
        try:
            context.lease.admit(context.run.workspace, writable=context.run.policy.sandbox == "workspace-write")
        except ValueError as exc:
            raise fk.BackendFailure(fk.BACKEND_FAILED, str(exc)) from None
        redactor = context.environment.redactor
        redactor.add(process_secret(), prefix=True)  # the server's password, route tokens, placeholders: whole
        for value in server.routes.secrets if server.routes is not None else ():
            redactor.add(value)  # credentials in a base URL or the proxy's URL
        context.sink.emit("backend_status", {
            "phase": "ready", "server": "started" if context.lease.started else "reused", "pid": server.pid,
            "listening_after_ms": int((server.listening_after or 0) * 1000) if context.lease.started else None,
            "proxy": server.routes.proxy_for(context.provider) if server.routes is not None else None,
            "search": policy_rules.search(context.search)})
        try:
            self._open_session(context, server)
        except srv.ServerError as exc:
            context.poison = True  # dead, or alive and not answering: the next turn gets a new one
            raise fk.BackendFailure(fk.BACKEND_FAILED, f"the OpenCode server failed: {exc}") from None
        self._loop(context, server)

    def _open_session(self, context: OpenCodeContext, server: srv.OpenCodeServer) -> None:
        run, sink = context.run, context.sink
        context.stream = server.events(run.workspace)
        limit = time.monotonic() + CONNECT_WAIT
        while not context.stream.connected.wait(POLL):  # subscribed before the prompt: nothing is missed
            if time.monotonic() >= limit or not server.alive():
                raise srv.ServerError("the event stream did not connect")
        session = self._call(context, server, "POST", "/session", {
            "title": f"caldera run {run.run_id}",
            "permission": policy_rules.rules(run.policy, context.launch.sandbox is not None or context.launch.external,
                                             context.search)})
        if not isinstance(session, dict) or not isinstance(session.get("id"), str):
            raise fk.BackendFailure(fk.BACKEND_RESPONSE_INVALID, "POST /session answered without a session id")
        context.session_id = session["id"]
        context.mapper = TurnMapper(sink, context.session_id)
        sink.emit("backend_status", {
            "phase": "thread_started", "thread_id": context.session_id, "model": context.model,
            "model_provider": context.provider, "sandbox": run.policy.sandbox, "approval": run.policy.approval,
            "network": run.policy.network, "cwd": run.workspace,
            "instructions": INSTRUCTIONS if context.instructions else None})
        body: dict[str, Any] = {"parts": [{"type": "text", "text": run.prompt}],
                                "model": {"providerID": context.provider, "modelID": context.model}}
        if context.instructions:
            body["system"] = context.instructions
        self._call(context, server, "POST", f"/session/{context.session_id}/prompt_async", body)
        sink.emit("backend_status", {"phase": "turn_started", "turn_id": context.session_id})

    def _loop(self, context: OpenCodeContext, server: srv.OpenCodeServer) -> None:
        assert context.stream is not None and context.mapper is not None
        mapper = context.mapper
        while True:
            if context.reason is None:
                reason = self._stop_reason(context)
                if reason is not None:
                    self._abort(context, server, reason)
                else:
                    self._watch_provider(context, server)
            elif time.monotonic() - context.abort_sent_at > self._grace(context):
                context.poison = True  # the session may still run: the server is not trusted any more
                self._note(context, "no idle after the abort: the server is stopped once free")
                return self._finish(context)
            try:
                kind, item = context.stream.next(POLL)
            except queue.Empty:
                continue
            if kind == "end":
                return self._server_gone(context, server, item)
            self._log(context, "s2c", item[1])
            if kind in ("bad", "invalid"):
                # a garbled stream cannot be followed any more (as Codex's stdout): the turn ends
                # with its kind, and the server that sent it is not trusted with another turn
                failure = fk.BACKEND_JSON_PARSE_ERROR if kind == "bad" else fk.BACKEND_RESPONSE_INVALID
                context.poison = True
                self._abort(context, server, "failure", (failure, f"OpenCode's event stream: {item[0]}"))
                return self._finish(context)
            action = mapper.handle(item[0])
            if action is not None:
                self._act(context, server, action)
            if mapper.idle:
                return self._finish(context)

    def _act(self, context: OpenCodeContext, server: srv.OpenCodeServer, action: tuple[str, Any]) -> None:
        what, value = action
        if what == "permission":
            self._reject(context, server, value)
        elif what == "question":
            self._call_quietly(context, server, "POST", f"/question/{value.get('id')}/reject", {})
        elif what == "retry":
            self._retry(context, server, value)
        elif what == "cut":
            self._cut(context, server)
        elif what == "model" and context.reason is None and value not in self._models(context):
            message = (f"OpenCode answered with model {value[0]}/{value[1]}, not the configured "
                       f"{context.provider}/{context.model}: the configured model could not be used")
            self._abort(context, server, "failure", (fk.BACKEND_FAILED, message))

    def _models(self, context: OpenCodeContext) -> set[tuple[str, str]]:
        """The run's model, and the config's default (OpenCode's small model: summaries)."""
        pid, _, model = context.launch.spec.default_model.partition("/")
        return {(context.provider, context.model), (pid, model)}

    def _reject(self, context: OpenCodeContext, server: srv.OpenCodeServer, props: dict[str, Any]) -> None:
        """Every ask is rejected (no one approves an unattended run), with a sentence the model reads."""
        self._call_quietly(context, server, "POST", f"/permission/{props.get('id')}/reply",
                           {"reply": "reject", "message": policy_rules.REJECT_MESSAGE})
        patterns = items(props.get("patterns"))
        metadata = obj(props.get("metadata"))
        tool = obj(props.get("tool"))
        context.sink.emit("tool_call", {
            "item_id": tool.get("callID") or props.get("id"), "tool": "approval", "status": "declined",
            "request": f"permission/{props.get('permission')}",
            "command": metadata.get("command") if isinstance(metadata.get("command"), str) else None,
            "patterns": [str(p)[:200] for p in patterns[:10]],
            "reason": f"the execution policy (approval: {context.run.policy.approval}) allows no approvals "
                      "in unattended runs"})

    def _retry(self, context: OpenCodeContext, server: srv.OpenCodeServer, status: dict[str, Any]) -> None:
        """A `session.status` retry: shown, counted, and past the cap (or the time budget) the end."""
        assert context.session_id is not None
        message = str(status.get("message") or "")
        upstream = server.forwarder.last_failure(context.session_id) if server.forwarder else None
        next_at = status.get("next")
        wait = max(0.0, next_at / 1000 - time.time()) if isinstance(next_at, (int, float)) else 0.0
        self._trouble(context, server, retry_kind(message, upstream), message,
                      upstream.status if upstream else None, wait)

    def _cut(self, context: OpenCodeContext, server: srv.OpenCodeServer) -> None:
        assert context.session_id is not None
        upstream = server.forwarder.last_failure(context.session_id) if server.forwarder else None
        message = "the provider's answer ended before it was complete"
        self._trouble(context, server, retry_kind(upstream.message if upstream else "unavailable", upstream),
                      message, upstream.status if upstream else None, 0.0)

    def _trouble(self, context: OpenCodeContext, server: srv.OpenCodeServer, cause: str, message: str,
                 status_code: int | None, wait: float) -> None:
        assert context.mapper is not None
        count = context.mapper.retries  # failures in a row: a completed answer sets it back to 0
        now = time.monotonic()
        if count <= 1 or context.first_retry is None:
            context.first_retry = now
        context.sink.emit("backend_status", {
            "phase": "retrying", "attempt": count, "max_attempts": context.max_retries, "message": message[:500],
            "cause": cause, "status_code": status_code, "next_in_ms": int(wait * 1000)})
        if context.reason is not None:
            return
        if count > context.max_retries:
            self._give_up(context, server, cause, count, message)
        elif now - context.first_retry + wait > RETRY_BUDGET:
            context.tries = count
            self._abort(context, server, "failure", (cause, (
                f"the provider kept failing and OpenCode would wait {wait:.0f} s more, past the "
                f"{RETRY_BUDGET:.0f} s a turn gives retries; last: {message[:300]}; {fk.tries(count)}")))

    def _watch_provider(self, context: OpenCodeContext, server: srv.OpenCodeServer) -> None:
        """What the forwarder sees of the session's requests, whatever OpenCode says of them:
        failures in a row past the cap, one try after OpenCode's own count would have ended
        the turn (its words are the better ones; this catches the retries it makes without
        a word), or an answer that has been silent past the stall bound."""
        forwarder, tag = server.forwarder, context.session_id
        if forwarder is None or tag is None:
            return
        streak = forwarder.streak(tag)
        if streak > context.max_retries + 1:
            upstream = forwarder.last_failure(tag)
            last = "no failure kept" if upstream is None else upstream.message
            if upstream is not None and upstream.status is not None:
                last = f"HTTP {upstream.status}: {upstream.message}"
            self._give_up(context, server, retry_kind(last, upstream), streak, last)
        elif context.stall_seconds and forwarder.silence(tag) > context.stall_seconds:
            context.tries = streak + 1
            message = fk.with_tries(fk.PROVIDER_UNAVAILABLE, fk.stalled(context.stall_seconds), context.tries)
            self._abort(context, server, "failure", (fk.PROVIDER_UNAVAILABLE, message))

    def _give_up(self, context: OpenCodeContext, server: srv.OpenCodeServer, cause: str, count: int,
                 last: str) -> None:
        context.tries = count
        self._abort(context, server, "failure", (cause, (
            f"the provider failed {fk.tries(count)} in a row, more than CALDERA_OPENCODE_MAX_RETRIES "
            f"({context.max_retries}) allows; last: {last[:300]}")))

    def _abort(self, context: OpenCodeContext, server: srv.OpenCodeServer, reason: str,
               failure: tuple[str, str] | None = None) -> None:
        context.reason, context.failure = reason, failure
        context.abort_sent_at = time.monotonic()
        context.sink.emit("backend_status", {"phase": "interrupting", "reason": reason})
        if context.session_id is not None:
            self._call_quietly(context, server, "POST", f"/session/{context.session_id}/abort", None)
            if server.forwarder is not None:
                server.forwarder.cut(context.session_id)  # a request on a silent provider ends now

    def _call_quietly(self, context: OpenCodeContext, server: srv.OpenCodeServer, method: str, path: str,
                      body: Any) -> None:
        try:
            self._call(context, server, method, path, body, timeout=10.0)
        except srv.ServerError as exc:
            self._note(context, f"{method} {path} failed: {exc}")

    def _stop_reason(self, context: OpenCodeContext) -> str | None:
        return stop_reason(context)

    def _grace(self, context: OpenCodeContext) -> float:
        return TIMEOUT_GRACE if context.reason == "timeout" else INTERRUPT_GRACE

    def _note(self, context: OpenCodeContext, text: str) -> None:
        self._log(context, "note", text)

    def _log(self, context: OpenCodeContext, channel: str, text: str) -> None:
        if context.sink.runlog is not None:
            context.sink.runlog.write(channel, text)

    def _call(self, context: OpenCodeContext, server: srv.OpenCodeServer, method: str, path: str, body: Any,
              timeout: float = srv.CALL_TIMEOUT) -> Any:
        """One API call, written to the run log (c2s) with its answer (s2c)."""
        self._log(context, "c2s", f"{method} {path} {json.dumps(body, ensure_ascii=False) if body is not None else ''}")
        answer = server.call(method, path, body, directory=context.run.workspace, timeout=timeout)
        self._log(context, "s2c", json.dumps(answer, ensure_ascii=False)[:4096])
        return answer

    # ------------------------------------------------------------ the end

    def _server_gone(self, context: OpenCodeContext, server: srv.OpenCodeServer, why: str) -> None:
        context.poison = True
        if context.reason in ("cancelled", "timeout"):
            return self._finish_stopped(context)
        if context.reason == "failure" and context.failure is not None:
            return self._end(context, "failed", *context.failure)  # what we aborted for, not the exit it caused
        rc = server.wait_exit(2.0)
        hint = server.output_tail()
        state = f"exited (rc {rc})" if rc is not None else why
        self._end(context, "failed", fk.BACKEND_FAILED,
                  f"the OpenCode server {state} before the turn ended" + (f": {hint}" if hint else ""))

    def _finish(self, context: OpenCodeContext) -> None:
        mapper = context.mapper
        assert mapper is not None
        if context.reason in ("cancelled", "timeout"):
            return self._finish_stopped(context)
        upstream = None
        lease = context.lease
        if lease is not None and lease.server.forwarder is not None and context.session_id:
            upstream = lease.server.forwarder.last_failure(context.session_id)
        status, kind, message = turn_outcome(mapper, context.failure, upstream, f"{context.provider}/{context.model}")
        if context.failure is None and status == "failed" and kind in fk.PROVIDER_KINDS:
            context.tries = mapper.retries + 1  # OpenCode's own end: the retries it announced, and the last
            message = fk.with_tries(kind, message or kind or "", context.tries)
        self._end(context, status, kind, message, raw=None if context.failure else mapper.error)

    def _finish_stopped(self, context: OpenCodeContext) -> None:
        if context.reason == "timeout" or (context.reason is None and self._stop_reason(context) == "timeout"):
            return self._end(context, "failed", fk.BACKEND_TIMEOUT,
                             f"the run passed its timeout of {context.run.policy.timeout_seconds} s")
        self._end(context, "cancelled", fk.CANCELLED, "the run was cancelled")

    def _end(self, context: OpenCodeContext, status: str, kind: str | None, message: str | None,
             raw: Any = None) -> None:
        sink = context.sink
        if context.mapper is not None:
            context.mapper.close_open()
        if status == "failed":
            error: dict[str, Any] = {"failure_kind": kind, "message": message}
            if context.tries is not None:
                error["tries"] = context.tries
            if isinstance(raw, dict):
                found = obj(raw.get("data"))
                error["opencode_error"] = raw.get("name")
                error["details"] = {k: found.get(k) for k in ("statusCode", "isRetryable") if k in found}
            sink.emit("error", error)
        data: dict[str, Any] = {"status": status, "failure_kind": kind if status != "completed" else None,
                                "duration_ms": int((time.monotonic() - context.started) * 1000)}
        if message and status != "completed":
            data["message"] = message
        if context.mapper is not None and context.mapper.usage:
            data["usage"] = dict(context.mapper.usage)
        sink.emit("terminal_status", data)

    def interrupt(self, context: OpenCodeContext) -> bool:
        already = context.interrupt_event.is_set()
        context.interrupt_event.set()
        return not already

    def finalize(self, context: OpenCodeContext) -> dict[str, Any]:
        try:
            if context.stream is not None:
                context.stream.close()
            lease = context.lease
            if lease is not None and context.session_id is not None and lease.server.alive() and not context.poison:
                # The turn's transcript leaves the agent's server with the turn (the run log has it):
                # later runs, and commands an agent runs there, do not find it.
                self._call_quietly(context, lease.server, "DELETE", f"/session/{context.session_id}", None)
            if lease is not None:
                # a plugin the turn left in the workspace is not for this server to load later
                poison = context.poison or project.plugin_file(context.run.workspace) is not None
                lease.release(poison=poison)
        finally:
            if context.private_owner:
                context.owner.close()
        return context.sink.terminal_data()


def _version(binary: str, env: Mapping[str, str]) -> str | None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="caldera-opencode-version-") as home:
        probe_env = {"PATH": env.get("PATH") or DEFAULT_PATH, "LANG": "C.UTF-8", "HOME": home,
                     "XDG_CONFIG_HOME": home, "XDG_DATA_HOME": home, "XDG_CACHE_HOME": home,
                     "XDG_STATE_HOME": home, "TMPDIR": home, **srv.OFFLINE_ENV}
        result = proc.run([binary, "--version"], env=probe_env, timeout=30, stdout_cap=4096)
    return (result.stdout.decode("utf-8", "replace").strip() or None) if result.ok else None
