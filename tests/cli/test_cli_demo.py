"""`caldera demo` end to end: plane + example agent + `caldera run`, all on loopback."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "task-agent" / "caldera.agent.yaml"


def _demo(*args, timeout=240):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALDERA_", "CLAWMANAGER_"))}
    return subprocess.run([sys.executable, "-m", "caldera.cli", "demo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, start_new_session=True)


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="examples/task-agent is not in this checkout")
def test_demo_shows_what_the_plane_saw_and_exits_cleanly():
    done = _demo("--seconds", "1")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "online" in out and "caldera-1-main" in out
    for figure in ("CPU", "memory", "disk", "network"):
        assert f"  {figure}" in out
    for command in ("collect_system_info", "pause", "settings_set", "run_now"):
        line = next(line for line in out.splitlines() if line.strip().startswith("#") and command in line)
        assert "succeeded" in line, line
    assert "status page: http://127.0.0.1:" in out and "stopping" in out
    # the process-mode example beside it (instance 2): supervised, its pid on the plane
    assert "caldera-2-main" in out and re.search(r"^  process +pid ", out, re.M)
    # a gauge name is never cut to the column (it was "files wai"): the column fits it
    assert re.search(r"^  files waiting +\[", out, re.M), out
    line = next(line for line in out.splitlines() if "restart_openclaw" in line and line.strip().startswith("#"))
    assert "succeeded" in line and "Restarted (pid" in line


def test_demo_refuses_a_missing_blueprint(tmp_path):
    done = _demo("--once", "--blueprint", str(tmp_path / "nothing"), timeout=60)
    assert done.returncode == 2 and "no such file or directory" in done.stderr
