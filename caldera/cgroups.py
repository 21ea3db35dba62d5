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
from dataclasses import dataclass, field

# Any limit at or above this is "no limit": v1 reports the page-rounded LONG_MAX
# (9223372036854771712 with 4 KiB pages) and other page sizes round differently.
UNLIMITED = 1 << 60
DEFAULT_CFS_PERIOD_US = 100_000

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
        chunks = []
        while True:  # procfs files may come in several reads
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError as exc:
        raise FigureError(f"cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", "replace")


def parse_int(path: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise FigureError(f"cannot parse {path}: {text.strip()[:40]!r}") from None


def parse_keyed(path: str, text: str) -> dict[str, int]:
    """`key value` lines (memory.stat, cpu.stat, pids.events) as a dict of ints."""
    out = {}
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


@dataclass(frozen=True)
class Hierarchy:
    """One mounted hierarchy as the process sees it."""

    version: int  # 1 or 2
    levels: tuple[str, ...]  # the group's directory first, then each parent up to the mount root

    @property
    def group(self) -> str:
        return self.levels[0]


@dataclass(frozen=True)
class Layout:
    unified: Hierarchy | None = None
    unified_controllers: frozenset = frozenset()
    v1: dict = field(default_factory=dict)  # controller -> Hierarchy

    def for_controller(self, name: str) -> Hierarchy | None:
        """v1 when the controller is mounted there (hybrid hosts), else v2 when enabled."""
        if name in self.v1:
            return self.v1[name]
        if self.unified is not None and V2_NAME.get(name, name) in self.unified_controllers:
            return self.unified
        return None

    @property
    def version(self) -> str:
        if self.v1:
            return "v1+v2" if self.unified_controllers else "v1"
        return "v2" if self.unified is not None else "none"


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """`<proc>/self/cgroup` as controller -> path; the unified (v2) line is key ""."""
    out = {}
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
    out = {}
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
    v1 = {}
    for name in V1_CONTROLLERS:
        if name in paths:
            mount = _v1_mount(cgroup_root, name, co_mounted.get(name, [name]))
            if mount is not None:
                v1[name] = Hierarchy(1, _levels(mount, paths[name], roots.get(name)))
    unified, controllers = None, frozenset()
    if "" in paths:
        for mount in (cgroup_root, os.path.join(cgroup_root, "unified")):
            text = read_text(os.path.join(mount, "cgroup.controllers"))
            if text is not None:
                unified = Hierarchy(2, _levels(mount, paths[""], roots.get("")))
                controllers = frozenset(text.split())
                break
    return Layout(unified=unified, unified_controllers=controllers, v1=v1)


# --- figures -------------------------------------------------------------------


def quota_cores(h: Hierarchy) -> float | None:
    """The tightest CPU quota from the group up, in cores; None when there is none."""
    best = None
    for level in h.levels:
        cores = _v2_quota(level) if h.version == 2 else _v1_quota(level)
        if cores is not None and (best is None or cores < best):
            best = cores
    return best


def _v2_quota(level: str) -> float | None:
    path = os.path.join(level, "cpu.max")
    text = read_text(path)
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


def _v1_quota(level: str) -> float | None:
    qpath = os.path.join(level, "cpu.cfs_quota_us")
    qtext = read_text(qpath)
    if qtext is None:
        return None
    quota = parse_int(qpath, qtext)
    if quota < 0:  # -1: no quota
        return None
    ppath = os.path.join(level, "cpu.cfs_period_us")
    ptext = read_text(ppath)
    period = parse_int(ppath, ptext) if ptext is not None else DEFAULT_CFS_PERIOD_US
    if quota == 0 or period <= 0:
        raise FigureError(f"cannot parse {qpath}: quota {quota}, period {period}")
    return quota / period


def cpuset_count(h: Hierarchy) -> int | None:
    """CPUs in the effective cpuset of the nearest level that has one."""
    names = ("cpuset.cpus.effective",) if h.version == 2 else ("cpuset.effective_cpus", "cpuset.cpus")
    for level in h.levels:
        for name in names:
            path = os.path.join(level, name)
            text = read_text(path)
            if text is not None and text.strip():
                return count_cpu_list(path, text)
    return None


@dataclass(frozen=True)
class Memory:
    limit: int | None  # the tightest limit, None when unlimited
    usage: int | None  # usage of the level the limit is at (else the group)
    working_set: int | None  # usage - inactive_file, floored at 0


def memory(h: Hierarchy) -> Memory:
    limit_name, usage_name = ("memory.max", "memory.current") if h.version == 2 else (
        "memory.limit_in_bytes", "memory.usage_in_bytes")
    limit, at = None, h.group
    for level in h.levels:
        path = os.path.join(level, limit_name)
        text = read_text(path)
        if text is None or text.strip() == "max":
            continue
        value = parse_int(path, text)
        if value < UNLIMITED and (limit is None or value < limit):
            limit, at = value, level
    path = os.path.join(at, usage_name)
    text = read_text(path)
    if text is None:
        return Memory(limit, None, None)
    usage = parse_int(path, text)
    return Memory(limit, usage, max(0, usage - _inactive_file(h.version, at)))


def _inactive_file(version: int, level: str) -> int:
    path = os.path.join(level, "memory.stat")
    text = read_text(path)
    if text is None:
        return 0
    stat = parse_keyed(path, text)
    if version == 1:  # usage_in_bytes is hierarchical, so is total_inactive_file
        return stat.get("total_inactive_file", stat.get("inactive_file", 0))
    return stat.get("inactive_file", 0)


def cpu_stat(layout: Layout) -> dict[str, int]:
    """CPU time and throttling of the group, in microseconds (extras)."""
    out: dict[str, int] = {}
    v1 = layout.v1
    if "cpuacct" in v1 or "cpu" in v1:
        if "cpuacct" in v1:
            path = os.path.join(v1["cpuacct"].group, "cpuacct.usage")
            text = read_text(path)
            if text is not None:
                out["usage_usec"] = parse_int(path, text) // 1000
        if "cpu" in v1:
            path = os.path.join(v1["cpu"].group, "cpu.stat")
            text = read_text(path)
            if text is not None:
                stat = parse_keyed(path, text)
                _copy(stat, out, ("nr_periods", "nr_throttled"))
                if "throttled_time" in stat:  # nanoseconds in v1
                    out["throttled_usec"] = stat["throttled_time"] // 1000
        return out
    if layout.unified is not None:  # v2's cpu.stat exists with or without the cpu controller
        path = os.path.join(layout.unified.group, "cpu.stat")
        text = read_text(path)
        if text is not None:
            stat = parse_keyed(path, text)
            _copy(stat, out, ("usage_usec", "user_usec", "system_usec", "nr_periods",
                              "nr_throttled", "throttled_usec"))
    return out


def pids(h: Hierarchy) -> dict[str, int]:
    out = {}
    path = os.path.join(h.group, "pids.current")
    text = read_text(path)
    if text is not None:
        out["pids_current"] = parse_int(path, text)
    for level in h.levels:  # the tightest pids.max, like the other limits
        path = os.path.join(level, "pids.max")
        text = read_text(path)
        if text is not None and text.strip() != "max":
            value = parse_int(path, text)
            out["pids_max"] = min(value, out.get("pids_max", value))
    return out


def io_bytes(h: Hierarchy) -> dict[str, int]:
    """Bytes read and written by the group on all block devices (extras)."""
    if h.version == 2:
        path = os.path.join(h.group, "io.stat")
        text = read_text(path)
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
        path = os.path.join(h.group, name)
        text = read_text(path)
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


def _copy(src: dict, dst: dict, keys) -> None:
    for key in keys:
        if key in src:
            dst[key] = src[key]
