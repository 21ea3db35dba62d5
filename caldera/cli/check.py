"""`caldera check [MANIFEST]`: a manifest and its adapter against the contract (see caldera.agents.check).

The manifest: `--agent NAME` (an installed one), or a manifest file or the directory that
holds its caldera.agent.yaml, as `--manifest PATH` or as the argument.
"""
from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from caldera import config
from caldera.agents.adapter.invoke import workdir_problem
from caldera.agents.check import Report, run_checks
from caldera.agents.updates import load_effective
from caldera.cli import add_agent_flags
from caldera.errors import EXIT_FAILED, EXIT_OK, ConfigError, UsageError
from caldera.host.jsonlimits import terminal_safe

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from caldera.config import AgentPaths
    from caldera.redact import Redactor


def configure(parser: argparse.ArgumentParser) -> None:
    add_agent_flags(parser)
    parser.add_argument("target", nargs="?", metavar="MANIFEST",
                        help=f"a manifest file, or a directory holding {config.MANIFEST_NAME} (as --manifest)")
    parser.add_argument("--controls", action="store_true",
                        help="also call pause, resume and run-now (they act on the agent)")
    parser.add_argument("--start", action="store_true",
                        help="process mode: start the agent once in a scratch state dir and check its status file")


def main(args: argparse.Namespace) -> int:
    try:
        _take_target(args)
        paths = config.agent_from_args(args)
    except UsageError as exc:  # ConfigError too: no agent to check, said as --json asks
        message = f"{exc}{_here(args)}"
        if args.json:
            print(json.dumps({"ok": False, "message": message, "held": [], "checks": []}))
            return exc.exit_code
        raise UsageError(message) from None
    report = Report(redact=_redactor(paths))
    try:
        manifest = load_effective(paths, validate_schema=True)
    except ConfigError as exc:
        found, kind = _every_problem(paths.manifest_path, str(exc))
        for problem in found:
            report.breach("manifest", problem)
        return _emit(args, paths, report, f"the {kind} contract")
    report.ok("manifest", f"valid: runtime.type {manifest.runtime_type}, {len(manifest.settings_schema)} "
                          f"settings, controls {', '.join(manifest.controls or ('(all)',))}")
    check_projection(paths, report)
    if manifest.runtime_type == "process":
        from caldera.agents.process.check import check_manifest, check_start

        check_manifest(paths, manifest, report)
        if args.start and not report.breaches:
            check_start(paths, manifest, report)
        return _emit(args, paths, report, "the process contract")
    if manifest.runtime_type != "adapter":
        report.breach("manifest", "runtime.type is not adapter: this check covers adapter mode only")
    elif workdir_problem(manifest.workdir):
        report.breach("manifest", f"runtime.workdir: {workdir_problem(manifest.workdir)}")
    else:
        run_checks(manifest, report, controls=args.controls)
    return _emit(args, paths, report)


def check_projection(paths: AgentPaths, report: Report) -> None:
    """The agent's secret projection as its code-agent runs will meet it, before any run: the
    sentence a run would end `secret-unavailable` with (caldera.backends.readiness), read as
    this process, which root's `caldera check` of an installed agent has made the agent's
    account (caldera.host.privdrop). An agent without one pays no import of the backends."""
    credentials = os.environ.get("CREDENTIALS_DIRECTORY")
    if not os.path.lexists(paths.secrets_dir) and not credentials:
        return
    from caldera.backends import readiness

    try:
        env = dict(config.load_settings(paths).env)
    except (ConfigError, OSError):  # a broken agent.env is said elsewhere; the files are still looked at
        env = dict(os.environ)
    said = set()
    who = readiness.reader(None)
    for item in readiness.check(env, str(paths.secrets_dir), env.get("CREDENTIALS_DIRECTORY"), who):
        if item.warning is not None and item.warning not in said:  # root's: the run goes on
            said.add(item.warning)
            report.note(f"projection {item.profile}", f"warning: {item.warning}")
        if item.problem is None:
            report.ok(f"projection {item.profile}", f"usable by {who.name}")
        elif item.problem not in said:  # the secrets dir's own problem is every backend's: said once
            said.add(item.problem)
            report.breach(f"projection {item.profile}", item.problem)


