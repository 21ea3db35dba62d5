"""`caldera check`: the manifest, then every verb of the adapter against the contract.

A report an adapter's author can act on: each breach names the verb, what was
seen and what the contract wants. Breaches looked for: anything but exactly one
JSON object (two objects, diagnostics on stdout), answers that break the
published schemas, wrong exit codes (exit 0 after a failure, 2 for a known
verb), a path accepted as a log name, silent clamping in `settings set`, a slow
`status`. By default nothing is changed for good: the `settings set` probes are
ones a correct adapter refuses, and anything a wrong one took is put back.
`--controls` also calls pause, resume and run-now (they act on the agent).

First, whether `runtime.command` can start at all: its program on the adapter's PATH
(or a file in the workdir), and the script an interpreter is given (`[python3,
adapter.py]`) in the workdir. When it cannot, `status` is still called (the adapter's
own stderr, python's "can't open file", says it in its words) and nothing else: every
other verb would only fail the same way, each looking like a verb not implemented.

Otherwise every probe runs, whatever an earlier one gave (a broken `settings set` is
reported even when `settings get` failed), and each is listed with its result:
`pass`, `fail`, or `not implemented` — exit 2 for a verb the adapter does not
implement is what the contract asks for (seed 000's own minimal adapter has no
`log NAME`), so it is no breach; only `status` is required of every adapter.
A verb that exits non-zero is shown with the end of its stderr (redacted, then cut:
answer.stderr_excerpt), so "exit 2" says why.
Exit 0: no breach; 1: a breach; 2: usage (no such agent).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from caldera import TYPE_CHECKING
from caldera.agents import settings, startprobe, status
from caldera.agents.adapter import health, invoke, logs
from caldera.agents.adapter.answer import (
    DONE,
    FAILED,
    REFUSED,
    UNSUPPORTED,
    ContractError,
    parse_object,
    stderr_excerpt,
)
from caldera.protocol.schemas import SchemaError, validate

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from caldera.agents.adapter.answer import Answer
    from caldera.agents.manifest import Manifest

SLOW_STATUS_SECONDS = 2.0  # a tenth of status's 20 s: answer from a cache you keep
PATH_PROBE = "../../etc/passwd"
UNKNOWN_LOG = "caldera-check-no-such-log.log"
UNKNOWN_VERB = "caldera-check-unknown-verb"


PASS, FAIL, NOT_IMPLEMENTED, NOTE = "pass", "fail", "not implemented", "note"


@dataclass
class Report:
    """Each item: {check, result: pass|fail|not implemented|note, ok, detail[, stderr]}.

    redact: the agent's Redactor; an adapter's stderr passes it before it is cut (stderr:
    its last lines, for an item whose verb exited non-zero)."""

    items: list[dict[str, Any]] = field(default_factory=list)
    redact: Callable[[Any], Any] = field(default=lambda value: value)

    def _add(self, check: str, result: str, detail: str, stderr: str = "") -> None:
        item = {"check": check, "result": result, "ok": result != FAIL, "detail": detail}
        shown = stderr_excerpt(stderr, self.redact) if stderr else []
        if shown:
            item["stderr"] = shown
        self.items.append(item)

    def ok(self, check: str, detail: str) -> None:
        self._add(check, PASS, detail)

    def breach(self, check: str, detail: str, stderr: str = "") -> None:
        self._add(check, FAIL, detail, stderr)

    def not_implemented(self, check: str, detail: str = "exit 2: the adapter does not implement this verb",
                        stderr: str = "") -> None:
        self._add(check, NOT_IMPLEMENTED, detail, stderr)

    def note(self, check: str, detail: str) -> None:
        self._add(check, NOTE, detail)

    @property
    def breaches(self) -> int:
        return sum(1 for item in self.items if not item["ok"])


def run_checks(manifest: Manifest, report: Report, *, controls: bool = False) -> Report:
    """Every probe, each on its own: a failed one never skips a later one (but an adapter
    that cannot start is asked for `status` only)."""
    check_workdir(manifest, report)
    starts = check_command(manifest, report)
    check_status(manifest, report)
    if not starts:
        report.note("other verbs", "not called: the adapter cannot start (runtime.command, above)")
        return report
    got = check_settings_get(manifest, report)
    if manifest.settings_schema:
        # Without a good `settings get` the set probes still run: no bounds to narrow with,
        # and no original values to put back (a wrong adapter's acceptance is reported so).
        check_settings_set(manifest, report, *(got or ({}, {})), originals_known=got is not None)
    check_logs(manifest, report)
    check_unknown_verb(manifest, report)
    if controls:
        check_controls(manifest, report)
    if manifest.health:
        check_health(manifest, report)
    return report


def check_workdir(manifest: Manifest, report: Report) -> None:
    """Whether this user (root's `sudo caldera check` becomes the agent's account) can write the
    adapter's working directory: seed 000's minimal adapter keeps `paused`, `run-now` and
    `settings.json` there. A note, not a breach: which files the adapter writes is the
    agent's business, and a bundle's workdir is read-only under the unit by design."""
    problem = invoke.writable_problem(manifest.workdir)
    if problem:
        report.note("workdir", problem)


def check_command(manifest: Manifest, report: Report) -> bool:
    """Whether runtime.command can start: its program exists (on the adapter's own PATH,
    which is not the person's), and so does the script an interpreter is given."""
    problem, found = startprobe.probe(manifest.command, manifest.workdir, manifest.path, invoke.SAFE_PATH)
    if problem:
        report.breach("command", problem)
        return False
    report.ok("command", found)
    return True


def _schema(name: str, document: Any) -> str | None:
    try:
        validate(name, document)
    except SchemaError as exc:
        return f"breaks {name}: {exc}"
    return None


def _failure(answer: Answer) -> str:
    """A failed call's reason as a check's detail: without the verb's name in front (the
    check names it), and an adapter that cannot start said once (its check is above)."""
    reason = answer.reason or "failed"
    if f": {startprobe.CANNOT_START}: " in f": {reason}":
        return "exit 2 from an adapter that cannot start (command, above), not a verb it does not know"
    return reason.removeprefix(f"{answer.verb}: ")


def _not_done(check: str, answer: Answer, report: Report, required: bool = False) -> None:
    if answer.kind == FAILED:
        report.breach(check, _failure(answer), answer.stderr)
    elif answer.kind == UNSUPPORTED and required:
        report.breach(check, "exit 2 (not supported), but every adapter must answer this verb", answer.stderr)
    elif answer.kind == UNSUPPORTED:
        report.not_implemented(check, stderr=answer.stderr)
    else:
        report.breach(check, f"exit 1 (refused: {answer.message or 'no message'}); this verb must exit 0",
                      answer.stderr)


def check_status(manifest: Manifest, report: Report) -> None:
    answer = invoke.call(manifest, "status")
    if answer.kind != DONE or answer.data is None:  # done: a JSON verb's answer is its object
        return _not_done("status", answer, report, required=True)
    problem = _schema("adapter-status.schema.json", answer.data)
    if problem is None:
        try:
            status.filter_status(answer.data)
        except ContractError as exc:
            problem = str(exc).removeprefix("status: ")
    if problem:
        report.breach("status", problem)
    else:
        dropped = sorted(set(answer.data) - set(status.FIELDS))
        report.ok("status", "one JSON object, matches adapter-status.schema.json"
                  + (f"; not forwarded: {', '.join(dropped)}" if dropped else ""))
    if answer.duration > SLOW_STATUS_SECONDS:
        report.breach("status", f"took {answer.duration:.1f} s (over {SLOW_STATUS_SECONDS:g} s): answer from a "
                                "cache the adapter keeps, never reach a slow service inside status")
    else:
        report.ok("status", f"answered in {answer.duration:.2f} s")


def check_settings_get(manifest: Manifest, report: Report) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(values, bounds) for the set probes, or None when settings get failed or is not needed."""
    if not manifest.settings_schema:
        report.note("settings get", "the manifest declares no settings: not called")
        return None
    answer = invoke.call(manifest, "settings get")
    if answer.kind != DONE or answer.data is None:  # done: a JSON verb's answer is its object
        _not_done("settings get", answer, report)
        return None
    problem = _schema("adapter-settings-get.schema.json", answer.data)
    try:
        values, bounds = settings.check_settings_get(answer.data, manifest.settings_schema)
    except ContractError as exc:
        problem = problem or str(exc).removeprefix("settings get: ")
    if problem:
        report.breach("settings get", problem)
        return None
    missing = [i["key"] for i in manifest.settings_schema if i["key"] not in answer.data["values"]]
    report.ok("settings get", "one JSON object, matches adapter-settings-get.schema.json"
              + (f"; no value for {', '.join(missing)} (reported as unset)" if missing else ""))
    return values, bounds


def _outside(item: dict[str, Any]) -> float | int | None:
    """A value just above the setting's effective maximum (None: no numeric maximum)."""
    high = item.get("max")
    if item["type"] not in ("percent", "number", "integer") or high is None:
        return None
    if item["type"] == "integer":
        return int(high) + int(item.get("step") or 1)
    step = item.get("step") or (0.01 if item["type"] == "percent" else max(1.0, abs(high) * 0.01))
    return round(high + step, 10)


def check_settings_set(manifest: Manifest, report: Report, originals: dict[str, Any], bounds: dict[str, Any], *,
                       originals_known: bool = True) -> None:
    """Probes a correct adapter refuses; what a wrong one took is put back to `originals`."""
    narrowed = settings.narrow(manifest.settings_schema, bounds)
    probes: list[tuple[str, str, str | None, str]] = [("not JSON", "{not json", None,
               "exit 0 after a failure: settings set took an argument that is not JSON"),
              ("undeclared key", json.dumps({"caldera_check_no_such_setting": 1}), None,
               "exit 0 after a failure: settings set took a key that is not a setting")]
    for item in narrowed:
        value = _outside(item)
        if value is not None:
            probes.append((f"{item['key']} above its maximum {item['max']}", json.dumps({item["key"]: value}),
                           item["key"], f"silent clamping: settings set took {item['key']}={value}, above the "
                                        f"maximum {item['max']}, and exited 0; refuse with exit 1 and a reason"))
            break
    for label, arg, key, wrong in probes:
        answer = invoke.call(manifest, "settings set", (arg,))
        check = f"settings set ({label})"
        if answer.kind == REFUSED:
            _refusal_ok(check, answer, report)
        elif answer.kind == DONE or answer.returncode == 0:
            # Exit 0 is the breach, whatever it printed (a failure text on stdout is a second one).
            report.breach(check, wrong + (f" ({answer.reason})" if answer.kind == FAILED else ""))
            if key is not None and originals_known:
                _restore(manifest, report, key, originals.get(key))
            elif key is not None:
                report.breach("settings set", f"could not put {key} back: settings get gave no original "
                                              "value; check the agent's settings by hand")
        else:
            _not_done(check, answer, report)


def _refusal_ok(check: str, answer: Answer, report: Report) -> None:
    problem = refusal_stdout_problem(answer.stdout)
    if problem:
        report.breach(check, problem)
    else:
        report.ok(check, f"refused with exit 1: {answer.message or '(no message)'}")


def _restore(manifest: Manifest, report: Report, key: str, value: Any) -> None:
    answer = invoke.call(manifest, "settings set", (json.dumps({key: value}),))
    if answer.kind == DONE:
        report.note("settings set", f"put {key} back to {json.dumps(value)}")
    else:
        report.breach("settings set", f"could not put {key} back to {json.dumps(value)}: "
                                      f"{answer.reason or answer.message}; check the agent's settings by hand",
                      answer.stderr)


def check_logs(manifest: Manifest, report: Report) -> None:
    answer = invoke.call(manifest, "log --list")
    if answer.kind == UNSUPPORTED:
        report.not_implemented("log --list", "exit 2: this agent offers no logs", answer.stderr)
    elif answer.kind != DONE or answer.data is None:  # done: a JSON verb's answer is its object
        _not_done("log --list", answer, report)
    else:
        _check_log_list(answer.data, report)
    _check_log_names(manifest, report)


def _check_log_list(data: dict[str, Any], report: Report) -> None:
    problem = _schema("adapter-log-list.schema.json", data)
    try:
        names = logs.check_log_list(data)
    except ContractError as exc:
        problem = problem or str(exc).removeprefix("log --list: ")
        names = []
    if problem:
        report.breach("log --list", problem)
        return
    refused = [e["name"] for e in data["logs"] if logs.name_problem(e["name"])]
    if refused:
        report.breach("log --list", f"offers names the runtime refuses: {', '.join(map(repr, refused[:5]))}")
    else:
        report.ok("log --list", f"one JSON object, {len(names)} names")
    if len(data["logs"]) > logs.LIST_MAX:
        report.note("log --list", f"{len(data['logs'])} names; only the first {logs.LIST_MAX} are used")


def _check_log_names(manifest: Manifest, report: Report) -> None:
    """A path and an unknown name: both must be refused (exit 1)."""
    for name, wrong in ((PATH_PROBE, "a path accepted as a log name: validate names yourself too"),
                        (UNKNOWN_LOG, "an unknown log name answered with exit 0; exit 1 for no such log")):
        probe = invoke.call(manifest, "log", (name,))
        if probe.kind == REFUSED:
            _refusal_ok(f"log {name}", probe, report)
        elif probe.kind == DONE:
            report.breach(f"log {name}", wrong)
        elif probe.kind == UNSUPPORTED:
            report.not_implemented(f"log {name}", "exit 2: the adapter does not implement `log NAME`", probe.stderr)
        else:
            _not_done(f"log {name}", probe, report)


def check_unknown_verb(manifest: Manifest, report: Report) -> None:
    verb = invoke.Verb((UNKNOWN_VERB,), 10, 64 * invoke.KIB, "answer")
    answer = invoke.call(manifest, UNKNOWN_VERB, verb=verb)
    if answer.kind == UNSUPPORTED:
        report.ok("unknown verb", "exit 2")
    else:
        seen = {DONE: "exit 0", REFUSED: "exit 1"}.get(answer.kind) or _failure(answer)
        report.breach("unknown verb", f"{seen}; a verb the adapter does not know must exit 2", answer.stderr)


def check_controls(manifest: Manifest, report: Report) -> None:
    for verb in ("pause", "resume", "run-now"):
        answer = invoke.call(manifest, verb)
        if answer.kind == DONE or (verb == "run-now" and answer.kind == REFUSED):
            problem = _schema("adapter-answer.schema.json", answer.data) if answer.data is not None else None
            if answer.kind == REFUSED:
                problem = problem or refusal_stdout_problem(answer.stdout)
            if problem:
                report.breach(verb, problem)
            else:
                report.ok(verb, f"exit {answer.returncode}: {answer.message or '(no message)'}")
        else:
            _not_done(verb, answer, report)


def check_health(manifest: Manifest, report: Report) -> None:
    entry = health.check(manifest)
    if entry["level"] == "ok":
        report.ok("health check", entry["reason"])
    else:
        report.note("health check", f"bad: {entry['reason']} (a health problem, not a contract breach)")


def refusal_stdout_problem(stdout: bytes) -> str | None:
    """Text on stdout with exit 1 that is not one JSON object: diagnostics belong on stderr."""
    if not stdout.strip():
        return None
    try:
        parse_object(stdout, "refusal")
    except ContractError as exc:
        return f"{exc}; with exit 1 stdout may hold one {{\"message\": …}} object, diagnostics go to stderr"
    return None
