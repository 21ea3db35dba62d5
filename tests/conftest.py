"""Fixtures every area may use.

The areas mirror caldera's layers (tests/agents, tests/cli, tests/daemon, …). An area's
helpers (`*_helpers.py`) are importable by name from every area: the CLI tests drive the
daemon's, the plane's and the sampler's fixtures too.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
sys.path[:0] = sorted(str(d) for d in _TESTS.iterdir() if d.is_dir() and any(d.glob("*_helpers.py")))


def pytest_configure(config):
    """Warnings are errors (setup.cfg), with one exception scoped to a dependency set.

    urllib3 1.x (Debian 12's 1.26, `make test DEPS=debian12`) leaves the sockets of a
    connection pool open when the pool is garbage-collected, so a dropped requests Session
    (a test's client of the embedded plane; the runtime itself no longer uses requests) ends
    in the socket's own ResourceWarning at some later test. urllib3 2 closes them in a
    finalizer of the pool: with it (the newest set, Debian 13's 2.3) a socket left open is
    still an error. Added here, after setup.cfg's `error`, so that it wins."""
    import urllib3

    if int(urllib3.__version__.split(".")[0]) < 2:
        config.addinivalue_line("filterwarnings", "ignore:unclosed <socket.socket:ResourceWarning")


@pytest.fixture
def caldera_env(tmp_path, monkeypatch):
    """An empty config and state tree, with no caldera variables leaking in from the host."""
    for key in list(os.environ):
        if key.startswith(("CALDERA_", "CLAWMANAGER_")):
            monkeypatch.delenv(key)
    config, state = tmp_path / "etc", tmp_path / "var"
    (config / "agents").mkdir(parents=True)
    state.mkdir()
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(config))
    monkeypatch.setenv("CALDERA_STATE_DIR", str(state))
    return tmp_path


@pytest.fixture(scope="module")
def account():
    """An account that is not root, for real (tests/cli/unprivileged_helpers.py): `nobody`, or
    one made for the module (removed after it); the tests skip, saying why, without one."""
    from unprivileged_helpers import find_account

    found, made = find_account()
    if found is None:
        pytest.skip(made)
    yield found
    if made:
        subprocess.run(["userdel", made], capture_output=True, timeout=60)


# ------------------------------------------------------------ no process left behind

def _proc_table() -> dict:
    """pid -> (ppid, state) for every process /proc shows."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) "
        table[int(entry)] = (int(fields[1]), fields[0].decode())
    return table


def _mentions(pid: int, needle: bytes) -> bool:
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as fh:
                if needle in fh.read():
                    return True
        except OSError:
            pass  # gone, or another user's: not one of ours
    return False


def _leftovers(basetemp: Path) -> dict:
    """Live processes this session started: its descendants, and any process whose
    command line or environment names the session's temp dir (a daemon started in
    its own session, reparented to init when its parent exited)."""
    table = _proc_table()
    me, ours = os.getpid(), set()
    frontier = [me]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, (ppid, _) in table.items() if ppid == parent and pid not in ours]
        ours.update(kids)
        frontier.extend(kids)
    needle = str(basetemp).encode()
    ours.update(pid for pid in table if pid != me and _mentions(pid, needle))
    return {pid: _cmdline(pid) for pid in ours if table.get(pid, ("", "Z"))[1] not in ("Z", "X")}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return "?"


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind(tmp_path_factory):
    """After the whole session: no process a test started may still run. Each one found
    is named (its command line shows the test's temp dir), then killed, and the session
    fails: a process left behind keeps ports, locks and CPU, and hides a shutdown bug."""
    import signal
    import threading

    if not os.path.isdir("/proc/self"):
        yield
        return
    basetemp = tmp_path_factory.getbasetemp()
    yield
    left = _leftovers(basetemp)
    pause = threading.Event()
    for _ in range(50):  # a process may be in the middle of exiting: up to 5 s
        if not left:
            return
        pause.wait(0.1)
        left = _leftovers(basetemp)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    listing = "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in sorted(left.items()))
    pytest.fail(f"{len(left)} process(es) left behind by the tests (killed now):\n{listing}", pytrace=False)


@pytest.fixture
def wire():
    """A fake plane on 127.0.0.1 that answers only what the test registers (`wire.route(...)`,
    tests/protocol/fault_helpers.py): the client's real HTTP, whatever library it is built on.
    A request no route answered (599), or a route registered and never used (`required=False`
    says it may be), fails the test at the end."""
    from fault_helpers import FaultPlane

    plane = FaultPlane(strict=True).start()
    yield plane
    plane.stop()
    assert not plane.unmatched, "requests no route answered: " + ", ".join(
        f"{seen.method} {seen.path}" for seen in plane.unmatched)
    assert not plane.unfired(), f"routes never used: {plane.unfired()}"
