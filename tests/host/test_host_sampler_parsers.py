"""The file formats, one parser at a time."""
import os

import pytest
from sampler_helpers import copy_case, sampler_for, write

from caldera.host import cgroups
from caldera.host.cgroups import FigureError
from caldera.host.sampler import default_sys_root, ipv4_addresses, ipv6_addresses, parse_net_dev


@pytest.mark.parametrize("text,count", [("0-3", 4), ("0", 1), ("0-3,8,10-11\n", 7), ("", 0)])
def test_cpu_list(text, count):
    assert cgroups.count_cpu_list("f", text) == count


def test_cpu_list_garbage_names_the_file():
    with pytest.raises(FigureError, match="cannot parse /x/cpuset.cpus.effective: '0-a'"):
        cgroups.count_cpu_list("/x/cpuset.cpus.effective", "0-a\n")


def test_proc_cgroup_lines():
    text = "12:cpu,cpuacct:/a\n1:name=systemd:/s\n0::/u\nbroken\n"
    assert cgroups.parse_proc_cgroup(text) == {"cpu": "/a", "cpuacct": "/a", "": "/u"}


def test_mountinfo_roots_for_v2_and_v1():
    text = ("30 22 0:26 /kube/ctr /sys/fs/cgroup ro,relatime shared:9 - cgroup2 cgroup2 rw\n"
            "31 22 0:27 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
            "32 22 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
            "33 22 0:29 / /proc rw - proc proc rw\n")
    assert cgroups.parse_mountinfo_roots(text) == {
        "": "/kube/ctr", "memory": "/docker/abc", "cpu": "/", "cpuacct": "/"}


def test_outside_our_namespace_means_the_mount_root(tmp_path):
    # a process moved out of the namespace's root sees "/../x": only the mount is ours
    os.makedirs(tmp_path / "x")
    assert cgroups._levels(str(tmp_path), "/../x", None) == (str(tmp_path),)


def test_levels_go_from_group_up_to_mount(tmp_path):
    os.makedirs(tmp_path / "a" / "b")
    m = str(tmp_path)
    assert cgroups._levels(m, "/a/b", "/") == (f"{m}/a/b", f"{m}/a", m)


def test_net_dev_without_space_after_colon_and_without_lo():
    text = ("Inter-| Receive | Transmit\n face |bytes ...\n"
            "    lo:1 2 0 0 0 0 0 0 1 2 0 0 0 0 0 0\n"
            "  eth0:18446744073709551615 2 0 0 0 0 0 0 77 2 0 0 0 0 0 0\n")
    # 64-bit counters survive intact
    assert parse_net_dev("dev", text) == {"eth0": (18446744073709551615, 77)}


ROUTE_HEADER = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"


def test_ipv4_addresses_go_to_the_most_specific_connected_route():
    route = ROUTE_HEADER + (
        "eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"   # default via 10.0.0.1
        "eth0\t0000000A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"   # 10.0.0.0/16
        "wg0\t0001000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"    # 10.0.1.0/24
        "eth1\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")  # 192.168.0.0/24
    trie = ("Local:\n  +-- 0.0.0.0/0 3 0 5\n"
            "     |-- 10.0.0.5\n        /32 host LOCAL\n"
            "     |-- 10.0.1.7\n        /32 host LOCAL\n"
            "     |-- 10.0.255.255\n        /32 link BROADCAST\n"
            "     |-- 192.168.0.9\n        /32 host LOCAL\n"
            "     |-- 172.16.0.1\n        /32 host LOCAL\n"       # no connected route: left out
            "Main:\n     |-- 10.0.0.5\n        /32 host LOCAL\n")  # listed twice: once only
    assert ipv4_addresses(trie, route) == [
        ("10.0.0.5", "eth0"), ("10.0.1.7", "wg0"), ("192.168.0.9", "eth1")]


def test_ipv6_addresses_skip_link_local_host_and_tentative():
    text = ("fe800000000000000000000000000001 02 40 20 80 eth0\n"
            "00000000000000000000000000000001 01 80 10 80 lo\n"
            "20010db8000000000000000000000001 02 40 00 80 eth0\n"
            "20010db8000000000000000000000002 02 40 00 40 eth0\n"   # tentative
            "20010db8000000000000000000000003 02 40 00 88 eth0\n"   # dad failed
            "fd000000000000000000000000000012 03 40 00 02 wg0\n")
    assert ipv6_addresses(text) == [("2001:db8::1", "eth0"), ("fd00::12", "wg0")]


def test_sys_root_follows_a_fixture_cgroup_root():
    assert default_sys_root("/t/case/sys/fs/cgroup") == "/t/case/sys"
    assert default_sys_root("/t/case/sys/fs/cgroup/") == "/t/case/sys"
    assert default_sys_root("/sys/fs/cgroup") == "/sys"
    assert default_sys_root("/somewhere/else") == "/sys"


@pytest.mark.parametrize("operstate,flags,status", [
    ("up", "0x1003", "up"), ("down", "0x1003", "down"), ("lowerlayerdown", "0x1003", "down"),
    ("unknown", "0x1091", "up"), ("unknown", "0x1090", "down")])
