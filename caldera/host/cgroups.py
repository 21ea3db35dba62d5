"""The process's cgroup (v2, v1 or hybrid) and the limits and counters it holds.

Everything takes its roots as arguments: a test points them at a fixture tree.
The rules (SPEC section 6, decisions in docs/system-figures.md):

- the group comes from `<proc>/self/cgroup`; a path that does not exist under
  the mount (a container without a cgroup namespace sees the host's path while
  its mount shows only its own group) is made relative to the mount's root from
  `<proc>/self/mountinfo`, else to its longest existing suffix, else the mount
  root itself;
- limits are read at every level from the group up to the mount root and the
  tightest wins; a file missing at a level (v2's root has no `cpu.max`) is not
  an error;
- a file that exists but cannot be read or parsed raises `FigureError` with a
  short reason, which the sampler turns into `metrics_collector: degraded`.
"""
from __future__ import annotations

import os
from types import MappingProxyType
from typing import NamedTuple

from caldera import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from caldera.host.keptfiles import KeptFiles

    # read_text or a CachedReader: a path's text, None when the file does not exist
    Reader = Callable[[str], str | None]

# Any limit at or above this is "no limit": v1 reports the page-rounded LONG_MAX
# (9223372036854771712 with 4 KiB pages) and other page sizes round differently.
UNLIMITED = 1 << 60
DEFAULT_CFS_PERIOD_US = 100_000
READ_SIZE = 65536

# v1 controllers the sampler uses; "cpu" and "cpuacct" are often co-mounted.
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "blkio")
# the v1 controller whose v2 counterpart has another name
V2_NAME = {"blkio": "io", "cpuacct": "cpu"}


class FigureError(Exception):
    """A figure's file exists but could not be read or parsed; str() is the reason."""


def read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist (a normal case for cgroup files)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise FigureError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        chunks = [os.read(fd, READ_SIZE)]
        # procfs/cgroupfs fill the buffer up to the last whole line that fits, so a read
        # well short of the buffer is the end: no read that returns b"" (what it saves:
        # docs/performance.md section 3). Longer files (a big /proc/net/dev) are read on.
        while len(chunks[-1]) >= READ_SIZE // 2:
            chunks.append(os.read(fd, READ_SIZE))
            if not chunks[-1]:
                break
    except OSError as exc:
        raise FigureError(f"cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", "replace")


def read_kept(files: KeptFiles, path: str) -> str | None:
    """read_text through a KeptFiles: one pread on a descriptor kept open."""
    try:
        return files.read(path)
    except OSError as exc:
        raise FigureError(f"cannot read {path}: {exc.strerror}") from exc


class CachedReader:
    """read_text that remembers which cgroup files are absent (cpu.max at v2's root,
    pids.max where no limit is set): they only appear when a controller is enabled, so
    they are looked for again every `recheck` samples, or at once after `forget()`."""

    def __init__(self, recheck: int = 60, files: KeptFiles | None = None) -> None:
        self.recheck = recheck
        self.files = files  # a KeptFiles (one pread per file on a kept descriptor), or None: read_text
        self._absent: set[str] = set()
        self._reads = 0

    def tick(self) -> None:
        self._reads += 1
        if self._reads % self.recheck == 0:
            self._absent.clear()

    def forget(self) -> None:
        self._absent.clear()
        if self.files is not None:
            self.files.close()  # another group: its files are other files

    def __call__(self, path: str) -> str | None:
        if path in self._absent:
            return None
        text = read_text(path) if self.files is None else read_kept(self.files, path)
        if text is None:
            self._absent.add(path)
        return text


