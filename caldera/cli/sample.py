"""`caldera sample`: one sample of the system figures, as a state report would carry them.

`--json` prints exactly `{"system_info": …, "health": {"metrics_collector": …,
"metrics_collector_reasons": […]}}`. The human form shows CPU %, memory % and
disk % computed the way seed 004's front end draws them, and each interface's
counters. Exit 0 when a sample was taken (even `degraded`: the reasons are
printed), 2 when a root given on the command line is not a directory.
"""
from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from caldera import config
from caldera.errors import EXIT_OK, UsageError
from caldera.host.sampler import Sample, Sampler

if TYPE_CHECKING:
    import argparse

    from caldera.config import Environ


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object for machines")
    parser.add_argument("--proc-root", default="/proc", metavar="P", help="procfs root (default /proc)")
    parser.add_argument("--cgroup-root", default="/sys/fs/cgroup", metavar="C",
                        help="cgroup mount root (default /sys/fs/cgroup)")
    parser.add_argument("--persistent-dir", metavar="D",
                        help="directory whose filesystem the disk figures describe "
                             "(default $CALDERA_PERSISTENT_DIR, else the current directory)")
    parser.add_argument("--sys-root", metavar="S",
                        help="sysfs root for interface status and CPU count "
                             "(default: <X>/sys for a cgroup root <X>/sys/fs/cgroup, else /sys)")


def main(args: argparse.Namespace, environ: Environ | None = None, out: TextIO | None = None) -> int:
    environ = os.environ if environ is None else environ
    out = sys.stdout if out is None else out
    persistent = args.persistent_dir or config.persistent_dir(environ) or "."
    for flag, value in (("--proc-root", args.proc_root), ("--cgroup-root", args.cgroup_root),
                        ("--persistent-dir", persistent), ("--sys-root", args.sys_root)):
        if value is not None and not os.path.isdir(value):
            raise UsageError(f"{flag} {value}: not a directory")
    runtime_type = config.runtime_type_name(environ)
    sample = Sampler(proc_root=args.proc_root, cgroup_root=args.cgroup_root,
                     persistent_dir=persistent, runtime_type=runtime_type,
                     runtime_name=runtime_type, sys_root=args.sys_root).sample()
    if args.json:
        json.dump({"system_info": sample.system_info, "health": sample.health()}, out)
        out.write("\n")
    else:
        out.write(render(sample))
    return EXIT_OK


def percentages(system_info: dict[str, Any]) -> dict[str, float | None]:
    """CPU, memory and disk % exactly as seed 004's front end computes them (None: not drawn)."""
    cpu, mem, disk = (system_info.get(k) or {} for k in ("cpu", "memory", "disk"))
    load, cores = (cpu.get("load") or {}).get("1m"), cpu.get("cores")
    total, avail = mem.get("mem_total_bytes"), mem.get("mem_available_bytes")
    dtotal, dfree = disk.get("root_total_bytes"), disk.get("root_free_bytes")
    return {
        "cpu": load / cores * 100 if load is not None and cores else None,
        "memory": (total - avail) / total * 100 if total and avail is not None else None,
        "disk": (dtotal - dfree) / dtotal * 100 if dtotal and dfree is not None else None,
    }


def render(sample: Sample) -> str:
    info = sample.system_info
    pct = percentages(info)
    cpu, mem, disk = (info.get(k) or {} for k in ("cpu", "memory", "disk"))
    lines = [f"sampled at {info['sampled_at']} ({info['runtime_type']})"]
    load = cpu.get("load") or {}
    lines.append(_row("cpu", pct["cpu"], f"load {_loads(load)} over {cpu.get('cores', '?')} cores"
                      if cpu else ""))
    lines.append(_row("memory", pct["memory"],
                      f"{_size(mem['mem_total_bytes'] - mem['mem_available_bytes'])} used of "
                      f"{_size(mem['mem_total_bytes'])} ({mem.get('source', '?')})" if mem else ""))
    lines.append(_row("disk", pct["disk"],
                      f"{_size(disk['root_free_bytes'])} free of {_size(disk['root_total_bytes'])} "
                      f"at {disk['mount_path']}" if "root_total_bytes" in disk else ""))
    interfaces = (info.get("network") or {}).get("interfaces")
    if interfaces is None:
        lines.append("network   n/a")
    else:
        lines.append(f"network   {len(interfaces)} interface(s) besides lo")
        for nic in interfaces:
            addrs = ", ".join(nic["addresses"]) or "no address"
            lines.append(f"  {nic['name']:<12} {nic['status']:<7} rx {nic['rx_bytes']} B  "
                         f"tx {nic['tx_bytes']} B  {addrs}")
    lines.append(f"metrics_collector: {sample.metrics_collector}")
    lines.extend(f"  - {reason}" for reason in sample.reasons)
    return "\n".join(lines) + "\n"


def _row(name: str, percent: float | None, detail: str) -> str:
    if percent is None:
        return f"{name:<9} n/a"
    return f"{name:<9} {percent:5.1f} %  {detail}"


def _loads(load: dict[str, float]) -> str:
    return " ".join(f"{load[k]:.2f}" for k in ("1m", "5m", "15m") if k in load)


def _size(n: int) -> str:
    if abs(n) < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
