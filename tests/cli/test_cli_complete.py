"""Bash completion for real: bash sources packaging/bash-completion/caldera, sets COMP_WORDS and
COMP_CWORD, calls _caldera, and prints COMPREPLY; `caldera` on PATH is this checkout."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from core_helpers import install_agent

SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "bash-completion" / "caldera"

MANIFEST = """name: {name}
version: 1.0.0
runtime:
  type: adapter
  command: [python3, adapter.py]
  workdir: .
settings:
  schema:
    - {{ key: max_7d, label: Weekly limit, type: percent, min: 0.1, max: 1.0 }}
    - {{ key: note, label: Note, type: string, max_length: 200 }}
"""

# Records every call, so the test can count them.
ADAPTER = r"""
import json, sys
with open("calls.log", "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\n")
if sys.argv[1:] == ["log", "--list"]:
    print(json.dumps({"logs": ["runs", "errors", "rate-limits"]}))
elif sys.argv[1:] == ["status"]:
    print(json.dumps({"state": {"level": "ok", "label": "Ready"}}))
else:
    sys.exit(2)
"""


@pytest.fixture
def agents(caldera_env, tmp_path):
    pytest.importorskip("yaml")
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    dirs = [install_agent(caldera_env, name=n, manifest=MANIFEST.format(name=n)) for n in ("alpha", "beta")]
    for d in dirs:
        (d / "adapter.py").write_text(ADAPTER)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "caldera"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m caldera.cli \"$@\"\n")
    wrapper.chmod(0o755)
    return dirs, bindir


def complete(bindir, *words):
    """COMPREPLY after _caldera for `words` (the last is the word under the cursor)."""
    array = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    script = (f"source {SCRIPT}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
              "COMP_LINE=\"${COMP_WORDS[*]}\"; _caldera; printf '%s\\n' \"${COMPREPLY[@]}\"")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def calls(agent_dir) -> list[str]:
    log = agent_dir / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_commands_and_flags(agents):
    _, bindir = agents
    assert complete(bindir, "caldera", "st") == ["status"]
    assert set(complete(bindir, "caldera", "")) >= {"status", "pause", "settings", "log", "run", "plane", "demo"}
    assert "__complete" not in complete(bindir, "caldera", "")
    flags = complete(bindir, "caldera", "status", "--")
    assert {"--agent", "--json", "--watch", "--manifest", "--state-dir"} <= set(flags)
    assert complete(bindir, "caldera", "settings", "") == ["get", "set"]
    assert "--history-days" in complete(bindir, "caldera", "plane", "serve", "--h")
    assert complete(bindir, "caldera", "plane", "") == ["serve", "enqueue", "agents", "commands", "reports", "revision",
                                                                 "turn", "runs", "run"]


def test_agent_names_from_the_config_directory(agents):
    dirs, bindir = agents
    assert complete(bindir, "caldera", "status", "--agent", "") == ["alpha", "beta"]
    assert complete(bindir, "caldera", "pause", "--agent", "b") == ["beta"]
    assert all(calls(d) == [] for d in dirs)  # listing names asks no adapter


def test_log_names_with_one_adapter_call(agents):
    (alpha, beta), bindir = agents
    assert complete(bindir, "caldera", "log", "--agent", "alpha", "") == ["runs", "errors", "rate-limits"]
    assert complete(bindir, "caldera", "log", "--agent", "alpha", "r") == ["runs", "rate-limits"]
    assert calls(alpha) == ["log --list", "log --list"] and calls(beta) == []  # once per completion


def test_setting_keys_without_the_adapter(agents):
    (alpha, _), bindir = agents
    assert complete(bindir, "caldera", "settings", "set", "--agent", "alpha", "") == ["max_7d=", "note="]
    assert complete(bindir, "caldera", "settings", "--agent", "alpha", "set", "n") == ["note="]
    assert complete(bindir, "caldera", "settings", "set", "--agent", "alpha", "max_7d", "=", "") == []
    assert calls(alpha) == []


def test_nothing_breaks_on_a_broken_agent(agents):
    (alpha, _), bindir = agents
    (alpha / "caldera.agent.yaml").write_text("name: [broken\n")
    assert complete(bindir, "caldera", "log", "--agent", "alpha", "") == []
    assert complete(bindir, "caldera", "nosuchcommand", "") == []
