"""The package installs the bash completion, and caldera(1) and --help show `status --watch`."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_debian_installs_the_completion_under_its_command_name():
    lines = (ROOT / "debian" / "caldera.install").read_text().splitlines()
    assert "packaging/bash-completion/caldera usr/share/bash-completion/completions/" in lines
    script = (ROOT / "packaging" / "bash-completion" / "caldera").read_text()
    assert "complete -o default -F _caldera caldera" in script
    check = subprocess.run(["bash", "-n", str(ROOT / "packaging" / "bash-completion" / "caldera")],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr


def test_manpage_and_help_list_status_watch():
    page = subprocess.run([sys.executable, str(ROOT / "packaging" / "manpage.py")], cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "SOURCE_DATE_EPOCH": "1700000000", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=True).stdout
    status = page.split("\n.SS caldera status\n", 1)[1].split("\n.SS ", 1)[0]
    assert "\\fB\\-\\-watch\\fR \\fISECONDS\\fR" in status and "until Ctrl\\-C" in status
    assert "/usr/share/bash\\-completion/completions/caldera" in page and "JOURNAL_STREAM" in page
    top = subprocess.run([sys.executable, "-m", "caldera.cli", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60).stdout
    assert "(--watch)" in top.split("status", 1)[1].split("\n", 1)[0]
    sub = subprocess.run([sys.executable, "-m", "caldera.cli", "status", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60).stdout
    assert "--watch [SECONDS]" in sub
