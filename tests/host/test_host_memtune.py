"""caldera/host/memtune.py: a large block the daemon frees goes back to the system, each time
(glibc's dynamic mmap threshold would keep the second one resident: docs/performance.md,
section 10, the step after ~9,000 commands)."""
import os
import subprocess
import sys

import pytest

GLIBC = hasattr(os, "confstr") and bool(os.confstr("CS_GNU_LIBC_VERSION") or "")
pytestmark = pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")

# Allocate, touch and free 8 MiB twice; print the RSS grown by it (KiB) and what mallopt said.
PROBE = """
import sys
from caldera.host import memtune
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS:')).split()[1])
took = memtune.fix_mmap_threshold() if sys.argv[1] == 'fixed' else None
before = rss()
for _ in range(2):
    block = b'x' * (8 << 20)
    del block
print(rss() - before, took)
"""


def probe(mode: str, **env: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, check=True)
    grown, took = done.stdout.split()
    return int(grown), took


def test_a_freed_large_block_leaves_no_resident_memory_once_the_threshold_is_fixed():
    grown, took = probe("fixed")
    assert took == "True"
    assert grown < 2048, f"{grown} KiB still resident after freeing the blocks"


def test_without_it_glibc_keeps_the_second_block_resident():
    """The behaviour the setting exists for, so that the test above can fail."""
    grown, _ = probe("default")
    assert grown > 6 * 1024


def test_the_operators_own_setting_wins():
    _, took = probe("fixed", MALLOC_MMAP_THRESHOLD_="65536")
    assert took == "False"
