"""The small shared objects of the daemon: lanes after close, drop counters, the final
report, the error taxonomy as the CLI and the loops see it."""
import threading

import pytest
from core_helpers import install_agent, make_parts
from fault_helpers import API

from caldera import errors
from caldera.cli import main as cli_main
from caldera.daemon import run as daemon_run
from caldera.daemon.lanes import Lanes, LanesClosed
from caldera.daemon.life import life_for
from caldera.protocol import client as api
from caldera.protocol.command import parse_command
from caldera.protocol.retry import Backoff

BASE = "http://127.0.0.1:9"  # nothing listens: a test that talks to a plane asks for the `wire` fixture's


@pytest.fixture
def parts(caldera_env, request):
    install_agent(caldera_env, base_url=request.getfixturevalue("wire").url if "wire" in request.fixturenames else BASE)
    built = make_parts(with_driver=False)
    yield built
    built.pool.shutdown(wait=False)


def test_submit_after_close_raises_and_is_counted(parts):
    lanes = Lanes(life_for(parts), on_idle=lambda: None)
    parts.live.count_drops("lanes", lambda: lanes.refused)
    lanes.start()
    assert lanes.close(timeout=5)
    with pytest.raises(LanesClosed):
        lanes.submit(parse_command({"id": 1, "command_type": "collect_system_info"}))
    assert lanes.refused == 1
    assert parts.live.drops()["lanes"] == 1


def test_desired_revision_after_close_is_not_lost_for_the_next_try(parts):
    lanes = Lanes(life_for(parts), on_idle=lambda: None)
    lanes.start()
    lanes.close(timeout=5)
    lanes.desired_revision(42)  # refused quietly: the lanes are closed
    assert 42 not in lanes._desired_seen  # a later runtime (or a reopened lane) sees it again


def test_an_unusable_desired_revision_is_ignored_with_one_line(parts, caplog):
    """A list or an object as desired_config_revision_id (unhashable) used to raise in the
    lanes' seen-set at every heartbeat; a numeric string is the revision it spells."""
    from caldera.daemon.heartbeat import send_heartbeat

    answers = []

    class Plane:
        def heartbeat(self, body):
            return {"desired_config_revision_id": answers.pop(0)}

    seen = set()  # as Lanes.desired_revision keeps them: hashed
    answers += [["unusable", 1], ["unusable", 1], {"id": 3}, "7", 8, True, "-1"]
    for _ in range(len(answers)):
        send_heartbeat(Plane(), parts.reports, parts.state, parts.wake, seen.add)
    assert seen == {7, 8}
    lines = [r.getMessage() for r in caplog.records if "desired_config_revision_id" in r.getMessage()]
    assert lines == ["ignoring the heartbeat's desired_config_revision_id ['unusable', 1]: not a revision id",
                     "ignoring the heartbeat's desired_config_revision_id {'id': 3}: not a revision id",
                     "ignoring the heartbeat's desired_config_revision_id True: not a revision id",
                     "ignoring the heartbeat's desired_config_revision_id '-1': not a revision id"]
    parts.state.set("current_config_revision_id", 9)
    answers += ["9"]
    send_heartbeat(Plane(), parts.reports, parts.state, parts.wake, seen.add)
    assert 9 not in seen  # the one in effect, though spelled as a string


def test_drop_counters_reach_the_report_health_and_state_json(parts, wire):  # no route: no request may go out
    parts.outbox.max_items = 1
    parts.outbox.put("inventory", {"body": {}})
    parts.outbox.put("inventory", {"body": {}})  # the older inventory is dropped to keep the bound
    report = parts.reports.state_report()
    assert report["health"]["dropped"] == {"events": 0, "outbox": 1}
    assert parts.state.get("drops") == {"events": 0, "outbox": 1}


class RunningDriver:
    def report_section(self):
        return {"runtime": {"openclaw_status": "running", "openclaw_pid": None, "openclaw_version": "1",
                            "runtime_status": "running"}, "health": {}, "agent_status": None,
                "settings": None, "controls": []}


def test_final_report_after_sigterm_says_stopping(parts, wire):
    parts.current.replace(driver=RunningDriver())
    parts.reports.section()  # the agent said "running" in the last report
    wire.route("POST", API + "/register", json={"success": True, "data": {"session_token": "agt_sess_x1"}})
    wire.route("POST", API + "/state/report", json={"success": True})
    daemon_run._final_flush(parts, __import__("time").monotonic() + 10)
    [call] = wire.seen(r"/state/report$")
    assert call.json()["runtime"]["runtime_status"] == "stopping"


def test_final_report_asks_the_declared_interface_not_an_attribute(parts, wire):
    """Only a ProcessDriver gets a fresh section at the stop; an adapter-mode driver that
    happens to have a `supervise` attribute is not mistaken for one."""
    class LooksSupervised(RunningDriver):
        supervise = None
        asked = 0

        def report_section(self):
            self.asked += 1
            return super().report_section()

    driver = LooksSupervised()
    parts.current.replace(driver=driver)
    parts.reports.section()  # the last report's section, which the final report repeats
    wire.route("POST", API + "/register", json={"success": True, "data": {"session_token": "agt_sess_x1"}},
               required=False)
    wire.route("POST", API + "/state/report", json={"success": True}, required=False)
    daemon_run._final_flush(parts, __import__("time").monotonic() + 10)
    assert driver.asked == 1  # not asked again at the stop


