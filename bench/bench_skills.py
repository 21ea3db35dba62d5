"""Skill inventory speed: caldera's full inventory against `find … -type f -exec
md5sum {} +` over the same tree, and a second inventory with nothing changed.

    python bench/bench_skills.py [--files 10000] [--mib 200] [--rounds 3]

The tree (100 skills x files/100 files, `mib` MiB in all, random bytes) is built
in a temp dir and removed after. Both sides run interleaved in this one process,
after one warm-up each, on a warm page cache; the ratios are of medians from the
same run. "unchanged" is a fresh scan (stat signature of every file, what
`sync_skill_inventory` and `caldera skills` do); "watcher" is the watcher's
30-second check with inotify (nothing changed: no stat at all). Targets (issue 5): full inventory <= 1.2 x md5sum; unchanged second
inventory <= 5 % of the first.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from caldera.host import proc  # noqa: E402
from caldera.skills import inventory, notify  # noqa: E402

SKILLS = 100


def build(root: str, files: int, mib: int) -> None:
    per_file = mib * 1024 * 1024 // files
    blob = os.urandom(per_file + 4096)
    for i in range(files):
        skill = os.path.join(root, "state", "skills", f"skill-{i % SKILLS:03d}", f"d{(i // SKILLS) % 10}")
        os.makedirs(skill, exist_ok=True)
        with open(os.path.join(skill, f"f{i}.bin"), "wb") as fh:
            fh.write(blob[i % 4096:i % 4096 + per_file])


def md5sum(root: str) -> float:
    start = time.perf_counter()
    res = proc.run(["find", os.path.join(root, "state", "skills"), "-type", "f", "-exec", "md5sum", "{}", "+"],
                   env={"PATH": "/usr/bin:/bin", "LANG": "C"}, timeout=600, stdout_cap=64 * 1024 * 1024)
    took = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"find/md5sum failed: {res}")
    return took


def full(root: str) -> float:
    shutil.rmtree(os.path.join(root, "state", "cache"), ignore_errors=True)  # no cache: hash everything
    start = time.perf_counter()
    scan = inventory.Inventory(os.path.join(root, "state"), {}, "caldera").scan()
    took = time.perf_counter() - start
    assert scan.complete and scan.hashed == SKILLS, (scan.hashed, scan.problems)
    return took


def unchanged(root: str) -> float:
    inv = inventory.Inventory(os.path.join(root, "state"), {}, "caldera")
    start = time.perf_counter()
    scan = inv.scan()
    took = time.perf_counter() - start
    assert scan.hashed == 0
    return took


def watched(root: str, inv) -> float:
    start = time.perf_counter()
    scan = inv.scan()
    took = time.perf_counter() - start
    assert scan.hashed == 0
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="caldera-bench-skills-")
    try:
        build(root, args.files, args.mib)
        md5sum(root), full(root)  # warm-up: page cache, imports
        notifier = notify.Notifier.open()
        inv = inventory.Inventory(os.path.join(root, "state"), {}, "caldera", notifier=notifier)
        inv.scan()  # the watcher's first scan: signatures checked, watches set
        times = {"md5sum": [], "full": [], "unchanged": [], "watched": []}
        for _ in range(args.rounds):
            times["md5sum"].append(md5sum(root))
            times["full"].append(full(root))
            times["unchanged"].append(unchanged(root))
            if notifier is not None:
                times["watched"].append(watched(root, inv))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"tree: {args.files} files, {args.mib} MiB in {SKILLS} skills; medians of {args.rounds} rounds")
        print(f"find -exec md5sum      {med['md5sum']:.3f} s")
        print(f"caldera full inventory {med['full']:.3f} s  ratio {med['full'] / med['md5sum']:.2f} x (target <= 1.2)")
        print(f"unchanged re-inventory {med['unchanged']:.3f} s  {100 * med['unchanged'] / med['full']:.1f} % of full "
              "(target <= 5 %), stat signatures")
        if times["watched"]:
            med_w = statistics.median(times["watched"])
            print(f"watcher re-inventory   {med_w:.3f} s  {100 * med_w / med['full']:.1f} % of full "
                  "(target <= 5 %), inotify, no event")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
