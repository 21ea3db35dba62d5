"""A figure that cannot be read is left out, the sample says why, and nothing raises."""
import os
import shutil
from pathlib import Path

from sampler_helpers import HOST_AVAILABLE, HOST_TOTAL, copy_case, sampler_for, write

from caldera.host import cgroups
from caldera.host.sampler import Sampler


def test_unparseable_memory_limit_falls_back_to_meminfo_and_says_so(tmp_path):
    root = copy_case(tmp_path, "v2_cpuset_narrow")
    write(root, "sys/fs/cgroup/job/memory.max", "lots\n")
    s = sampler_for(root).sample()
    assert s.system_info["memory"] == {
        "mem_total_bytes": HOST_TOTAL, "mem_available_bytes": HOST_AVAILABLE, "source": "meminfo"}
    assert s.metrics_collector == "degraded"
    assert len(s.reasons) == 1
    assert s.reasons[0].startswith("memory: cannot parse ") and "job/memory.max" in s.reasons[0]
    assert s.system_info["cpu"]["cores"] == 2  # the other groups are untouched


def test_unreadable_file_is_a_reason_not_an_exception(tmp_path):
    # a directory where a file should be: open works, read fails with EISDIR (we run as root,
    # so a chmod would not stop the read)
    root = copy_case(tmp_path, "v1_limits")
    path = os.path.join(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us")
    os.unlink(path)
    os.mkdir(path)
    s = sampler_for(root).sample()
    assert s.metrics_collector == "degraded"
    assert any(r.startswith("cpu: cannot read ") and "cpu.cfs_quota_us" in r for r in s.reasons)
    # without the quota the cpuset (0-1) bounds the cores
    assert s.system_info["cpu"]["cores"] == 2
    assert "quota_cores" not in s.system_info["cpu"]


def test_missing_loadavg_leaves_out_load_only(tmp_path):
    root = copy_case(tmp_path, "v2_quota_memory")
    os.unlink(os.path.join(root, "proc/loadavg"))
    s = sampler_for(root).sample()
    assert "load" not in s.system_info["cpu"]
    assert s.system_info["cpu"]["cores"] == 2
    assert s.reasons == [f"cpu: no {root}/proc/loadavg"]
    assert s.metrics_collector == "degraded"


def test_missing_net_dev_leaves_out_network(tmp_path):
    root = copy_case(tmp_path, "v2_root")
    os.unlink(os.path.join(root, "proc/net/dev"))
    s = sampler_for(root).sample()
    assert "network" not in s.system_info
    assert s.reasons == [f"network: no {root}/proc/net/dev"]


def test_garbage_net_dev_line_is_named(tmp_path):
    root = copy_case(tmp_path, "v2_root")
    write(root, "proc/net/dev", "h1\nh2\n  eth0: 12 x\n")
    s = sampler_for(root).sample()
    assert "network" not in s.system_info
    assert s.reasons[0].startswith("network: cannot parse ") and "eth0" in s.reasons[0]


def test_missing_persistent_dir_leaves_out_disk(tmp_path):
    root = copy_case(tmp_path, "v2_root")
    shutil.rmtree(os.path.join(root, "persistent"))
    s = sampler_for(root).sample()
    assert "disk" not in s.system_info
    assert s.disk_used_bytes is None
    assert len(s.reasons) == 1 and s.reasons[0].startswith("disk: statvfs ")


def test_no_meminfo_and_no_cgroup_memory_leaves_out_memory(tmp_path):
    root = copy_case(tmp_path, "v2_root")
    os.unlink(os.path.join(root, "proc/meminfo"))
    s = sampler_for(root).sample()
    assert "memory" not in s.system_info
    assert s.reasons == [f"memory: no {root}/proc/meminfo"]


def test_cgroup_limit_stands_when_meminfo_is_missing(tmp_path):
    root = copy_case(tmp_path, "v1_limits")
    os.unlink(os.path.join(root, "proc/meminfo"))
    s = sampler_for(root).sample()
    assert s.system_info["memory"]["mem_total_bytes"] == 512 * 1024 * 1024
    assert s.metrics_collector == "degraded"


def test_nothing_there_at_all_still_gives_a_sample(tmp_path):
    s = Sampler(proc_root=str(tmp_path / "no-proc"), cgroup_root=str(tmp_path / "no-cg"),
                persistent_dir=str(tmp_path / "no-dir"), sys_root=str(tmp_path / "no-sys")).sample()
    assert s.metrics_collector == "degraded"
    # Not one figure of this host's leaks in for a tree that is not there (no os.cpu_count()).
    assert set(s.system_info) == {"runtime_type", "runtime_name", "sampled_at"}
    assert not any("os.cpu_count" in r for r in s.reasons)
    groups = {r.split(":", 1)[0] for r in s.reasons}
    assert groups == {"cgroup", "cpu", "memory", "disk", "network"}


def test_a_bug_in_one_group_does_not_escape(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(cgroups, "memory", broken)
    root = copy_case(tmp_path, "v1_limits")
    s = sampler_for(root).sample()
    assert "memory: unexpected RuntimeError: boom" in s.reasons
    assert s.system_info["memory"]["source"] == "meminfo"
    assert s.system_info["cpu"]["cores"] == 0.5


def test_recovers_when_the_file_is_fixed(tmp_path):
    root = copy_case(tmp_path, "v2_cpuset_narrow")
    good = Path(root, "sys/fs/cgroup/job/memory.max").read_text()
    write(root, "sys/fs/cgroup/job/memory.max", "lots\n")
    sampler = sampler_for(root)
    assert sampler.sample().metrics_collector == "degraded"
    write(root, "sys/fs/cgroup/job/memory.max", good)
    s = sampler.sample()
    assert (s.metrics_collector, s.reasons) == ("ok", [])
    assert s.system_info["memory"]["mem_total_bytes"] == 4 * 1024 ** 3


def test_moving_to_another_group_is_noticed(tmp_path):
    # the layout is cached per /proc/self/cgroup content: a changed file re-discovers it
    root = copy_case(tmp_path, "v2_cpuset_narrow")
    write(root, "sys/fs/cgroup/other/cpu.max", "50000 100000\n")
    sampler = sampler_for(root)
    assert sampler.sample().system_info["cpu"]["cores"] == 2
    write(root, "proc/self/cgroup", "0::/other\n")
    assert sampler.sample().system_info["cpu"]["cores"] == 0.5


def test_nested_path_without_mountinfo_uses_the_mount_root(tmp_path):
    root = copy_case(tmp_path, "container_nested")
    os.unlink(os.path.join(root, "proc/self/mountinfo"))
    s = sampler_for(root).sample()
    assert s.system_info["memory"]["mem_total_bytes"] == 256 * 1024 * 1024
    assert s.system_info["cpu"]["cores"] == 1


def test_nested_path_without_mountinfo_finds_the_existing_suffix(tmp_path):
    # host path /kubepods.slice/…/ctr.scope/app; the mount shows the container: app exists in it
    root = copy_case(tmp_path, "container_nested")
    os.unlink(os.path.join(root, "proc/self/mountinfo"))
    text = Path(root, "proc/self/cgroup").read_text().strip()
    write(root, "proc/self/cgroup", text + "/app\n")
    write(root, "sys/fs/cgroup/app/memory.max", "134217728\n")
    write(root, "sys/fs/cgroup/app/memory.current", "0\n")
    s = sampler_for(root).sample()
    assert s.system_info["memory"]["mem_total_bytes"] == 128 * 1024 * 1024
    assert s.system_info["cpu"]["cores"] == 1  # cpu.max found one level up, at the mount root


def test_reasons_are_logged_once_per_appearance(tmp_path, caplog):
    root = copy_case(tmp_path, "v2_root")
    os.unlink(os.path.join(root, "proc/loadavg"))
    sampler = sampler_for(root)
    with caplog.at_level("INFO", logger="caldera.host.sampler"):
        sampler.sample()
        sampler.sample()
        write(root, "proc/loadavg", "1.00 1.00 1.00 1/1 1\n")
        sampler.sample()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [f"system figures degraded: cpu: no {root}/proc/loadavg",
                        "system figures readable again"]


def test_cgroup_files_not_mounted_means_host_figures_and_degraded(tmp_path):
    # a container without /sys/fs/cgroup: its limits cannot be seen, so say so
    root = copy_case(tmp_path, "v1_limits")
    shutil.rmtree(os.path.join(root, "sys/fs/cgroup"))
    s = sampler_for(root).sample()
    assert s.system_info["memory"]["source"] == "meminfo"
    assert s.system_info["cpu"]["cores"] == 8
    assert s.reasons == [f"cgroup: no cgroup hierarchy of {root}/proc/self/cgroup under "
                         f"{root}/sys/fs/cgroup: host figures only"]
