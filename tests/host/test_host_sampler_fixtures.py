"""Each checked-in fixture tree gives exactly the figures its files imply.

The expected numbers are worked out by hand from the fixture files (the comment
on each says how); the whole `system_info` is compared, so a stray or missing
key fails too.
"""
import pytest
from sampler_helpers import (
    DISK_USED,
    HOST_AVAILABLE,
    HOST_TOTAL,
    INTERFACES,
    SAMPLED_AT,
    case_root,
    disk,
    install_fake_statvfs,
    sampler_for,
)

LOAD = {"1m": 0.64, "5m": 0.52, "15m": 0.40}
MiB = 1024 * 1024


def expected(root, cpu, memory, disk_extra=None):
    return {"runtime_type": "caldera", "runtime_name": "caldera", "sampled_at": SAMPLED_AT,
            "cpu": cpu, "memory": memory, "disk": disk(root, **(disk_extra or {})),
            "network": {"interfaces": INTERFACES}}


def sample_case(monkeypatch, case):
    root = case_root(case)
    install_fake_statvfs(monkeypatch, root + "/persistent")
    return root, sampler_for(root).sample()


def test_v2_quota_on_parent_and_memory_limit_on_group(monkeypatch):
    root, s = sample_case(monkeypatch, "v2_quota_memory")
    # cores: group cpu.max "max", parent "200000 100000" -> 2; cpuset 0-7 = 8; online 8 -> 2
    # memory: group 1 GiB is tighter than the parent's 2 GiB; 600 MiB - 100 MiB inactive_file
    assert s.system_info == expected(
        root,
        {"cores": 2, "load": LOAD, "quota_cores": 2, "cpuset_cpus": 8, "online_cpus": 8,
         "usage_usec": 5000000, "user_usec": 3000000, "system_usec": 2000000,
         "nr_periods": 100, "nr_throttled": 7, "throttled_usec": 123456,
         "pids_current": 12, "pids_max": 256},
        {"mem_total_bytes": 1024 * MiB, "mem_available_bytes": 1024 * MiB - 500 * MiB,
         "source": "cgroup_v2", "limit_bytes": 1024 * MiB, "usage_bytes": 600 * MiB,
         "working_set_bytes": 500 * MiB},
        {"io_read_bytes": 1000 + 10, "io_write_bytes": 2000 + 20},
    )
    assert (s.metrics_collector, s.reasons) == ("ok", [])
    assert (s.disk_used_bytes, s.disk_limit_bytes) == (DISK_USED, None)


def test_v2_at_the_root_uses_host_figures(monkeypatch):
    root, s = sample_case(monkeypatch, "v2_root")
    # no cpu.max and no memory.max at the root: 4 online CPUs, meminfo
    assert s.system_info == expected(
        root,
        {"cores": 4, "load": LOAD, "cpuset_cpus": 4, "online_cpus": 4,
         "usage_usec": 999999999, "user_usec": 600000000, "system_usec": 399999999},
        {"mem_total_bytes": HOST_TOTAL, "mem_available_bytes": HOST_AVAILABLE, "source": "meminfo"},
    )
    assert s.metrics_collector == "ok"


def test_v2_cpu_max_with_one_number(monkeypatch):
    root, s = sample_case(monkeypatch, "v2_one_number")
    # "150000" is the quota with the default 100000 period: 1.5 cores; memory.max "max"
    cpu = s.system_info["cpu"]
    assert (cpu["cores"], cpu["quota_cores"]) == (1.5, 1.5)
    assert s.system_info["memory"] == {
        "mem_total_bytes": HOST_TOTAL, "mem_available_bytes": HOST_AVAILABLE, "source": "meminfo",
        "usage_bytes": 200 * MiB, "working_set_bytes": 150 * MiB}
    assert s.metrics_collector == "ok"


def test_v2_cpuset_narrower_than_quota(monkeypatch):
    root, s = sample_case(monkeypatch, "v2_cpuset_narrow")
    # quota 4 cores, cpuset 2-3 = 2 CPUs: the cpuset bounds it
    assert s.system_info == expected(
        root,
        {"cores": 2, "load": LOAD, "quota_cores": 4, "cpuset_cpus": 2, "online_cpus": 8},
        {"mem_total_bytes": 4096 * MiB, "mem_available_bytes": 3072 * MiB, "source": "cgroup_v2",
         "limit_bytes": 4096 * MiB, "usage_bytes": 1024 * MiB, "working_set_bytes": 1024 * MiB},
    )