def test_current_replace_takes_only_its_three_parts(parts):
    settings = parts.current.settings
    parts.current.replace(manifest=None, driver=RunningDriver())
    assert parts.current.settings is settings and parts.current.manifest is None  # not given: kept
    parts.current.replace(driver=None)
    assert parts.current.driver is None and parts.current.settings is settings  # None is a value
    with pytest.raises(TypeError):
        parts.current.replace(drvier=None)  # a typo is refused, never set beside the real one
    with pytest.raises(AttributeError):
        parts.current.drvier = None  # slots: no attribute appears by accident


def test_protocol_errors_are_kinds_of_the_one_taxonomy():
    assert isinstance(api.Retryable(503, "down", 7), errors.Retryable)
    assert isinstance(api.Forbidden(403, "no"), errors.Refused)
    assert isinstance(api.NotFound(404, "gone"), errors.Refused)
    assert isinstance(api.Invalid(400, "bad"), errors.Refused)
    from caldera.protocol.session import AuthBlocked
    assert AuthBlocked is errors.AuthBlocked


def test_one_retry_policy_reads_every_kind_of_hint():
    rng = __import__("random").Random(1)
    assert Backoff(rng=rng).after(api.Retryable(429, "slow down", 120)) == 120
    assert Backoff(rng=rng).after(errors.AuthBlocked("bad token", 300)) == 300
    assert Backoff(rng=rng).after(ValueError("a bug")) <= 1.2  # no hint: the first step


def test_cli_exit_code_follows_the_kind(monkeypatch, capsys):
    from caldera.cli import sample

    def refuse(args):
        raise errors.Refused("the agent said no")

    def config(args):
        raise errors.ConfigError("CALDERA_BASE_URL: not a URL")

    def later(args):
        raise errors.Retryable("the plane is away", 30)

    for raiser, code, text in ((refuse, 1, "the agent said no"), (config, 2, "CALDERA_BASE_URL"),
                               (later, 1, "try again later")):
        monkeypatch.setattr(sample, "main", raiser)
        assert cli_main(["sample"]) == code
        assert text in capsys.readouterr().err


def test_wakeups_shutdown_ends_every_wait():
    from caldera.daemon.wakeups import Wakeups, wait_any

    wake = Wakeups()
    done = threading.Event()

    def waiter():
        wait_any(wake.stop, wake.report, 60)
        done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    wake.shutdown()
    thread.join(5)
    assert done.is_set() and wake.stop.is_set()


