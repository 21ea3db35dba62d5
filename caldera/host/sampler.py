"""System figures for `system_info` (seed 004's shape, SPEC section 6).

`Sampler(...).sample()` reads cgroup v2/v1 and /proc directly (no psutil) and
never raises: a figure that cannot be read is left out, and the sample says
`degraded` with a short reason for each. It runs every 5 s in the daemon, so
what cannot change between samples is cached: the cgroup layout is worked out
again only when `<proc>/self/cgroup` changes, the CPU count every 60 samples.
Decisions where SPEC is silent are in docs/system-figures.md.
"""
from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import weakref

from caldera import TYPE_CHECKING
from caldera.host import cgroups
from caldera.host.cgroups import FigureError, read_text
from caldera.host.keptfiles import KeptFiles
from caldera.host.timefmt import rfc3339

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from os import PathLike
    from typing import Any, TypeVar

    T = TypeVar("T")
    D = TypeVar("D")

log = logging.getLogger(__name__)

CPU_COUNT_EVERY = 60  # samples between re-reads of the online CPU count
RTF_GATEWAY = 0x2
IFF_UP = 0x1
IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x08, 0x40
IPV6_SKIP_SCOPES = (0x10, 0x20)  # host (::1) and link-local (fe80::/10)
MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached")


class Sample:
    __slots__ = ("system_info", "metrics_collector", "reasons", "disk_used_bytes", "disk_limit_bytes")

    system_info: dict[str, Any]
    metrics_collector: str  # "ok" or "degraded"
    reasons: list[str]
    disk_used_bytes: int | None
    disk_limit_bytes: int | None

    def __init__(self, system_info: dict[str, Any], metrics_collector: str, reasons: list[str] | None = None,
                 disk_used_bytes: int | None = None, disk_limit_bytes: int | None = None) -> None:
        self.system_info = system_info
        self.metrics_collector = metrics_collector
        self.reasons = [] if reasons is None else reasons
        self.disk_used_bytes = disk_used_bytes
        self.disk_limit_bytes = disk_limit_bytes

    def health(self) -> dict[str, Any]:
        """The report's `health` keys this sample decides."""
        return {"metrics_collector": self.metrics_collector,
                "metrics_collector_reasons": list(self.reasons)}


