"""`caldera skills [--json]`: the skill inventory with content_md5 (SPEC section 4).

Local and read-only: it scans the roots (using the daemon's cache where it
can read it) and never writes the cache, so it is safe beside the daemon and
as another user."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from caldera.cli import add_agent_flags
from caldera.config import agent_from_args, load_settings
from caldera.skills import inventory

if TYPE_CHECKING:
    import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    add_agent_flags(parser)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def main(args: argparse.Namespace) -> int:
    paths = agent_from_args(args)
    settings = load_settings(paths)
    inv = inventory.Inventory(paths.state_dir, settings.env, settings.runtime_type, persist=False)
    scan = inv.scan()
    roots, _ = inventory.roots(paths.state_dir, settings.env)
    if args.json:
        print(json.dumps({"skills": scan.records, "complete": scan.complete, "problems": scan.problems,
                          "roots": [{"path": str(r.path), "kind": r.kind} for r in roots]}, ensure_ascii=False))
        return 0 if scan.complete else 1
    if not scan.records:
        print("no skills")
    for r in scan.records:
        status = r["metadata"].get("status", "active")
        print(f"{r['identifier']:<32} {status:<8} {r['content_md5']} {r['file_count']:>6} files "
              f"{_size(r['size_bytes']):>10}  {r['install_path']}")
    for problem in scan.problems:
        print(f"! {problem}")
    if not scan.complete:
        print("the scan was incomplete (see above)")
    return 0 if scan.complete else 1