def test_interface_status(tmp_path, operstate, flags, status):
    root = copy_case(tmp_path, "v2_root")
    write(root, "sys/class/net/eth0/operstate", operstate + "\n")
    write(root, "sys/class/net/eth0/flags", flags + "\n")
    eth0 = sampler_for(root).sample().system_info["network"]["interfaces"][0]
    assert (eth0["name"], eth0["status"]) == ("eth0", status)


def test_interface_without_sysfs_is_unknown_but_not_degraded(tmp_path):
    root = copy_case(tmp_path, "v2_root")
    os.unlink(os.path.join(root, "sys/class/net/eth1/operstate"))
    s = sampler_for(root).sample()
    assert s.system_info["network"]["interfaces"][1]["status"] == "unknown"
    assert s.metrics_collector == "ok"


def test_v1_quota_without_period_uses_default(tmp_path):
    root = tmp_path
    write(str(root), "g/cpu.cfs_quota_us", "250000\n")
    h = cgroups.Hierarchy(1, (str(root / "g"), str(root)))
    assert cgroups.quota_cores(h) == 2.5


@pytest.mark.parametrize("text", ["0 100000", "abc 100000", "100000 0"])
def test_bad_cpu_max_is_named(tmp_path, text):
    write(str(tmp_path), "cpu.max", text + "\n")
    with pytest.raises(FigureError, match="cpu.max"):
        cgroups.quota_cores(cgroups.Hierarchy(2, (str(tmp_path),)))


def test_limits_at_or_above_two_to_the_sixty_are_unlimited(tmp_path):
    write(str(tmp_path), "memory.limit_in_bytes", f"{1 << 60}\n")
    write(str(tmp_path), "memory.usage_in_bytes", "100\n")
    m = cgroups.memory(cgroups.Hierarchy(1, (str(tmp_path),)))
    assert (m.limit, m.usage, m.working_set) == (None, 100, 100)
    write(str(tmp_path), "memory.limit_in_bytes", f"{(1 << 60) - 1}\n")
    assert cgroups.memory(cgroups.Hierarchy(1, (str(tmp_path),))).limit == (1 << 60) - 1


def test_working_set_is_floored_at_zero(tmp_path):
    write(str(tmp_path), "memory.max", "1000\n")
    write(str(tmp_path), "memory.current", "100\n")
    write(str(tmp_path), "memory.stat", "inactive_file 500\n")
    m = cgroups.memory(cgroups.Hierarchy(2, (str(tmp_path),)))
    assert (m.limit, m.usage, m.working_set) == (1000, 100, 0)


def test_layout_prefers_v1_controllers_and_knows_empty_unified():
    layout = cgroups.Layout(
        unified=cgroups.Hierarchy(2, ("/u",)), unified_controllers=frozenset({"memory", "io"}),
        v1={"cpu": cgroups.Hierarchy(1, ("/c",))})
    assert layout.for_controller("cpu").group == "/c"
    assert layout.for_controller("memory").group == "/u"
    assert layout.for_controller("blkio").group == "/u"  # v2 calls it io
    assert layout.for_controller("pids") is None


def test_read_text_reads_long_files_to_the_end(tmp_path):
    # more than the 64 KiB first read: a /proc/net/dev with a thousand interfaces
    text = "".join(f"line {i:06d} {'x' * 100}\n" for i in range(2000))
    (tmp_path / "big").write_text(text)
    assert cgroups.read_text(str(tmp_path / "big")) == text
    assert cgroups.read_text(str(tmp_path / "absent")) is None


def test_stat_value_finds_the_whole_key_only():
    text = "total_inactive_file 7\ninactive_file 3\nactive_file 9"
    assert cgroups.stat_value("s", text, "inactive_file") == 3
    assert cgroups.stat_value("s", text, "total_inactive_file") == 7
    assert cgroups.stat_value("s", text, "active_file") == 9
    assert cgroups.stat_value("s", "inactive_file 1\n", "inactive_file") == 1
    assert cgroups.stat_value("s", text, "anon") is None
    with pytest.raises(FigureError, match="cannot parse s: 'anon x'"):
        cgroups.stat_value("s", "anon x\n", "anon")


def test_absent_cgroup_files_are_looked_for_again_every_sixty_samples(tmp_path):
    # a controller enabled later makes cpu.max appear: noticed within CPU_COUNT_EVERY samples
    from caldera.host.sampler import CPU_COUNT_EVERY

    root = copy_case(tmp_path, "v2_one_number")
    os.unlink(os.path.join(root, "sys/fs/cgroup/app/cpu.max"))
    sampler = sampler_for(root)
    assert sampler.sample().system_info["cpu"]["cores"] == 8
    write(root, "sys/fs/cgroup/app/cpu.max", "150000 100000\n")
    seen = [sampler.sample().system_info["cpu"]["cores"] for _ in range(CPU_COUNT_EVERY)]
    assert seen[0] == 8 and seen[-1] == 1.5
    assert seen.index(1.5) == CPU_COUNT_EVERY - 1
