"""caldera/host/runreaper.py: what a command leaves behind ends with the command it ran under."""
from __future__ import annotations

import os
import subprocess
import sys

from caldera.host import runreaper


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_setsid_and_a_nohup_child_end_with_the_command_and_its_status_is_kept():
    script = ("setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; "
              "nohup sh -c 'trap \"\" TERM; sleep 300' </dev/null >/dev/null 2>&1 & echo $!; exit 3")
    done = subprocess.run(runreaper.command(["sh", "-c", script]), capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    pids = [int(line) for line in done.stdout.split()]
    assert done.returncode == 3 and len(pids) == 2, done
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:
        os.kill(pid, 9)
    assert left == []
