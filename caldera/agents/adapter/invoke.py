"""Calling the adapter: `<runtime.command…> <verb> [args]`, as SPEC section 7 fixes it.

argv only, cwd = runtime.workdir, a new process in its own process group per
call, the per-verb timeout and stdout cap (runtime.timeout_seconds replaces
every timeout), TERM -> 2 s -> KILL, and an environment built from nothing:
not one variable of the runtime's own environment, agent.env or secrets.env
reaches the adapter. Exit codes: 0 done, 1 refused, 2 not supported, anything
else (and a timeout, a signal, output over the cap, or a JSON verb that printed
anything but one JSON object) a failure. Exit 2 from an adapter that cannot start
(python's answer to a script it cannot open) is that failure, said so
(caldera.agents.startprobe), never "not supported".
"""
from __future__ import annotations

import os
import pwd
import stat
import threading

from caldera import TYPE_CHECKING
from caldera.agents.adapter.answer import (
    DONE,
    FAILED,
    MESSAGE_MAX,
    REFUSED,
    UNSUPPORTED,
    Answer,
    ContractError,
    check_answer_body,
    parse_object,
)
from caldera.agents.startprobe import CANNOT_START, start_problem
from caldera.host import proc
from caldera.host.jsonlimits import scrub

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from caldera.agents.manifest import Manifest

KIB = 1024
GRACE_SECONDS = 2.0
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


class Verb:
    """How one verb is called (a plain class: see Answer on dataclasses)."""

    __slots__ = ("words", "timeout", "stdout_cap", "mode")

    def __init__(self, words: tuple[str, ...], timeout: float, stdout_cap: int, mode: str) -> None:
        self.words = words  # what follows the command
        self.timeout = timeout  # seconds, unless runtime.timeout_seconds replaces it
        self.stdout_cap = stdout_cap
        self.mode = mode  # json: one JSON object | answer: empty or one {message, held} | text: a log tail


VERBS = {
    "status": Verb(("status",), 20, 256 * KIB, "json"),
    "pause": Verb(("pause",), 30, 64 * KIB, "answer"),
    "resume": Verb(("resume",), 30, 64 * KIB, "answer"),
    "run-now": Verb(("run-now",), 30, 64 * KIB, "answer"),
    "settings set": Verb(("settings", "set"), 30, 64 * KIB, "answer"),
    "settings get": Verb(("settings", "get"), 10, 64 * KIB, "json"),
    "log --list": Verb(("log", "--list"), 10, 64 * KIB, "json"),
    "log": Verb(("log",), 20, 512 * KIB, "text"),
}
HEALTH = Verb((), 20, 64 * KIB, "health")


