"""`caldera check`: a manifest and its adapter against the contract (see caldera.agents.check)."""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from caldera import config
from caldera.agents.adapter.invoke import workdir_problem
from caldera.agents.check import Report, run_checks
from caldera.agents.updates import load_effective
from caldera.cli import add_agent_flags
from caldera.errors import EXIT_FAILED, EXIT_OK, ConfigError

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from caldera.config import AgentPaths


def configure(parser: argparse.ArgumentParser) -> None:
    add_agent_flags(parser)
    parser.add_argument("--controls", action="store_true",
                        help="also call pause, resume and run-now (they act on the agent)")
    parser.add_argument("--start", action="store_true",
                        help="process mode: start the agent once in a scratch state dir and check its status file")


def main(args: argparse.Namespace) -> int:
    paths = config.agent_from_args(args)
    report = Report()
    try:
        manifest = load_effective(paths, validate_schema=True)
    except ConfigError as exc:
        found, kind = _every_problem(paths.manifest_path, str(exc))
        for problem in found:
            report.breach("manifest", problem)
        return _emit(args, paths, report, f"the {kind} contract")
    report.ok("manifest", f"valid: runtime.type {manifest.runtime_type}, {len(manifest.settings_schema)} "
                          f"settings, controls {', '.join(manifest.controls or ('(all)',))}")
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


def _every_problem(path: Path, first: str) -> tuple[list[str], str]:
    """(problems, mode): the plain check stops at its first problem; the schema names every bad
    key. Both are shown, the plain one first (it also says what a schema can't, e.g. min above
    max), a schema problem about the same key only once."""
    import yaml  # here: only a broken manifest pays for a second parse

    from caldera.protocol.schemas import problems

    try:
        with open(path, "rb") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError):
        return [first], "adapter"
    runtime = doc.get("runtime") if isinstance(doc, dict) else None
    kind = "process" if isinstance(runtime, dict) and runtime.get("type") == "process" else "adapter"
    found = [first]
    for problem in problems("manifest.schema.json", doc):
        key = problem.split(": ", 1)[0]
        if f": {key}:" not in first and f": {key} " not in first:
            found.append(f"{path}: {problem}")
    return found, kind


def _emit(args: argparse.Namespace, paths: AgentPaths, report: Report, contract: str = "the adapter contract") -> int:
    code = EXIT_FAILED if report.breaches else EXIT_OK
    summary = (f"{report.breaches} breach{'es' if report.breaches != 1 else ''} of {contract}"
               if report.breaches else f"no breach of {contract}")
    if args.json:
        print(json.dumps({"ok": not report.breaches, "message": summary, "held": [],
                          "agent": paths.name, "checks": report.items}))
        return code
    print(f"caldera check: {paths.name} ({paths.manifest_path})")
    for item in report.items:
        mark = {"fail": "FAIL"}.get(item["result"], item["result"])
        print(f"  {mark:<15} {item['check']}: {item['detail']}")
    print(summary + ".", file=sys.stdout if not report.breaches else sys.stderr)
    return code