def test_exit_guard_ends_a_process_held_at_exit_and_says_where(tmp_path):
    """A non-daemon thread that never ends would hold the interpreter's exit for ever:
    the guard dumps every thread's stack and exits 0."""
    import subprocess
    import sys

    script = ("import threading, time\n"
              "from caldera.daemon.run import arm_exit_guard\n"
              "threading.Thread(target=threading.Event().wait, name='stuck-worker').start()\n"
              "arm_exit_guard(0.5)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "still running 0.5 s after stopping" in done.stderr
    assert "Thread 0x" in done.stderr  # faulthandler's dump of every thread


def _notify_listener(tmp_path, monkeypatch):
    import socket

    path = str(tmp_path / "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    listener.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    return listener


def _drain(listener):
    messages = []
    listener.setblocking(False)
    while True:
        try:
            messages.append(listener.recv(4096).decode())
        except BlockingIOError:
            return messages


class _Server:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_a_long_agent_stop_keeps_asking_systemd_for_more_time(tmp_path, monkeypatch):
    # TimeoutStopSec=90s, stop_timeout_seconds up to 300: while the agent stops, the daemon
    # extends the unit's stop timeout, then asks once for the rest of its own stop.
    listener = _notify_listener(tmp_path, monkeypatch)
    monkeypatch.setattr(daemon_run, "EXTEND_EVERY", 0.05)
    stop, seen, server = threading.Event(), [], _Server()

    def agent_stopping():  # ends only after the daemon asked twice: no timing in the test
        stop.wait()
        seen.extend(listener.recv(4096).decode() for _ in range(2))

    thread = threading.Thread(target=agent_stopping)
    thread.start()
    daemon_run.stop_agent_supervisor((stop, thread, server, lambda: 60.0))
    messages = seen + _drain(listener)
    listener.close()
    assert server.closed and not thread.is_alive()
    assert len(messages) >= 3 and set(messages[:-1]) == {"EXTEND_TIMEOUT_USEC=30000000"}
    assert messages[-1] == f"EXTEND_TIMEOUT_USEC={int(daemon_run.REST_OF_STOP * 1_000_000)}"
    assert daemon_run.REST_OF_STOP >= daemon_run.DRAIN_GRACE + daemon_run.STOP_BUDGET + daemon_run.EXIT_GUARD


def test_an_agent_stop_that_never_ends_stops_asking_and_says_so(tmp_path, monkeypatch, caplog):
    # A supervisor stuck for good (a child the kernel never lets go) must not make the unit
    # unkillable: past the bound the daemon stops extending and goes on with its own stop.
    listener = _notify_listener(tmp_path, monkeypatch)
    monkeypatch.setattr(daemon_run, "EXTEND_EVERY", 0.05)
    stop, stuck, server = threading.Event(), threading.Event(), _Server()
    thread = threading.Thread(target=stuck.wait, daemon=True)
    thread.start()
    try:
        daemon_run.stop_agent_supervisor((stop, thread, server, lambda: 0.3))
        assert thread.is_alive() and server.closed
        messages = _drain(listener)
        assert messages[-1] == f"EXTEND_TIMEOUT_USEC={int(daemon_run.REST_OF_STOP * 1_000_000)}"
        assert "did not end within" in caplog.text and thread.name in caplog.text
        assert daemon_run.agent_stop_limit(300) >= 2 * 300  # a verb's stop, then the runtime's own
    finally:
        stuck.set()
        listener.close()


def test_a_start_whose_recovery_fails_ends_its_lanes_and_raises(parts, monkeypatch):
    """A start that fails after the lanes began (recovery reading or writing the journal) must
    end the process with its error: the lanes' threads are not daemon threads, and left running
    they held `caldera run` forever, deaf to SIGTERM (the soak's full disk at a restart)."""
    from caldera.daemon.life import Life
    from caldera.daemon.signals import Signals

    def recover(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Life, "recover", recover)
    with pytest.raises(OSError, match="No space"):
        daemon_run._run_connected(parts, Signals())
    assert not [t.name for t in threading.enumerate() if t.name.startswith("lane-") and t.is_alive()]


class _Held:
    def __init__(self, said: list[str]) -> None:
        self.said = said

    def close(self) -> None:
        self.said.append("servers closed")


class _Hup:
    """A SIGHUP whose reload changed the configuration: the daemon restarts in place."""
    count = 0

    def wait(self, timeout: float) -> None:
        pass

    def take_hup(self) -> bool:
        return True

    def hold(self) -> bool:
        return True


def test_the_backends_servers_close_after_the_lanes_and_before_a_restart_in_place(parts, monkeypatch):
    """OpenCode's server (what the backends keep between runs) outlives no daemon: closed once
    the lanes are done, alongside the loops' stop, and before the restart in place (exec keeps
    the pid, and a server whose owner's pid still runs is never removed as a leftover)."""
    said: list[str] = []
    made = parts.servers.get("opencode", lambda runs_dir: _Held(said))
    assert isinstance(made, _Held) and parts.servers.runs_dir == str(parts.paths.state_dir / "runs")
    monkeypatch.setattr(daemon_run, "_reread", lambda parts: True)
    monkeypatch.setattr(daemon_run, "start_threads", lambda parts, lanes, executor: [])
    monkeypatch.setattr(daemon_run, "_drain", lambda lanes, signals, abort: (lanes.close(5.0), said.append("drained")))
    stopping = threading.Event()

    def stop_loops(parts, threads, stop_by):
        said.append("loops stopping")
        stopping.set()

    monkeypatch.setattr(daemon_run, "_stop", stop_loops)
    monkeypatch.setattr(_Held, "close", lambda self: (stopping.wait(10), said.append("servers closed")))
    assert daemon_run._run_connected(parts, _Hup()) == daemon_run.REEXEC
    # the servers stop while the loops do (one budget), and are gone when run() returns REEXEC
    assert said == ["drained", "loops stopping", "servers closed"]
    assert parts.servers.get("opencode", lambda runs_dir: _Held(said)) is None  # no run gets it after


def test_a_server_that_fails_to_close_does_not_stop_the_stop_sequence(parts, caplog):
    from caldera.daemon.wiring import close_servers

    class Broken:
        def close(self) -> None:
            raise OSError("gone")

    parts.servers.get("opencode", lambda runs_dir: Broken())
    close_servers(parts)
    assert "stopping the backends' servers failed" in caplog.text


def test_the_daemons_start_sweeps_what_a_runtime_killed_mid_run_left(parts):
    """Once, under the state lock, before anything else starts (a stop asked during start-up
    included): a run dir whose owner is gone (Codex's held a copy of auth.json) is removed."""
    import signal
    import subprocess
    import sys

    from caldera.backends import leftovers
    from caldera.daemon.signals import Signals
    from caldera.host import proc

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = proc.proc_stat(child.pid)
    child.wait()
    stale = parts.paths.state_dir / "runs" / "run-of-a-dead-runtime"
    (stale / "codex-home").mkdir(parents=True)
    (stale / "codex-home" / "auth.json").write_text('{"token": "x"}')
    (stale / leftovers.OWNER).write_text(f"{child.pid} {started['start_time'] if started else 0}\n")
    signals = Signals()
    signals._stop(signal.SIGTERM, None)  # a stop asked during start-up: nothing else starts
    assert daemon_run.run(parts, signals) == 0
    assert not stale.exists()