def adapter_env(agent_name: str, verb: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The whole environment of an adapter call (SPEC section 7), nothing inherited but TZ."""
    env = {"PATH": SAFE_PATH, "HOME": _home(), "LANG": "C.UTF-8",
           "CALDERA_AGENT": agent_name, "CALDERA_VERB": verb}
    if environ.get("TZ"):
        env["TZ"] = environ["TZ"]
    return env


def _home() -> str:
    # The runtime user's home from the password database, not $HOME from the environment.
    try:
        return pwd.getpwuid(os.getuid()).pw_dir or "/"
    except KeyError:
        return "/"


def timeout_for(manifest: Manifest, verb: Verb) -> float:
    return float(manifest.timeout_seconds) if manifest.timeout_seconds else verb.timeout


def call(manifest: Manifest, verb_name: str, args: Sequence[str] = (), *, cancel: threading.Event | None = None,
         environ: Mapping[str, str] = os.environ, verb: Verb | None = None) -> Answer:
    """Run one verb and interpret it; never raises for the adapter's failures.

    verb: a Verb not in VERBS (`caldera check` probes an unknown verb with it).
    """
    verb = verb or VERBS[verb_name]
    argv = [*manifest.command, *verb.words, *args]
    answer = Answer(verb=verb_name, kind=FAILED)
    problem = workdir_problem(manifest.workdir)
    if problem:
        answer.reason = problem
        return answer
    result = proc.run(argv, env=adapter_env(manifest.name, verb_name, environ),
                      timeout=timeout_for(manifest, verb), stdout_cap=verb.stdout_cap,
                      cwd=str(manifest.workdir), keep_tail=verb.mode == "text",
                      cancel=cancel, grace=GRACE_SECONDS)
    answer = interpret(verb_name, verb, result, answer)
    if answer.kind == UNSUPPORTED:
        cannot = start_problem(manifest.command, manifest.workdir, manifest.path, SAFE_PATH)
        if cannot:  # exit 2, but from an interpreter that found no adapter to run
            answer.kind, answer.message, answer.reason = FAILED, None, f"{verb_name}: {CANNOT_START}: {cannot}"
    return answer


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def workdir_problem(workdir: Path) -> str | None:
    """Why the adapter cannot run in its workdir, as a sentence (None: it can). A home that
    user `caldera` may not enter (Debian 13's adduser makes homes 0700) is said so, never a traceback."""
    try:
        st = os.stat(workdir)
    except FileNotFoundError:
        return f"the adapter's workdir {workdir} does not exist"
    except PermissionError:
        return (f"the adapter's workdir {workdir} is out of reach of user {_user()} (permission denied): an agent "
                "that lives in a user's home runs as that account (caldera init --user ACCOUNT, docs/adapter.md)")
    except OSError as exc:
        return f"the adapter's workdir {workdir}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"the adapter's workdir {workdir} is not a directory"
    if not os.access(workdir, os.X_OK):
        return (f"the adapter's workdir {workdir} cannot be entered by user {_user()} (permission denied): an agent "
                "that lives in a user's home runs as that account (caldera init --user ACCOUNT, docs/adapter.md)")
    return None


def writable_problem(workdir: Path) -> str | None:
    """Whether this user can create a file in the workdir, as the adapter would (None: it can)."""
    probe = os.path.join(workdir, f".caldera-check-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return (f"the adapter could not write its working directory {workdir} as user {_user()} "
                f"({exc.strerror}): an adapter that keeps its state there fails every verb that writes")
    os.close(fd)
    os.unlink(probe)
    return None


def interpret(verb_name: str, verb: Verb, result: proc.ProcResult, answer: Answer) -> Answer:
    answer.returncode, answer.duration = result.returncode, result.duration
    answer.stderr = result.stderr.decode("utf-8", "replace")
    answer.stdout = result.stdout
    failure = result.failure()
    if failure:
        answer.kind, answer.reason = FAILED, f"{verb_name}: {failure}"
    elif result.returncode == 0:
        _done(verb_name, verb, result, answer)
    elif result.returncode == 1:
        answer.kind, answer.message = REFUSED, refusal_message(result.stdout)
    elif result.returncode == 2:
        answer.kind, answer.message = UNSUPPORTED, "not supported by this agent"
    else:
        answer.kind, answer.reason = FAILED, f"{verb_name}: exited with status {result.returncode}"
    return answer


def _done(verb_name: str, verb: Verb, result: proc.ProcResult, answer: Answer) -> None:
    answer.kind = DONE
    try:
        if verb.mode == "json":
            answer.data = parse_object(result.stdout, verb_name)
        elif verb.mode == "answer" and result.stdout.strip():
            answer.data = parse_object(result.stdout, verb_name)
            answer.message, answer.held = check_answer_body(answer.data, verb_name)
        elif verb.mode == "text":
            answer.text = result.stdout.decode("utf-8", "replace")
            answer.truncated = len(result.stdout) >= verb.stdout_cap
    except ContractError as exc:
        answer.kind, answer.reason, answer.data = FAILED, str(exc), None


def refusal_message(stdout: bytes) -> str | None:
    """A refusal's reason: {"message": …} when it printed one, else its text."""
    try:
        body = parse_object(stdout, "refusal")
    except ContractError:
        text = stdout.decode("utf-8", "replace").strip()
        return text[:MESSAGE_MAX] or None
    message = body.get("message")
    return scrub(message[:MESSAGE_MAX]) if isinstance(message, str) and message else None


def run_health(manifest: Manifest, *, cancel: threading.Event | None = None,
               environ: Mapping[str, str] = os.environ) -> proc.ProcResult:
    """The manifest's health check: the adapter's workdir and environment, 20 s / 64 KiB."""
    health = manifest.health or {}
    argv = list(health["command"])
    if "/" in argv[0] and not os.path.isabs(argv[0]):
        argv[0] = str(manifest.workdir / argv[0])
    timeout = health.get("timeout_seconds") or manifest.timeout_seconds or HEALTH.timeout
    return proc.run(argv, env=adapter_env(manifest.name, "health", environ), timeout=float(timeout),
                    stdout_cap=HEALTH.stdout_cap, cwd=str(manifest.workdir), grace=GRACE_SECONDS)
