"""Keep a threaded daemon's heap small on glibc.

glibc gives each thread that allocates its own malloc arena (up to 8 x cores);
a dozen mostly idle threads then hold megabytes of half-used arenas. Two arenas
are plenty for loops that spend their life waiting. Same effect as the
environment variable MALLOC_ARENA_MAX=2, but it works however caldera is started.
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("caldera.host.memtune")
M_ARENA_MAX = -8  # from glibc's malloc.h
ARENAS = 2


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """True when glibc took the setting; False elsewhere (musl, or MALLOC_ARENA_MAX already set)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False  # the operator chose
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(M_ARENA_MAX, arenas))
    if not ok:
        log.debug("mallopt(M_ARENA_MAX) was refused; keeping glibc's default arenas")
    return ok