def _redactor(paths: AgentPaths) -> Redactor:
    """The agent's secrets where this user may read them, and every credential shape."""
    from caldera.cli.verbs import local_redactor
    from caldera.redact import Redactor

    try:
        return local_redactor(paths)
    except ConfigError:  # a broken agent.env is not what check is asked about
        return Redactor()


def _here(args: argparse.Namespace) -> str:
    """Nothing named, in a directory holding a manifest: the way to check that one."""
    if args.target or args.manifest or args.agent or not os.path.isfile(config.MANIFEST_NAME):
        return ""
    return f"; to check the {config.MANIFEST_NAME} here: caldera check ."


def _take_target(args: argparse.Namespace) -> None:
    """`caldera check PATH` is `caldera check --manifest PATH`."""
    if args.target is None:
        return
    if args.manifest or args.agent:
        raise UsageError(f"{args.target}: name the agent once (an argument, --manifest or --agent)")
    if not os.path.exists(args.target):
        raise UsageError(f"{args.target}: no such file or directory (a manifest file, or the directory that holds "
                         f"its {config.MANIFEST_NAME}; an installed agent: --agent NAME)")
    if os.path.isdir(args.target) and not os.path.isfile(os.path.join(args.target, config.MANIFEST_NAME)):
        raise UsageError(f"{args.target}: a directory without {config.MANIFEST_NAME} (name the manifest file, "
                         "or the directory that holds it)")
    args.manifest = args.target


def _every_problem(path: Path, first: str) -> tuple[list[str], str]:
    """(problems, mode): the plain check stops at its first problem; the schema names every bad
    key. Both are shown, the plain one first (it also says what a schema can't, e.g. min above
    max), a schema problem about the same key only once. A document that is no mapping at all
    (a list, an empty file) has one problem: the plain check's sentence."""
    import yaml  # here: only a broken manifest pays for a second parse

    from caldera.agents.manifest import explain_schema_problem
    from caldera.protocol.schemas import problems

    try:
        with open(path, "rb") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError):
        return [first], "adapter"
    if not isinstance(doc, dict):
        return [first], "adapter"
    runtime = doc.get("runtime")
    kind = "process" if isinstance(runtime, dict) and runtime.get("type") == "process" else "adapter"
    found = [first]
    for problem in problems("manifest.schema.json", doc):
        key = problem.split(": ", 1)[0]
        if f": {key}:" in first or f": {key} " in first:
            continue
        for sentence in explain_schema_problem(doc, problem):
            said_for = sentence.split(": ", 1)[0]  # the key it is about, when it names one first
            if sentence not in first and f": {said_for}: " not in first and f"{path}: {sentence}" not in found:
                found.append(f"{path}: {sentence}")
    return found, kind


def _emit(args: argparse.Namespace, paths: AgentPaths, report: Report, contract: str = "the adapter contract") -> int:
    code = EXIT_FAILED if report.breaches else EXIT_OK
    summary = (f"{report.breaches} breach{'es' if report.breaches != 1 else ''} of {contract}"
               if report.breaches else f"no breach of {contract}")
    items = report.redact(report.items)  # what an adapter printed may name a secret
    if args.json:
        print(json.dumps({"ok": not report.breaches, "message": summary, "held": [],
                          "agent": paths.name, "checks": items}))
        return code
    print(f"caldera check: {paths.name} ({paths.manifest_path})")
    for item in items:
        mark = {"fail": "FAIL"}.get(item["result"], item["result"])
        # what an adapter printed, a file's name: the terminal's escapes shown, not acted on
        print(terminal_safe(f"  {mark:<15} {item['check']}: {item['detail']}"))
        for number, line in enumerate(item.get("stderr", ())):
            print(terminal_safe(f"  {'':<15}   {'stderr:' if number == 0 else '':<8}{line}"))
    sys.stdout.flush()  # the summary on stderr follows the items, also in a terminal's one stream
    print(summary + ".", file=sys.stdout if not report.breaches else sys.stderr)
    return code
