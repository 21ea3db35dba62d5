"""`caldera sample`: the JSON a state report would carry, and the human form."""
import json
import os

import pytest
from sampler_helpers import case_root, copy_case

from caldera import cli


def run(capsys, *argv):
    code = cli.main(["sample", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def fixture_args(root):
    return ["--proc-root", f"{root}/proc", "--cgroup-root", f"{root}/sys/fs/cgroup",
            "--persistent-dir", f"{root}/persistent"]


def test_json_is_exactly_system_info_and_health(capsys):
    root = case_root("v1_limits")
    code, out, _ = run(capsys, "--json", *fixture_args(root))
    assert code == 0
    assert out.count("\n") == 1  # one JSON object on one line
    doc = json.loads(out)
    assert set(doc) == {"system_info", "health"}
    assert doc["health"] == {"metrics_collector": "ok", "metrics_collector_reasons": []}
    info = doc["system_info"]
    assert set(info) == {"runtime_type", "runtime_name", "sampled_at", "cpu", "memory", "disk",
                         "network"}
    assert info["cpu"]["cores"] == 0.5
    assert info["memory"]["mem_total_bytes"] == 536870912
    assert info["disk"]["mount_path"] == f"{root}/persistent"
    assert [nic["name"] for nic in info["network"]["interfaces"]] == ["eth0", "eth1"]


def test_json_carries_reasons_when_degraded(capsys, tmp_path):
    root = copy_case(tmp_path, "v2_root")
    os.unlink(os.path.join(root, "proc/loadavg"))
    code, out, _ = run(capsys, "--json", *fixture_args(root))
    assert code == 0
    assert json.loads(out)["health"] == {
        "metrics_collector": "degraded",
        "metrics_collector_reasons": [f"cpu: no {root}/proc/loadavg"]}


def test_human_form_shows_front_end_percentages_and_counters(capsys, monkeypatch):
    from sampler_helpers import install_fake_statvfs

    root = case_root("v1_limits")
    install_fake_statvfs(monkeypatch, f"{root}/persistent")
    code, out, _ = run(capsys, *fixture_args(root))
    assert code == 0
    lines = out.splitlines()
    # load.1m 0.64 / 0.5 cores; (512 - 262) / 512 MiB; (2621440 - 2097152) / 2621440 blocks
    assert lines[1].split()[:3] == ["cpu", "128.0", "%"]
    assert lines[2].split()[:3] == ["memory", "48.8", "%"]
    assert lines[3].split()[:3] == ["disk", "20.0", "%"]
    eth0 = next(line for line in lines if line.strip().startswith("eth0"))
    assert eth0.split() == ["eth0", "up", "rx", "123456789", "B", "tx", "98765432", "B",
                            "10.42.0.12,", "fd00::12"]
    assert lines[-1] == "metrics_collector: ok"


def test_human_form_marks_missing_figures_and_lists_reasons(capsys, tmp_path):
    root = copy_case(tmp_path, "v2_root")
    os.unlink(os.path.join(root, "proc/loadavg"))
    os.unlink(os.path.join(root, "proc/net/dev"))
    code, out, _ = run(capsys, *fixture_args(root))
    assert code == 0
    assert "cpu       n/a" in out and "network   n/a" in out
    assert "metrics_collector: degraded" in out
    assert f"  - cpu: no {root}/proc/loadavg" in out


@pytest.mark.parametrize("flag", ["--proc-root", "--cgroup-root", "--persistent-dir", "--sys-root"])
def test_a_root_that_is_not_a_directory_is_a_usage_error(capsys, tmp_path, flag):
    code, out, err = run(capsys, flag, str(tmp_path / "missing"))
    assert code == 2
    assert out == ""
    assert f"{flag} {tmp_path / 'missing'}: not a directory" in err


def test_persistent_dir_defaults_to_the_environment(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("CLAWMANAGER_AGENT_PERSISTENT_DIR", str(tmp_path))
    monkeypatch.setenv("CALDERA_RUNTIME_TYPE", "myruntime")
    root = case_root("v2_root")
    code, out, _ = run(capsys, "--json", "--proc-root", f"{root}/proc",
                       "--cgroup-root", f"{root}/sys/fs/cgroup")
    info = json.loads(out)["system_info"]
    assert info["disk"]["mount_path"] == str(tmp_path)
    assert (info["runtime_type"], info["runtime_name"]) == ("myruntime", "myruntime")


def _quota_case(tmp_path):
    root = copy_case(tmp_path, "v1_limits")
    group = f"{root}/sys/fs/cgroup/cpu,cpuacct/docker/abc"
    with open(f"{group}/cpu.cfs_quota_us", "w") as fh:
        fh.write("250000\n")  # 2.5 cores
    with open(f"{root}/sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus", "w") as fh:
        fh.write("0-7\n")
    with open(f"{root}/sys/devices/system/cpu/online", "w") as fh:
        fh.write("0-7\n")
    return root


def _cpu(capsys, *argv):
    code, out, _ = run(capsys, "--json", *argv)
    assert code == 0
    doc = json.loads(out)
    return doc["system_info"].get("cpu", {}), doc["health"]["metrics_collector_reasons"]


def test_every_figure_comes_from_the_roots_given_cpu_count_included(capsys, tmp_path):
    root = _quota_case(tmp_path)
    cpu, _ = _cpu(capsys, *fixture_args(root))
    assert cpu["online_cpus"] == 8 and cpu["quota_cores"] == 2.5 and cpu["cores"] == 2.5
    # --proc-root alone: the CPU count is the tree's (its sys/ beside proc/), not this host's.
    cpu, _ = _cpu(capsys, "--proc-root", f"{root}/proc", "--persistent-dir", f"{root}/persistent")
    assert cpu["online_cpus"] == 8


def test_cpu_count_from_the_trees_proc_stat_never_from_this_host(capsys, tmp_path):
    root = _quota_case(tmp_path)
    os.remove(f"{root}/sys/devices/system/cpu/online")
    with open(f"{root}/proc/stat", "w") as fh:
        fh.write("cpu  1 2 3 4\n" + "".join(f"cpu{n} 1 2 3 4\n" for n in range(3)) + "intr 0\n")
    cpu, _ = _cpu(capsys, *fixture_args(root))
    assert cpu["online_cpus"] == 3 and cpu["cores"] == 2.5
    os.remove(f"{root}/proc/stat")
    cpu, reasons = _cpu(capsys, *fixture_args(root))
    assert "online_cpus" not in cpu and cpu["cores"] == 2.5  # the quota still bounds; no host figure
    assert any("online" in r for r in reasons) and not any("os.cpu_count" in r for r in reasons)
