#!/usr/bin/env python3
"""Skill inventory against `md5sum`, on two trees, in one run (issue 16, point 4):

- "large": 100 skills of 2 files each, 200 MiB in all (hashing speed);
- "small": 10,000 files of 2 KiB in 100 skills (per-file cost: walk, open, read).

For each tree: caldera's full inventory (no cache) against `find … -type f -exec
md5sum {} +` over the same tree (target <= 1.15 x), and an unchanged re-scan through
the stat path (a fresh Inventory with the cache on disk: what `caldera skills` and
`report --once` do) and through the watcher's inotify path, each against the full
scan (target <= 5 %).

Measure: CPU time (user+sys): md5sum's from getrusage(RUSAGE_CHILDREN) deltas, caldera's
from getrusage(RUSAGE_SELF) deltas (it runs in this process), so the other loads of a
shared machine do not count; wall time is printed beside it. Warm page cache, one
warm-up each, rounds interleaved, medians. The trees live in one temp dir, removed at
the end.

    python bench/bench_skills.py [--rounds 5] [--large-mib 200] [--small-files 10000]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from caldera.skills import inventory, notify  # noqa: E402

SKILLS = 100
FULL_TARGET, RESCAN_TARGET = 1.15, 0.05


def build(root: str, files: int, size: int) -> None:
    blob = os.urandom(size + 4096)
    for i in range(files):
        skill = os.path.join(root, "state", "skills", f"skill-{i % SKILLS:03d}", f"d{(i // SKILLS) % 10}")
        os.makedirs(skill, exist_ok=True)
        with open(os.path.join(skill, f"f{i}.bin"), "wb") as fh:
            fh.write(blob[i % 4096:i % 4096 + size])


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def md5sum(root: str) -> tuple[float, float]:
    before, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(["find", os.path.join(root, "state", "skills"), "-type", "f", "-exec", "md5sum", "{}", "+"],
                          env={"PATH": "/usr/bin:/bin", "LANG": "C"}, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit("find/md5sum failed")
    return _children_cpu() - before, took


def stat_walk(root: str) -> tuple[float, float]:
    """The floor of any stat path: `find -printf` of the same figures, in C."""
    before, start = _children_cpu(), time.perf_counter()
    subprocess.run(["find", os.path.join(root, "state", "skills"), "-type", "f", "-printf", "%s %T@ %C@ %i %p\n"],
                   env={"PATH": "/usr/bin:/bin", "LANG": "C"}, stdout=subprocess.DEVNULL, check=True)
    return _children_cpu() - before, time.perf_counter() - start


def dir_reads(root: str) -> tuple[float, float]:
    """A floor of any stat path, in this process: reading every directory of the tree
    (names and d_types, no stat at all), which even a check of the directories alone needs."""
    before, start = _self_cpu(), time.perf_counter()
    for _ in os.walk(os.path.join(root, "state", "skills")):
        pass
    return _self_cpu() - before, time.perf_counter() - start


def lstats(paths: list) -> tuple[float, float]:
    """The other floor: one lstat per file with the paths already known (no directory read).
    A file edited in place changes only its own mtime/ctime, so a check without inotify
    must look at every file."""
    before, start = _self_cpu(), time.perf_counter()
    for path in paths:
        os.lstat(path)
    return _self_cpu() - before, time.perf_counter() - start


def timed_scan(inv, expect_hashed: int | None) -> tuple[float, float]:
    before, start = _self_cpu(), time.perf_counter()
    scan = inv.scan()
    took = time.perf_counter() - start
    if expect_hashed is not None:
        assert scan.complete and scan.hashed == expect_hashed, (scan.hashed, scan.problems)
    return _self_cpu() - before, took


def full(root: str):
    shutil.rmtree(os.path.join(root, "state", "cache"), ignore_errors=True)  # no cache: hash everything
    return timed_scan(inventory.Inventory(os.path.join(root, "state"), {}, "caldera"), SKILLS)


def unchanged(root: str):
    return timed_scan(inventory.Inventory(os.path.join(root, "state"), {}, "caldera"), 0)


def one_tree(name: str, root: str, rounds: int) -> dict:
    md5sum(root), full(root)  # warm-up: page cache, imports
    notifier = notify.Notifier.open()
    watched = inventory.Inventory(os.path.join(root, "state"), {}, "caldera", notifier=notifier)
    watched.scan()  # the watcher's first scan: signatures checked, watches set
    times = {"md5sum": [], "full": [], "unchanged": [], "watched": [], "find_stat": [], "dirs": [], "lstat": []}
    paths = [os.path.join(d, f) for d, _, files in os.walk(os.path.join(root, "state", "skills")) for f in files]
    for _ in range(rounds):
        times["md5sum"].append(md5sum(root))
        times["find_stat"].append(stat_walk(root))
        times["dirs"].append(dir_reads(root))
        times["lstat"].append(lstats(paths))
        times["full"].append(full(root))
        times["unchanged"].append(unchanged(root))
        if notifier is not None:
            watched.FULL_CHECK_EVERY = 10 ** 9  # measure the inotify path itself, not its periodic full check
            times["watched"].append(timed_scan(watched, 0))
    if notifier is not None:
        notifier.close()
    cpu = {k: statistics.median(c for c, _ in v) for k, v in times.items() if v}
    wall = {k: statistics.median(w for _, w in v) for k, v in times.items() if v}
    out = {"bench": f"skills-{name}", "md5sum_cpu_s": round(cpu["md5sum"], 4), "full_cpu_s": round(cpu["full"], 4),
           "ratio": round(cpu["full"] / cpu["md5sum"], 2), "wall_ratio": round(wall["full"] / wall["md5sum"], 2),
           "rescan_stat_share": round(cpu["unchanged"] / cpu["full"], 4),
           "rescan_stat_vs_find": round(cpu["unchanged"] / cpu["find_stat"], 2), "target": FULL_TARGET,
           "floor_dir_reads_share": round(cpu["dirs"] / cpu["full"], 4),
           "floor_lstat_share": round(cpu["lstat"] / cpu["full"], 4)}
    print(f"  find -exec md5sum       cpu {cpu['md5sum']:.3f} s   wall {wall['md5sum']:.3f} s")
    print(f"  caldera full inventory  cpu {cpu['full']:.3f} s   wall {wall['full']:.3f} s   "
          f"{out['ratio']:.2f} x md5sum (target <= {FULL_TARGET}; wall {out['wall_ratio']:.2f} x)")
    print(f"  unchanged, stat path    cpu {cpu['unchanged']:.4f} s   {100 * out['rescan_stat_share']:.1f} % of full "
          f"(target <= {100 * RESCAN_TARGET:.0f} %); {out['rescan_stat_vs_find']:.2f} x `find -printf` "
          f"of the same stat figures ({cpu['find_stat']:.4f} s)")
    print(f"  floors of any stat path: reading the directories alone {100 * out['floor_dir_reads_share']:.1f} %, "
          f"one lstat per known file alone {100 * out['floor_lstat_share']:.1f} % of full "
          f"({len(paths)} files; above 5 %: no stat path can meet the target, only inotify)")
    if "watched" in cpu:
        out["rescan_inotify_share"] = round(cpu["watched"] / cpu["full"], 4)
        print(f"  unchanged, inotify path cpu {cpu['watched']:.4f} s   "
              f"{100 * out['rescan_inotify_share']:.1f} % of full")
    out["ok"] = out["ratio"] <= FULL_TARGET and out["rescan_stat_share"] <= RESCAN_TARGET
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--large-mib", type=int, default=200)
    ap.add_argument("--small-files", type=int, default=10_000)
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory(prefix="caldera-bench-skills-") as tmp:
        trees = {"large": (2 * SKILLS, args.large_mib * 1024 * 1024 // (2 * SKILLS)),
                 "small": (args.small_files, 2048)}
        for name, (files, size) in trees.items():
            root = os.path.join(tmp, name)
            build(root, files, size)
            print(f"{name} tree: {files} files of {size // 1024} KiB in {SKILLS} skills; "
                  f"medians of {args.rounds} rounds")
            lines.append(one_tree(name, root, args.rounds))
            shutil.rmtree(root)
    for line in lines:
        print(json.dumps({**line, "rounds": args.rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
