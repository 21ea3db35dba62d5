"""Shared bits of the sampler tests: the fixture trees and a fixed clock and disk."""
from __future__ import annotations

import calendar
import os
import shutil

from caldera.host.sampler import Sampler

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
CASES = ("v2_quota_memory", "v2_root", "v2_one_number", "v2_cpuset_narrow",
         "v1_no_limits", "v1_limits", "hybrid", "container_nested")

# seed 004's example time
SAMPLED_AT = "2026-04-27T10:00:20Z"
EPOCH = calendar.timegm((2026, 4, 27, 10, 0, 20))

# the disk the fake statvfs reports: 4 KiB fragments
FRSIZE, BLOCKS, BFREE, BAVAIL = 4096, 2_621_440, 2_200_000, 2_097_152
DISK_TOTAL, DISK_FREE, DISK_USED = BLOCKS * FRSIZE, BAVAIL * FRSIZE, (BLOCKS - BFREE) * FRSIZE

# every fixture tree has the same /proc/net and /sys/class/net
INTERFACES = [
    {"name": "eth0", "status": "up", "addresses": ["10.42.0.12", "fd00::12"],
     "rx_bytes": 123456789, "tx_bytes": 98765432},
    {"name": "eth1", "status": "down", "addresses": [], "rx_bytes": 4096, "tx_bytes": 2048},
]
# meminfo of every fixture tree: MemTotal 16384000 kB, MemAvailable 8192000 kB
HOST_TOTAL, HOST_AVAILABLE = 16384000 * 1024, 8192000 * 1024


def case_root(case: str) -> str:
    return os.path.join(FIXTURES, case)


def sampler_for(root: str, **kwargs) -> Sampler:
    kwargs.setdefault("clock", lambda: EPOCH)
    return Sampler(proc_root=os.path.join(root, "proc"),
                   cgroup_root=os.path.join(root, "sys", "fs", "cgroup"),
                   persistent_dir=os.path.join(root, "persistent"), **kwargs)


def copy_case(tmp_path, case: str) -> str:
    """A writable copy of a fixture tree, for tests that break one file."""
    dest = os.path.join(str(tmp_path), case)
    shutil.copytree(case_root(case), dest)
    return dest


def write(root: str, rel: str, text: str) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def install_fake_statvfs(monkeypatch, persistent_dir: str) -> None:
    """statvfs of the persistent dir answers the fixed disk above; any other path is real."""
    real = os.statvfs
    target = os.path.abspath(persistent_dir)

    def fake(path):
        if os.path.abspath(path) == target:
            return os.statvfs_result((FRSIZE, FRSIZE, BLOCKS, BFREE, BAVAIL, 10, 5, 5, 0, 255))
        return real(path)

    monkeypatch.setattr(os, "statvfs", fake)


def disk(root: str, **extra) -> dict:
    return {"mount_path": os.path.join(root, "persistent"), "root_total_bytes": DISK_TOTAL,
            "root_free_bytes": DISK_FREE, **extra}
