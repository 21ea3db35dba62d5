"""host/procscan: the caldera runtimes /proc shows, matched to an agent by its flags, its
manifest (relative to the process's cwd) and its state dir (from --state-dir, beside the
manifest, or its environment's CALDERA_STATE_DIR). A fake /proc: cmdline, cwd, environ."""
import os
from pathlib import Path

from caldera.config import AgentPaths
from caldera.host import procscan


def _proc(root, pid, argv, cwd=None, environ=None):
    entry = root / str(pid)
    entry.mkdir(parents=True)
    (entry / "cmdline").write_bytes(b"".join(word.encode() + b"\0" for word in argv))
    if cwd is not None:
        os.symlink(cwd, entry / "cwd")
    if environ is not None:
        (entry / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))


def test_the_command_lines_of_a_runtime():
    assert procscan.command_words(["/v/bin/python3", "/v/bin/caldera", "run", "--agent", "a"]) == (
        "run", ["--agent", "a"])
    assert procscan.command_words(["python3", "-m", "caldera.cli", "report", "--once"]) == ("report", ["--once"])
    assert procscan.command_words(["caldera", "status"]) is None
    assert procscan.command_words(["python3", "caldera.cli", "run"]) is None  # not -m
    assert procscan.agent_flags(["--agent=a", "--state-dir", "/s", "--manifest"]) == {"agent": "a", "state_dir": "/s"}


def test_a_manifest_runtime_elsewhere_is_found_with_its_state_dir(tmp_path):
    agent = tmp_path / "co" / "iw"
    agent.mkdir(parents=True)
    (agent / "caldera.agent.yaml").write_text("name: iw\n")
    proc = tmp_path / "proc"
    _proc(proc, 11, ["python3", "/v/bin/caldera", "run", "--manifest", "iw"], cwd=agent.parent)
    _proc(proc, 12, ["python3", "/v/bin/caldera", "run", "--manifest", "other"])  # relative, cwd unseen: skipped
    _proc(proc, 13, ["bash"])
    mine = AgentPaths("iw", agent, agent / "caldera.agent.yaml", tmp_path / "st")
    found = procscan.runtime_elsewhere(mine, proc_root=str(proc))
    assert found.pid == 11 and found.state_dir == str(agent / ".caldera-state" / "iw")
    assert procscan.naming(mine, found) == "no --state-dir: the default, beside the manifest"
    here = AgentPaths("iw", agent, agent / "caldera.agent.yaml", agent / ".caldera-state" / "iw")
    assert procscan.runtime_elsewhere(here, proc_root=str(proc)) is None  # the lock answers for that one


def test_an_installed_runtime_is_matched_by_name_and_config_dir(tmp_path):
    config = tmp_path / "cfg" / "agents" / "ta"
    config.mkdir(parents=True)
    proc = tmp_path / "proc"
    _proc(proc, 21, ["/usr/bin/python3", "/usr/bin/caldera", "run", "--agent", "ta"],
          environ={"CALDERA_CONFIG_DIR": str(tmp_path / "cfg"), "CALDERA_STATE_DIR": "/srv/st", "TOKEN": "x"})
    _proc(proc, 22, ["/usr/bin/python3", "/usr/bin/caldera", "run", "--agent", "ta"],
          environ={"CALDERA_CONFIG_DIR": "/elsewhere"})  # another install's agent of the same name
    mine = AgentPaths("ta", config, config / "caldera.agent.yaml", tmp_path / "state" / "ta")
    found = procscan.runtime_elsewhere(mine, proc_root=str(proc))
    assert found.pid == 21 and found.state_dir == "/srv/st/ta"
    assert procscan.naming(mine, found) == "CALDERA_STATE_DIR=/srv/st"
    _proc(proc, 23, ["/usr/bin/caldera", "run", "--agent", "ta"])  # another user's: no environ to read
    (proc / "21").rename(proc / "x21")
    # Installed elsewhere than the default root: another user's runtime of the same name is not claimed.
    assert procscan.runtime_elsewhere(mine, proc_root=str(proc)) is None
    # Installed under the default root (the units systemd starts as the agent's account): it is.
    default = Path("/etc/caldera/agents/ta")
    packaged = AgentPaths("ta", default, default / "caldera.agent.yaml", tmp_path / "state" / "ta")
    unknown = procscan.runtime_elsewhere(packaged, proc_root=str(proc))
    assert unknown.pid == 23 and unknown.state_dir is None and procscan.naming(packaged, unknown) is None