def test_v1_without_limits(monkeypatch):
    root, s = sample_case(monkeypatch, "v1_no_limits")
    # quota -1 at every level, limit 9223372036854771712 (page-rounded LONG_MAX): host figures;
    # usage 700 MiB minus total_inactive_file 200 MiB (not the group-only inactive_file)
    assert s.system_info == expected(
        root,
        {"cores": 6, "load": LOAD, "cpuset_cpus": 6, "online_cpus": 6, "usage_usec": 7000000,
         "nr_periods": 0, "nr_throttled": 0, "throttled_usec": 0, "pids_current": 42},
        {"mem_total_bytes": HOST_TOTAL, "mem_available_bytes": HOST_AVAILABLE, "source": "meminfo",
         "usage_bytes": 700 * MiB, "working_set_bytes": 500 * MiB},
    )


def test_v1_with_limits(monkeypatch):
    root, s = sample_case(monkeypatch, "v1_limits")
    # 50000/100000 = 0.5 cores (tighter than cpuset 0-1); 512 MiB limit, 300 - 50 MiB working set
    assert s.system_info == expected(
        root,
        {"cores": 0.5, "load": LOAD, "quota_cores": 0.5, "cpuset_cpus": 2, "online_cpus": 8,
         "usage_usec": 123456789, "nr_periods": 500, "nr_throttled": 40,
         "throttled_usec": 9000000, "pids_current": 7, "pids_max": 100},
        {"mem_total_bytes": 512 * MiB, "mem_available_bytes": 262 * MiB, "source": "cgroup_v1",
         "limit_bytes": 512 * MiB, "usage_bytes": 300 * MiB, "working_set_bytes": 250 * MiB},
        {"io_read_bytes": 4096 + 100, "io_write_bytes": 8192 + 200},
    )


def test_hybrid_v1_controllers_with_empty_unified(monkeypatch):
    root, s = sample_case(monkeypatch, "hybrid")
    # this machine's layout: cpu, cpuacct, memory in v1 directories, unified has no controllers
    assert s.system_info == expected(
        root,
        {"cores": 2, "load": {"1m": 0.05, "5m": 0.08, "15m": 0.02}, "cpuset_cpus": 2,
         "online_cpus": 2, "usage_usec": 45000000, "nr_periods": 0, "nr_throttled": 0,
         "throttled_usec": 0},
        {"mem_total_bytes": HOST_TOTAL, "mem_available_bytes": HOST_AVAILABLE, "source": "meminfo",
         "usage_bytes": 7073792, "working_set_bytes": 7073792 - 1536000},
        {"io_read_bytes": 0, "io_write_bytes": 0},
    )
    assert s.metrics_collector == "ok"


def test_container_with_nested_host_path(monkeypatch):
    root, s = sample_case(monkeypatch, "container_nested")
    # /proc/self/cgroup names /kubepods.slice/…/cri-containerd-abc.scope; mountinfo says that
    # path is the mount's root, so the limits are read at the fixture's cgroup root
    assert s.system_info == expected(
        root,
        {"cores": 1, "load": LOAD, "quota_cores": 1, "cpuset_cpus": 16, "online_cpus": 16,
         "usage_usec": 777, "user_usec": 700, "system_usec": 77, "nr_periods": 10,
         "nr_throttled": 1, "throttled_usec": 5, "pids_current": 3, "pids_max": 1024},
        {"mem_total_bytes": 256 * MiB, "mem_available_bytes": 160 * MiB, "source": "cgroup_v2",
         "limit_bytes": 256 * MiB, "usage_bytes": 128 * MiB, "working_set_bytes": 96 * MiB},
    )


@pytest.mark.parametrize("case", ["v2_quota_memory", "v1_limits", "hybrid", "container_nested"])
def test_front_end_percentages_follow_from_the_figures(monkeypatch, case):
    # seed 004: CPU % = load.1m / cores * 100, memory % = (total - available) / total * 100
    from caldera.cli.sample import percentages

    _, s = sample_case(monkeypatch, case)
    info = s.system_info
    pct = percentages(info)
    assert pct["cpu"] == pytest.approx(info["cpu"]["load"]["1m"] / info["cpu"]["cores"] * 100)
    mem = info["memory"]
    assert pct["memory"] == pytest.approx(
        (mem["mem_total_bytes"] - mem["mem_available_bytes"]) / mem["mem_total_bytes"] * 100)
    assert pct["disk"] == pytest.approx((2_621_440 - 2_097_152) / 2_621_440 * 100)
