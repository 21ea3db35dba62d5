"""Keep a threaded daemon's heap small on glibc.

glibc gives each thread that allocates its own malloc arena (up to 8 x cores);
a dozen mostly idle threads then hold megabytes of half-used arenas. Two arenas
are plenty for loops that spend their life waiting. Same effect as the
environment variable MALLOC_ARENA_MAX=2, but it works however caldera is started.

glibc also raises its mmap threshold (128 KiB at first) to the size of every mmapped
block freed: after the first large table is freed, the next ones of that size come from
the heap and stay resident when freed below its top. In the daemon that is the interned
strings' table (≈ 0.9 MiB, reallocated every few thousand commands as temporary names
come and go): a one-time step of ≈ 0.9 MiB of RSS after ≈ 9,000 commands
(docs/performance.md, section 10). A fixed threshold keeps large blocks mmapped, so a
freed one goes back to the system; same as MALLOC_MMAP_THRESHOLD_=131072.
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("caldera.host.memtune")
M_ARENA_MAX = -8  # from glibc's malloc.h
M_MMAP_THRESHOLD = -3
ARENAS = 2
MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value, kept fixed


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """True when glibc took the setting; False elsewhere (musl, or MALLOC_ARENA_MAX already set)."""
    return _mallopt("MALLOC_ARENA_MAX", M_ARENA_MAX, arenas)


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """True when glibc took the setting; False elsewhere (musl, or MALLOC_MMAP_THRESHOLD_ set)."""
    return _mallopt("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, threshold)


def _mallopt(variable: str, param: int, value: int) -> bool:
    if os.environ.get(variable):
        return False  # the operator chose
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(param, value))
    if not ok:
        log.debug("mallopt(%d) was refused; keeping glibc's default (%s)", param, variable)
    return ok
