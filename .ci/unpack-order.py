#!/usr/bin/env python3
"""When dpkg put the installed caldera's files in place, and what the agents' units did
around it (issue 35; run by .ci/upgrade.sh inside the booted root, after an apt run).

The files' place in time: the change times (ctime) of the installed package's regular files
(`dpkg-query -L caldera`, /etc left out): dpkg writes each as NAME.dpkg-new and renames it
over the old one at the end of the unpack, and both set the ctime; the earliest and the
latest of them bound the moment the old files were replaced. The units' side: PID 1's own
journal entries for each unit (`UNIT=`), by their catalogue ids: a stop job finished
(9d1aaa27…: the unit is inactive, every process of it gone) and a start job began
(7d4958e8…: before its process is made). journald stamps an entry when it receives it, never
before the event, so "stopped before" errs on the safe side.

Usage: unpack-order.py stopped-before SINCE UNIT...
           each UNIT's first stop after SINCE (µs since the epoch) came before the first file
           was replaced, and no start of it began until the last one was: no agent process
           ran while the new files went in (the preinst stopped them);
       unpack-order.py started-after SINCE UNIT...
           each UNIT began a start after the last file was replaced (its process runs the
           files in place now).
One line per unit; exit 1 with a sentence when a check fails. Standard library only.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

STOPPED = "9d1aaa27d60140bd96365438aad20286"  # a stop job finished (systemd.catalog)
STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"  # a start job began


def unpacked() -> tuple[int, int]:
    """(earliest, latest) ctime in µs of the installed caldera's regular files."""
    names = subprocess.run(["dpkg-query", "-L", "caldera"], capture_output=True, text=True, check=True).stdout
    times = []
    for name in names.splitlines():
        if not name.startswith("/usr/"):
            continue
        st = os.lstat(name)
        if stat.S_ISREG(st.st_mode):
            times.append(st.st_ctime_ns // 1000)
    if not times:
        sys.exit("unpack-order: the installed caldera lists no file under /usr")
    return min(times), max(times)


def events(unit: str, since: int) -> list[tuple[int, str]]:
    """(time in µs, catalogue id) of PID 1's start and stop entries for `unit` since `since`."""
    out = subprocess.run(["journalctl", "--no-pager", "-o", "json", f"UNIT={unit}", "_PID=1"],
                         capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        entry = json.loads(line)
        when = int(entry["__REALTIME_TIMESTAMP"])
        if when >= since and entry.get("MESSAGE_ID") in (STOPPED, STARTING):
            found.append((when, entry["MESSAGE_ID"]))
    return sorted(found)


def main(mode: str, since: int, units: list[str]) -> int:
    first, last = unpacked()
    print(f"the files of the installed caldera were replaced from {first} to {last} "
          f"({(last - first) / 1e6:.3f} s, {(first - since) / 1e6:.1f} s after the apt run began)")
    failed = []
    for unit in units:
        seen = events(unit, since)
        stops = [t for t, kind in seen if kind == STOPPED]
        starts = [t for t, kind in seen if kind == STARTING]
        if mode == "stopped-before":
            if not stops or stops[0] >= first:
                when = f"{(stops[0] - first) / 1e6:+.3f} s" if stops else "never"
                failed.append(f"{unit} stopped {when} after the first file was replaced (want before it)")
                continue
            again = [t for t in starts if stops[0] < t <= last]
            if again:
                failed.append(f"{unit} started again {(again[0] - first) / 1e6:+.3f} s from the first file "
                              f"replaced, before the last one was")
                continue
            nxt = [t for t in starts if t > stops[0]]
            after = f"{(nxt[0] - last) / 1e6:.3f} s after the last" if nxt else "not since"
            print(f"{unit}: stopped {(first - stops[0]) / 1e6:.3f} s before the first file was replaced; "
                  f"started again {after}")
        else:
            later = [t for t in starts if t > last]
            if not later:
                failed.append(f"{unit} began no start after the files were replaced")
                continue
            print(f"{unit}: started {(later[0] - last) / 1e6:.3f} s after the last file was replaced")
    for problem in failed:
        print(f"unpack-order: {problem}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] not in ("stopped-before", "started-after"):
        sys.exit(__doc__.split("Usage: ", 1)[1].split("\nOne line", 1)[0])
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