class Sampler:
    def __init__(self, proc_root: str | PathLike[str] = "/proc", cgroup_root: str | PathLike[str] = "/sys/fs/cgroup",
                 persistent_dir: str | PathLike[str] = ".", runtime_type: str = "caldera",
                 runtime_name: str = "caldera", disk_limit_bytes: int | None = None,
                 sys_root: str | PathLike[str] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.proc_root = str(proc_root)
        self.cgroup_root = str(cgroup_root)
        self.sys_root = (str(sys_root) if sys_root is not None
                         else default_sys_root(self.cgroup_root, self.proc_root))
        # The host's own /proc: only then may a missing count fall back to os.cpu_count().
        self._real_proc = os.path.normpath(self.proc_root) == "/proc"
        self.persistent_dir = os.path.abspath(str(persistent_dir))
        self.runtime_type = runtime_type
        self.runtime_name = runtime_name
        self.disk_limit_bytes = disk_limit_bytes
        self._clock = clock
        proc = self.proc_root
        self._p_cgroup, self._p_mountinfo = f"{proc}/self/cgroup", f"{proc}/self/mountinfo"
        self._p_loadavg, self._p_meminfo, self._p_stat = (
            f"{proc}/loadavg", f"{proc}/meminfo", f"{proc}/stat")
        self._p_dev, self._p_trie, self._p_route, self._p_inet6 = (
            f"{proc}/net/{name}" for name in ("dev", "fib_trie", "route", "if_inet6"))
        self._p_net = f"{self.sys_root}/class/net"
        # Descriptors kept open only on the real pseudo-filesystems (keptfiles.py says why).
        real = (self.proc_root, self.cgroup_root, self.sys_root) == ("/proc", "/sys/fs/cgroup", "/sys")
        self._files = KeptFiles(keep=real)
        self._host_files = KeptFiles(keep=real)  # /proc and /sys: kept across cgroup layout changes
        weakref.finalize(self, self._files.close)
        weakref.finalize(self, self._host_files.close)
        self._cg_read = cgroups.CachedReader(recheck=CPU_COUNT_EVERY, files=self._files)
        self._lock = threading.Lock()  # the reporter loop and a command may sample at once
        self._layout_key: str | None = None
        self._layout = cgroups.Layout()
        self._cpu_count: int | None = None
        self._count = 0
        self._logged: frozenset[str] = frozenset()

    def sample(self) -> Sample:
        with self._lock:
            reasons: list[str] = []
            info: dict[str, Any] = {"runtime_type": self.runtime_type, "runtime_name": self.runtime_name,
                                    "sampled_at": rfc3339(self._clock())}
            layout = self._guard(reasons, "cgroup", self._current_layout, cgroups.Layout())
            disk_used: int | None = None
            builds: tuple[tuple[str, Callable[[cgroups.Layout, list[str]], Any]], ...] = (
                ("cpu", self._cpu), ("memory", self._memory), ("disk", self._disk), ("network", self._network))
            for group, build in builds:
                value = self._guard(reasons, group, functools.partial(build, layout, reasons), None)
                if group == "disk" and value is not None:
                    value, disk_used = value
                if value:
                    info[group] = value
            self._count += 1
            self._cg_read.tick()
            self._log_changes(reasons)
            return Sample(info, "degraded" if reasons else "ok", reasons,
                          disk_used, self.disk_limit_bytes)

    def close(self) -> None:
        """Close the kept descriptors (they are closed when the Sampler is collected, too)."""
        with self._lock:
            self._files.close()
            self._host_files.close()

    # --- plumbing --------------------------------------------------------------

    def _read(self, path: str) -> str | None:
        return cgroups.read_kept(self._host_files, path)

    @staticmethod
    def _guard(reasons: list[str], group: str, fn: Callable[[], T], default: D) -> T | D:
        """Run one part; its failure becomes a reason, never an exception into a loop."""
        try:
            return fn()
        except FigureError as exc:
            reasons.append(f"{group}: {exc}")
        except Exception as exc:  # a bug must not stop the reports: recorded, logged with its trace
            log.debug("sampling %s failed", group, exc_info=True)
            reasons.append(f"{group}: unexpected {type(exc).__name__}: {exc}")
        return default

    def _log_changes(self, reasons: list[str]) -> None:
        # Every 5 s would flood the journal: log a reason when it appears and when all clear.
        current = frozenset(reasons)
        for reason in sorted(current - self._logged):
            log.warning("system figures degraded: %s", reason)
        if self._logged and not current:
            log.info("system figures readable again")
        self._logged = current

    def _current_layout(self) -> cgroups.Layout:
        text = self._read(self._p_cgroup)
        if text is None:
            raise FigureError(f"no {self._p_cgroup}: host figures only")
        if text != self._layout_key:  # moved to another group (or first sample)
            self._layout = cgroups.discover(self.cgroup_root, text, _read_optional(self._p_mountinfo))
            self._layout_key = text
            self._cg_read.forget()
        if self._layout.unified is None and not self._layout.v1 and text.strip():
            # the process has a cgroup but its files are not mounted here: limits unseen
            raise FigureError(f"no cgroup hierarchy of {self._p_cgroup} under {self.cgroup_root}: "
                              "host figures only")
        return self._layout

    # --- cpu -------------------------------------------------------------------

    def _cpu(self, layout: cgroups.Layout, reasons: list[str]) -> dict[str, Any]:
        online = self._online_cpus(reasons)
        cpu: dict[str, Any] = {"cores": online} if online is not None else {}
        load = self._guard(reasons, "cpu", self._loadavg, None)
        if load is not None:
            cpu["load"] = load
        bounds: list[float] = [online] if online is not None else []
        read = self._cg_read
        h = layout.for_controller("cpu")
        quota = self._guard(reasons, "cpu", functools.partial(cgroups.quota_cores, h, read), None) if h else None
        h = layout.for_controller("cpuset")
        cpuset = self._guard(reasons, "cpu", functools.partial(cgroups.cpuset_count, h, read), None) if h else None
        for key, value in (("quota_cores", quota), ("cpuset_cpus", cpuset)):
            if value is not None:
                cpu[key] = _number(value)
                bounds.append(value)
        if bounds:
            cpu["cores"] = _number(min(bounds))
        if online is not None:
            cpu["online_cpus"] = online
        cpu.update(self._guard(reasons, "cpu", functools.partial(cgroups.cpu_stat, layout, read), {}))
        h = layout.for_controller("pids")
        if h is not None:
            cpu.update(self._guard(reasons, "cpu", functools.partial(cgroups.pids, h, read), {}))
        return cpu

    def _online_cpus(self, reasons: list[str]) -> int | None:
        """The online CPU count from the roots given; os.cpu_count() (this process's host) only
        when the roots are the host's own, never for a tree the sampler was pointed at."""
        if self._cpu_count is None or self._count % CPU_COUNT_EVERY == 0:
            self._cpu_count = self._guard(reasons, "cpu", self._read_cpu_count, None)
        if self._cpu_count is None:
            if not self._real_proc:
                return None  # the reason is already in `reasons`
            reasons.append("cpu: CPU count from os.cpu_count()")
            return os.cpu_count() or 1
        return self._cpu_count

    def _read_cpu_count(self) -> int:
        path = os.path.join(self.sys_root, "devices", "system", "cpu", "online")
        text = self._read(path)
        if text is not None:
            return cgroups.count_cpu_list(path, text)
        path = self._p_stat
        text = self._read(path)
        if text is None:
            raise FigureError(f"no {self.sys_root}/devices/system/cpu/online and no {path}")
        count = sum(1 for line in text.splitlines() if line.startswith("cpu") and line[3:4].isdigit())
        if count == 0:
            raise FigureError(f"no cpuN lines in {path}")
        return count

    def _loadavg(self) -> dict[str, float]:
        path = self._p_loadavg
        text = self._read(path)
        if text is None:
            raise FigureError(f"no {path}")
        parts = text.split()
        try:
            return {"1m": float(parts[0]), "5m": float(parts[1]), "15m": float(parts[2])}
        except (ValueError, IndexError):
            raise FigureError(f"cannot parse {path}: {text.strip()[:40]!r}") from None

    # --- memory ----------------------------------------------------------------

    def _memory(self, layout: cgroups.Layout, reasons: list[str]) -> dict[str, Any] | None:
        host = self._guard(reasons, "memory", self._meminfo, None)
        h = layout.for_controller("memory")
        group = self._guard(reasons, "memory", functools.partial(cgroups.memory, h, self._cg_read),
                            None) if h else None
        out: dict[str, Any] = {}
        if h and group is not None and group.limit is not None and (host is None or group.limit < host[0]):
            out["mem_total_bytes"] = group.limit
            # the working set is unknown if usage is: then nothing is known to be in use
            used = group.working_set if group.working_set is not None else 0
            out["mem_available_bytes"] = max(0, group.limit - used)
            out["source"] = f"cgroup_v{h.version}"
        elif host is not None:
            out["mem_total_bytes"], out["mem_available_bytes"] = host
            out["source"] = "meminfo"
        else:
            return None
        if group is not None:
            if group.limit is not None:
                out["limit_bytes"] = group.limit
            if group.usage is not None:
                out["usage_bytes"] = group.usage
                out["working_set_bytes"] = group.working_set
        return out

    def _meminfo(self) -> tuple[int, int]:
        path = self._p_meminfo
        text = self._read(path)
        if text is None:
            raise FigureError(f"no {path}")
        values: dict[str, int] = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            if key in MEMINFO_KEYS:
                try:
                    values[key] = int(rest.split()[0]) * 1024  # kB
                except (ValueError, IndexError):
                    raise FigureError(f"cannot parse {path}: {line[:40]!r}") from None
                if len(values) == len(MEMINFO_KEYS):
                    break  # they are the first five lines; skip the other fifty
        if "MemTotal" not in values:
            raise FigureError(f"no MemTotal in {path}")
        available = values.get("MemAvailable")
        if available is None:  # kernels before 3.14
            available = sum(values.get(k, 0) for k in ("MemFree", "Buffers", "Cached"))
        return values["MemTotal"], available

    # --- disk ------------------------------------------------------------------

    def _disk(self, layout: cgroups.Layout, reasons: list[str]) -> tuple[dict[str, Any], int]:
        try:
            st = os.statvfs(self.persistent_dir)
        except OSError as exc:
            raise FigureError(f"statvfs {self.persistent_dir}: {exc.strerror}") from exc
        disk: dict[str, Any] = {"mount_path": self.persistent_dir,
                "root_total_bytes": st.f_blocks * st.f_frsize,
                "root_free_bytes": st.f_bavail * st.f_frsize}
        h = layout.for_controller("blkio")
        if h is not None:
            disk.update(self._guard(reasons, "disk", functools.partial(cgroups.io_bytes, h, self._cg_read), {}))
        return disk, (st.f_blocks - st.f_bfree) * st.f_frsize

    # --- network ---------------------------------------------------------------

    def _network(self, layout: cgroups.Layout, reasons: list[str]) -> dict[str, Any]:
        path = self._p_dev
        text = self._read(path)
        if text is None:
            raise FigureError(f"no {path}")
        counters = parse_net_dev(path, text)
        addresses = self._guard(reasons, "network", functools.partial(self._addresses, set(counters)), {})
        interfaces = []
        for name, (rx, tx) in counters.items():
            interfaces.append({"name": name, "status": self._status(name, reasons),
                               "addresses": addresses.get(name, []), "rx_bytes": rx, "tx_bytes": tx})
        return {"interfaces": interfaces}

    def _status(self, name: str, reasons: list[str]) -> str:
        base = f"{self._p_net}/{name}"
        try:
            state = self._read(f"{base}/operstate")
            if state is None:
                return "unknown"  # no sysfs here (some containers): not a failure
            state = state.strip()
            if state == "up":
                return "up"
            if state == "unknown":  # tun, dummy and others without carrier reporting
                flags = self._read(f"{base}/flags")
                return "up" if flags and int(flags.strip(), 16) & IFF_UP else "down"
            return "down"
        except (FigureError, ValueError) as exc:
            reasons.append(f"network: status of {name}: {exc}")
            return "unknown"

    def _addresses(self, names: set[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        trie = self._read(self._p_trie)
        route = self._read(self._p_route)
        if trie is not None and route is not None:
            for addr, name in ipv4_addresses(trie, route):
                out.setdefault(name, []).append(addr)
        inet6 = self._read(self._p_inet6)
        if inet6 is not None:
            for addr, name in ipv6_addresses(inet6):
                out.setdefault(name, []).append(addr)
        return {name: addrs for name, addrs in out.items() if name in names}


def default_sys_root(cgroup_root: str, proc_root: str = "/proc") -> str:
    """Where sysfs is when no --sys-root is given: `<X>/sys` next to a proc root `<X>/proc`
    that is not the host's (a fixture tree: its CPU count, not the host's), else `<X>/sys`
    for a cgroup root `<X>/sys/fs/cgroup`, else /sys. A proc root with no sysfs beside it
    gets `<X>/proc/../sys`, which does not exist: the CPU count then comes from its
    `stat`, never from the host's /sys."""
    proc = os.path.normpath(proc_root)
    if proc != "/proc":
        return os.path.join(os.path.dirname(proc), "sys")
    norm = os.path.normpath(cgroup_root)
    head, tail = os.path.split(norm)
    if tail == "cgroup" and os.path.basename(head) == "fs":
        return os.path.dirname(head)
    return "/sys"


def _read_optional(path: str) -> str | None:
    try:
        return read_text(path)  # once per layout change: not worth a kept descriptor
    except FigureError:  # mountinfo only refines discovery; the suffix rule still applies
        return None


def _number(value: float) -> int | float:
    """Whole numbers as int (seed 004 shows `cores: 2`), others to 2 decimals."""
    return int(value) if float(value).is_integer() else round(float(value), 2)


def parse_net_dev(path: str, text: str) -> dict[str, tuple[int, int]]:
    """`<proc>/net/dev` as name -> (rx_bytes, tx_bytes), without `lo`."""
    out = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or name == "lo":
            continue
        fields = rest.split()
        try:
            out[name] = (int(fields[0]), int(fields[8]))
        except (ValueError, IndexError):
            raise FigureError(f"cannot parse {path}: {line.strip()[:40]!r}") from None
    return out


def ipv4_addresses(fib_trie: str, route: str) -> list[tuple[str, str]]:
    """Local IPv4 addresses (fib_trie's `/32 host LOCAL` leaves), each with the interface
    of the most specific connected route (`<proc>/net/route` without a gateway) holding it."""
    routes = []
    for line in route.splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and not int(f[3], 16) & RTF_GATEWAY:
            dest, mask = _le_ip(f[1]), _le_ip(f[7])
            routes.append((bin(mask).count("1"), dest, mask, f[0]))
    routes.sort(reverse=True)
    seen, out = set(), []
    for leaf in _local_leaves(fib_trie):
        if leaf in seen:
            continue
        seen.add(leaf)
        value = int.from_bytes(socket.inet_aton(leaf), "big")
        for _, dest, mask, name in routes:
            if value & mask == dest:
                out.append((leaf, name))
                break
    return out


def _local_leaves(fib_trie: str) -> Iterator[str]:
    """The `|-- A.B.C.D` leaf above each `/32 host LOCAL` line, found with str.find, not a
    line-by-line walk (docs/performance.md section 3). The Local table holds every local
    address, so the walk starts there when the kernel prints one."""
    start = fib_trie.find("\nLocal:")
    text = fib_trie if start < 0 else fib_trie[start:]
    at = text.find("/32 host LOCAL")
    while at >= 0:
        bar = text.rfind("|-- ", 0, at)
        if bar >= 0:
            end = text.find("\n", bar)
            yield text[bar + 4:end].strip()
        at = text.find("/32 host LOCAL", at + 14)


def _le_ip(hex_text: str) -> int:
    # /proc/net/route prints addresses as host-order (little-endian) hex
    return int.from_bytes(bytes.fromhex(hex_text), "little")


def ipv6_addresses(if_inet6: str) -> list[tuple[str, str]]:
    """Global and site IPv6 addresses from `<proc>/net/if_inet6`, as (address, interface)."""
    out = []
    for line in if_inet6.splitlines():
        f = line.split()
        if len(f) != 6:
            continue
        scope, flags = int(f[3], 16), int(f[4], 16)
        if scope in IPV6_SKIP_SCOPES or flags & (IFA_F_DADFAILED | IFA_F_TENTATIVE):
            continue
        out.append((socket.inet_ntop(socket.AF_INET6, bytes.fromhex(f[0])), f[5]))
    return out