def parse_int(path: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise FigureError(f"cannot parse {path}: {text.strip()[:40]!r}") from None


def parse_keyed(path: str, text: str) -> dict[str, int]:
    """`key value` lines (memory.stat, cpu.stat, pids.events) as a dict of ints."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                raise FigureError(f"cannot parse {path}: {line[:40]!r}") from None
    return out


def count_cpu_list(path: str, text: str) -> int:
    """The number of CPUs in a list such as `0-3,8,10-11` (cpuset, sysfs `online`)."""
    total = 0
    try:
        for part in text.strip().split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            total += (int(hi) if hi else int(lo)) - int(lo) + 1
    except ValueError:
        raise FigureError(f"cannot parse {path}: {text.strip()[:40]!r}") from None
    return total


# --- discovery -----------------------------------------------------------------


class Hierarchy(NamedTuple):
    """One mounted hierarchy as the process sees it."""

    version: int  # 1 or 2
    levels: tuple[str, ...]  # the group's directory first, then each parent up to the mount root

    @property
    def group(self) -> str:
        return self.levels[0]


class Layout(NamedTuple):
    unified: Hierarchy | None = None
    unified_controllers: frozenset[str] = frozenset()
    v1: Mapping[str, Hierarchy] = MappingProxyType({})  # controller -> Hierarchy (read only)

    def for_controller(self, name: str) -> Hierarchy | None:
        """v1 when the controller is mounted there (hybrid hosts), else v2 when enabled."""
        if name in self.v1:
            return self.v1[name]
        if self.unified is not None and V2_NAME.get(name, name) in self.unified_controllers:
            return self.unified
        return None


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """`<proc>/self/cgroup` as controller -> path; the unified (v2) line is key ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name and not name.startswith("name="):
                out[name] = path
    return out


def parse_mountinfo_roots(text: str) -> dict[str, str]:
    """The root of each cgroup mount from mountinfo, keyed like parse_proc_cgroup."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        root, fstype, options = fields[3], rfields[0], rfields[2].split(",")
        if fstype == "cgroup2":
            out.setdefault("", root)
        elif fstype == "cgroup":
            for name in options:
                if name in V1_CONTROLLERS:
                    out.setdefault(name, root)
    return out


def _levels(mount: str, path: str, mount_root: str | None) -> tuple[str, ...]:
    """Directories from the process's group up to the mount, as they exist under `mount`."""
    parts = [p for p in path.split("/") if p]
    if ".." in parts:  # moved outside our cgroup namespace: only the mount is ours
        parts = []
    root_parts = [p for p in (mount_root or "/").split("/") if p]
    if root_parts and parts[: len(root_parts)] == root_parts:
        parts = parts[len(root_parts):]
    # longest suffix that exists (mountinfo missing or not matching the path)
    while parts and not os.path.isdir(os.path.join(mount, *parts)):
        parts = parts[1:]
    levels = [os.path.join(mount, *parts[:n]) for n in range(len(parts), -1, -1)]
    return tuple(levels)


def _v1_mount(cgroup_root: str, name: str, co_mounted: list[str]) -> str | None:
    for candidate in (",".join(co_mounted), name):
        mount = os.path.join(cgroup_root, candidate)
        if candidate and os.path.isdir(mount):
            return mount
    return None


def discover(cgroup_root: str, proc_cgroup: str, mountinfo: str | None) -> Layout:
    """Where each controller's files are for this process."""
    paths = parse_proc_cgroup(proc_cgroup)
    roots = parse_mountinfo_roots(mountinfo or "")
    co_mounted: dict[str, list[str]] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[1]:
            names = parts[1].split(",")
            for name in names:
                co_mounted[name] = names
    v1: dict[str, Hierarchy] = {}
    for name in V1_CONTROLLERS:
        if name in paths:
            mount = _v1_mount(cgroup_root, name, co_mounted.get(name, [name]))
            if mount is not None:
                v1[name] = Hierarchy(1, _levels(mount, paths[name], roots.get(name)))
    unified: Hierarchy | None = None
    controllers: frozenset[str] = frozenset()
    if "" in paths:
        for mount in (cgroup_root, os.path.join(cgroup_root, "unified")):
            text = read_text(os.path.join(mount, "cgroup.controllers"))
            if text is not None:
                unified = Hierarchy(2, _levels(mount, paths[""], roots.get("")))
                controllers = frozenset(text.split())
                break
    return Layout(unified=unified, unified_controllers=controllers, v1=v1)


# --- figures -------------------------------------------------------------------
# Each takes `read` (read_text or a CachedReader): a file that is absent reads None.


def quota_cores(h: Hierarchy, read: Reader = read_text) -> float | None:
    """The tightest CPU quota from the group up, in cores; None when there is none."""
    best = None
    for level in h.levels:
        cores = _v2_quota(level, read) if h.version == 2 else _v1_quota(level, read)
        if cores is not None and (best is None or cores < best):
            best = cores
    return best


def _v2_quota(level: str, read: Reader) -> float | None:
    path = f"{level}/cpu.max"
    text = read(path)
    if text is None:
        return None
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else DEFAULT_CFS_PERIOD_US
    except ValueError:
        raise FigureError(f"cannot parse {path}: {text.strip()[:40]!r}") from None
    if quota <= 0 or period <= 0:
        raise FigureError(f"cannot parse {path}: {text.strip()[:40]!r}")
    return quota / period


def _v1_quota(level: str, read: Reader) -> float | None:
    qpath = f"{level}/cpu.cfs_quota_us"
    qtext = read(qpath)
    if qtext is None:
        return None
    quota = parse_int(qpath, qtext)
    if quota < 0:  # -1: no quota
        return None
    ppath = f"{level}/cpu.cfs_period_us"
    ptext = read(ppath)
    period = parse_int(ppath, ptext) if ptext is not None else DEFAULT_CFS_PERIOD_US
    if quota == 0 or period <= 0:
        raise FigureError(f"cannot parse {qpath}: quota {quota}, period {period}")
    return quota / period


def cpuset_count(h: Hierarchy, read: Reader = read_text) -> int | None:
    """CPUs in the effective cpuset of the nearest level that has one."""
    names = ("cpuset.cpus.effective",) if h.version == 2 else ("cpuset.effective_cpus", "cpuset.cpus")
    for level in h.levels:
        for name in names:
            path = f"{level}/{name}"
            text = read(path)
            if text is not None and text.strip():
                return count_cpu_list(path, text)
    return None


class Memory(NamedTuple):
    limit: int | None  # the tightest limit, None when unlimited
    usage: int | None  # usage of the level the limit is at (else the group)
    working_set: int | None  # usage - inactive_file, floored at 0


def memory(h: Hierarchy, read: Reader = read_text) -> Memory:
    limit_name, usage_name = ("memory.max", "memory.current") if h.version == 2 else (
        "memory.limit_in_bytes", "memory.usage_in_bytes")
    limit, at = None, h.group
    for level in h.levels:
        path = f"{level}/{limit_name}"
        text = read(path)
        if text is None or text.startswith("max"):
            continue
        value = parse_int(path, text)
        if value < UNLIMITED and (limit is None or value < limit):
            limit, at = value, level
    path = f"{at}/{usage_name}"
    text = read(path)
    if text is None:
        return Memory(limit, None, None)
    usage = parse_int(path, text)
    return Memory(limit, usage, max(0, usage - _inactive_file(h.version, at, read)))


def _inactive_file(version: int, level: str, read: Reader) -> int:
    path = f"{level}/memory.stat"
    text = read(path)
    if text is None:
        return 0
    # v1's usage_in_bytes is hierarchical, and so is total_inactive_file (v2's stats all are)
    keys = ("total_inactive_file", "inactive_file") if version == 1 else ("inactive_file",)
    for key in keys:
        value = stat_value(path, text, key)
        if value is not None:
            return value
    return 0


def stat_value(path: str, text: str, key: str) -> int | None:
    """One `key value` line of a stat file, without parsing the other forty."""
    prefix = key + " "
    if text.startswith(prefix):
        at = 0
    else:
        at = text.find("\n" + prefix)  # the newline keeps "inactive_file" from "total_inactive_file"
        if at < 0:
            return None
        at += 1
    end = text.find("\n", at)
    line = text[at:] if end < 0 else text[at:end]
    try:
        return int(line.split()[1])
    except (ValueError, IndexError):
        raise FigureError(f"cannot parse {path}: {line[:40]!r}") from None


def cpu_stat(layout: Layout, read: Reader = read_text) -> dict[str, int]:
    """CPU time and throttling of the group, in microseconds (extras)."""
    out: dict[str, int] = {}
    v1 = layout.v1
    if "cpuacct" in v1 or "cpu" in v1:
        if "cpuacct" in v1:
            path = f"{v1['cpuacct'].group}/cpuacct.usage"
            text = read(path)
            if text is not None:
                out["usage_usec"] = parse_int(path, text) // 1000
        if "cpu" in v1:
            path = f"{v1['cpu'].group}/cpu.stat"
            text = read(path)
            if text is not None:
                stat = parse_keyed(path, text)
                _copy(stat, out, ("nr_periods", "nr_throttled"))
                if "throttled_time" in stat:  # nanoseconds in v1
                    out["throttled_usec"] = stat["throttled_time"] // 1000
        return out
    if layout.unified is not None:  # v2's cpu.stat exists with or without the cpu controller
        path = f"{layout.unified.group}/cpu.stat"
        text = read(path)
        if text is not None:
            stat = parse_keyed(path, text)
            _copy(stat, out, ("usage_usec", "user_usec", "system_usec", "nr_periods",
                              "nr_throttled", "throttled_usec"))
    return out


def pids(h: Hierarchy, read: Reader = read_text) -> dict[str, int]:
    out: dict[str, int] = {}
    path = f"{h.group}/pids.current"
    text = read(path)
    if text is not None:
        out["pids_current"] = parse_int(path, text)
    for level in h.levels:  # the tightest pids.max, like the other limits
        path = f"{level}/pids.max"
        text = read(path)
        if text is not None and not text.startswith("max"):
            value = parse_int(path, text)
            out["pids_max"] = min(value, out.get("pids_max", value))
    return out


def io_bytes(h: Hierarchy, read: Reader = read_text) -> dict[str, int]:
    """Bytes read and written by the group on all block devices (extras)."""
    if h.version == 2:
        path = f"{h.group}/io.stat"
        text = read(path)
        if text is None:
            return {}
        rd = wr = 0
        for line in text.splitlines():
            for item in line.split()[1:]:
                key, _, value = item.partition("=")
                if key in ("rbytes", "wbytes"):
                    try:
                        n = int(value)
                    except ValueError:
                        raise FigureError(f"cannot parse {path}: {line[:40]!r}") from None
                    rd, wr = (rd + n, wr) if key == "rbytes" else (rd, wr + n)
        return {"io_read_bytes": rd, "io_write_bytes": wr}
    for name in ("blkio.throttle.io_service_bytes_recursive", "blkio.throttle.io_service_bytes",
                 "blkio.io_service_bytes_recursive"):
        path = f"{h.group}/{name}"
        text = read(path)
        if text is not None:
            return _v1_io(path, text)
    return {}


def _v1_io(path: str, text: str) -> dict[str, int]:
    rd = wr = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("Read", "Write"):
            try:
                n = int(parts[2])
            except ValueError:
                raise FigureError(f"cannot parse {path}: {line[:40]!r}") from None
            rd, wr = (rd + n, wr) if parts[1] == "Read" else (rd, wr + n)
    return {"io_read_bytes": rd, "io_write_bytes": wr}


def _copy(src: dict[str, int], dst: dict[str, int], keys: Iterable[str]) -> None:
    for key in keys:
        if key in src:
            dst[key] = src[key]
