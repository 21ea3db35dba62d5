"""Sample this machine and compare with figures computed here, independently, from the
same files (and `ip -o addr` for the addresses when iproute2 is installed).

Counters and free space move while the test runs, so those are bracketed by
readings taken before and after the sample; the fixed figures must match exactly.
"""
import os
import re
import shutil

import pytest

from caldera.host import proc
from caldera.host.sampler import Sampler

CG = "/sys/fs/cgroup"
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/cgroup"), reason="needs Linux /proc")


def read(path):
    with open(path) as fh:
        return fh.read()


def cpus_in(text):
    n = 0
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        n += int(b or a) - int(a) + 1
    return n


def own_paths():
    """controller (or "" for v2) -> path, from /proc/self/cgroup"""
    out = {}
    for line in read("/proc/self/cgroup").splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in (ctrls.split(",") if ctrls else [""]):
            out[c] = path
    return out


def walk(mount, path):
    """existing directories from the group up to the mount"""
    rel = path.strip("/")
    while rel and not os.path.isdir(os.path.join(mount, rel)):
        rel = rel.partition("/")[2]  # container without a cgroup namespace
    dirs = []
    while True:
        dirs.append(os.path.join(mount, rel) if rel else mount)
        if not rel:
            return dirs
        rel = os.path.dirname(rel)


def v1_dir(controller):
    for name in os.listdir(CG):
        if controller in name.split(",") and os.path.isdir(os.path.join(CG, name)):
            return os.path.join(CG, name)
    return None


def expected_cores():
    bounds = [cpus_in(read("/sys/devices/system/cpu/online"))]
    paths = own_paths()
    pure_v2 = os.path.exists(f"{CG}/cgroup.controllers")
    if pure_v2:
        for d in walk(CG, paths[""]):
            if os.path.exists(f"{d}/cpu.max"):
                q, _, p = read(f"{d}/cpu.max").strip().partition(" ")
                if q != "max":
                    bounds.append(int(q) / int(p or 100000))
        for d in walk(CG, paths[""]):
            if os.path.exists(f"{d}/cpuset.cpus.effective"):
                bounds.append(cpus_in(read(f"{d}/cpuset.cpus.effective")))
                break
    else:
        mount = v1_dir("cpu")
        if mount and "cpu" in paths:
            for d in walk(mount, paths["cpu"]):
                if os.path.exists(f"{d}/cpu.cfs_quota_us"):
                    q = int(read(f"{d}/cpu.cfs_quota_us"))
                    if q > 0:
                        bounds.append(q / int(read(f"{d}/cpu.cfs_period_us")))
        mount = v1_dir("cpuset")
        if mount and "cpuset" in paths:
            for d in walk(mount, paths["cpuset"]):
                if os.path.exists(f"{d}/cpuset.effective_cpus"):
                    bounds.append(cpus_in(read(f"{d}/cpuset.effective_cpus")))
                    break
    cores = min(bounds)
    return int(cores) if cores == int(cores) else round(cores, 2)


def memory_limit():
    """the tightest cgroup memory limit below 2^60, or None"""
    paths = own_paths()
    if os.path.exists(f"{CG}/cgroup.controllers"):
        mount, path, name = CG, paths[""], "memory.max"
    else:
        mount, path, name = v1_dir("memory"), paths.get("memory"), "memory.limit_in_bytes"
        if mount is None or path is None:
            return None
    limits = []
    for d in walk(mount, path):
        if os.path.exists(f"{d}/{name}"):
            text = read(f"{d}/{name}").strip()
            if text != "max" and int(text) < 2 ** 60:
                limits.append(int(text))
    return min(limits) if limits else None


def meminfo():
    values = {}
    for line in read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        values[key] = int(rest.split()[0]) * 1024
    return values


def net_dev():
    out = {}
    for line in read("/proc/net/dev").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() != "lo":
            f = rest.split()
            out[name.strip()] = (int(f[0]), int(f[8]))
    return out


def loadavg():
    a, b, c = read("/proc/loadavg").split()[:3]
    return {"1m": float(a), "5m": float(b), "15m": float(c)}


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    pdir = str(tmp_path_factory.mktemp("persistent"))
    before = {"load": loadavg(), "net": net_dev(), "mem": meminfo(), "disk": os.statvfs(pdir)}
    sample = Sampler(persistent_dir=pdir).sample()
    after = {"load": loadavg(), "net": net_dev(), "mem": meminfo(), "disk": os.statvfs(pdir)}
    return sample, before, after, pdir


def test_live_sample_is_ok(observed):
    sample = observed[0]
    assert (sample.metrics_collector, sample.reasons) == ("ok", [])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", sample.system_info["sampled_at"])


def test_live_cpu(observed):
    sample, before, after, _ = observed
    cpu = sample.system_info["cpu"]
    assert cpu["cores"] == expected_cores()
    assert cpu["load"] in (before["load"], after["load"])


def test_live_memory(observed):
    sample, before, after, _ = observed
    mem = sample.system_info["memory"]
    limit = memory_limit()
    if limit is not None and limit < before["mem"]["MemTotal"]:
        assert mem["mem_total_bytes"] == limit
        assert 0 <= mem["mem_available_bytes"] <= limit
    else:
        assert mem["mem_total_bytes"] == before["mem"]["MemTotal"]
        lo = min(before["mem"]["MemAvailable"], after["mem"]["MemAvailable"])
        hi = max(before["mem"]["MemAvailable"], after["mem"]["MemAvailable"])
        slack = 64 * 1024 * 1024  # other processes allocate meanwhile
        assert lo - slack <= mem["mem_available_bytes"] <= hi + slack


def test_live_disk(observed):
    sample, before, after, pdir = observed
    disk = sample.system_info["disk"]
    st = before["disk"]
    assert disk["mount_path"] == pdir
    assert disk["root_total_bytes"] == st.f_blocks * st.f_frsize
    frees = [s.f_bavail * s.f_frsize for s in (before["disk"], after["disk"])]
    slack = 256 * 1024 * 1024  # other test runs write to the same filesystem
    assert min(frees) - slack <= disk["root_free_bytes"] <= max(frees) + slack


def test_live_network_counters_and_status(observed):
    sample, before, after, _ = observed
    nics = {n["name"]: n for n in sample.system_info["network"]["interfaces"]}
    assert set(nics) == set(before["net"]) | set(after["net"])
    for name, nic in nics.items():
        assert before["net"][name][0] <= nic["rx_bytes"] <= after["net"][name][0]
        assert before["net"][name][1] <= nic["tx_bytes"] <= after["net"][name][1]
        state = read(f"/sys/class/net/{name}/operstate").strip()
        if state in ("up", "down"):
            assert nic["status"] == state


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 not installed")
def test_live_addresses_match_iproute2(observed):
    sample = observed[0]
    res = proc.run(["ip", "-o", "addr", "show"], env=dict(os.environ), timeout=10,
                   stdout_cap=1 << 20)
    assert res.ok, res.failure()
    out = res.stdout.decode()
    want = {}
    for line in out.splitlines():
        f = line.split()
        name, addr = f[1].split("@")[0], f[3].split("/")[0]
        scope = f[f.index("scope") + 1]
        if name != "lo" and scope in ("global", "site") and "tentative" not in f \
                and "dadfailed" not in f:
            want.setdefault(name, set()).add(addr)
    got = {n["name"]: set(n["addresses"]) for n in sample.system_info["network"]["interfaces"]}
    assert {k: v for k, v in got.items() if v} == want
