"""Journald priorities: `<N>` sd-daemon prefixes when stderr is the journal stream, plain text otherwise."""
import os
import signal
import subprocess
import sys

from core_helpers import install_agent
from daemon_helpers import wait_for

# Logs one record per level and an exception, through caldera's logging setup.
SCRIPT = """
import logging
from caldera.host import logsetup
from caldera.redact import Redactor
logsetup.setup("debug", Redactor(["canary-secret-42"]))
log = logging.getLogger("caldera.t")
log.debug("d")
log.info("i")
log.warning("w canary-secret-42")
log.error("e")
try:
    raise RuntimeError("bad")
except RuntimeError:
    log.exception("x")
log.critical("c")
"""


def _run(tmp_path, journal_stream):
    """Run SCRIPT with stderr a file; JOURNAL_STREAM: "self" = that file's dev:ino, else the value or unset."""
    err = tmp_path / "stderr"
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    with open(err, "wb") as fh:
        st = os.fstat(fh.fileno())
        if journal_stream == "self":
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        elif journal_stream is not None:
            env["JOURNAL_STREAM"] = journal_stream
        subprocess.run([sys.executable, "-c", SCRIPT], stderr=fh, env=env, check=True, timeout=60)
    return err.read_text().splitlines()


def test_priorities_when_stderr_is_the_journal(tmp_path):
    lines = _run(tmp_path, "self")
    assert lines[:4] == ["<7>DEBUG caldera.t: d", "<6>INFO caldera.t: i", "<4>WARNING caldera.t: w [REDACTED]",
                         "<3>ERROR caldera.t: e"]
    assert lines[4] == "<3>ERROR caldera.t: x"
    traceback = lines[5:-1]
    assert traceback[0] == "<3>Traceback (most recent call last):" and traceback[-1] == "<3>RuntimeError: bad"
    assert all(line.startswith("<3>") for line in traceback)  # every line keeps the record's priority
    assert lines[-1] == "<2>CRITICAL caldera.t: c"


def test_plain_text_elsewhere(tmp_path):
    other = tmp_path / "other"
    other.write_text("")
    st = os.stat(other)
    for stream in (None, f"{st.st_dev}:{st.st_ino}", "garbage", "1:"):  # unset, another file, malformed
        lines = _run(tmp_path, stream)
        assert lines[0] == "DEBUG caldera.t: d" and lines[2] == "WARNING caldera.t: w [REDACTED]", stream
        assert not any(line.startswith("<") for line in lines), stream


def test_caldera_run_warns_at_warning_priority(caldera_env, tmp_path):
    """The real daemon, control plane unreachable: its warnings are <4>, its progress <6>."""
    install_agent(caldera_env, base_url="http://127.0.0.1:9", extra_env="CALDERA_LOG_LEVEL=info\n")
    err = tmp_path / "daemon.stderr"
    with open(err, "wb") as fh:
        st = os.fstat(fh.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "run", "--agent", "demo"], stderr=fh,
                                stdout=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            wait_for(lambda: "<4>WARNING" in err.read_text(), timeout=30, what="a warning")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
    lines = err.read_text().splitlines()
    assert any(line.startswith("<6>INFO caldera.") and ": caldera run: agent demo" in line for line in lines)
    assert any(line.startswith("<4>WARNING caldera.") and "heartbeat failed" in line for line in lines)
    assert all(line[:3] in ("<3>", "<4>", "<6>") for line in lines), lines
