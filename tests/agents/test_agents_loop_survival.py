"""No loop thread dies of an exception (issue 26), process mode's loops: the supervisor, the
control socket's accept loop, the agent log pump's reader and writer. Each test injects errors
into the loop's body, lets it behave, and checks the thread goes on doing its job."""
import os
import threading
import types

from fault_inject_helpers import Faulty
from process_helpers import kill_quietly, make_process_agent, wait_for

from caldera.agents.manifest import load_manifest
from caldera.agents.process import control
from caldera.agents.process.driver import open_process_driver
from caldera.agents.process.logpump import LogPump
from caldera.host.statefile import StateFile
from caldera.redact import Redactor

WAIT = 30.0


def test_supervisor_survives_a_failing_boot_and_turns_then_runs_the_agent(tmp_path, caplog):
    """state.json on a full disk during boot (a survivor's record): before, the OSError ended the
    supervisor thread, and the agent was never started. A turn that raises was logged every 0.25 s."""
    paths = make_process_agent(tmp_path, "run")
    driver = open_process_driver(paths, load_manifest(paths.manifest_path),
                                 state=StateFile(paths.state_dir / "state.json"), redactor=Redactor([]),
                                 report_interval=5.0, environ={"TZ": "UTC"})
    sup = driver.supervisor
    sup.boot = Faulty(sup.boot, times=2)
    sup.step = Faulty(sup.step, times=2, error=lambda: RuntimeError("a bug in a turn"))
    stop = threading.Event()
    thread = threading.Thread(target=driver.supervise, args=(stop,), name="supervisor", daemon=True)
    thread.start()
    try:
        pid = wait_for(sup.pid, "the agent started after the faults", timeout=WAIT)
        assert sup.boot.calls == 3 and sup.step.calls >= 3 and thread.is_alive()
    finally:
        stop.set()
        thread.join(WAIT)
        if sup.pid() is not None:
            kill_quietly(sup.pid())
    assert not thread.is_alive() and pid is not None
    assert caplog.text.count("Traceback") == 2  # one per distinct error, not one per turn


class FakeDriver:
    def status_body(self):
        return {"state": {"level": "ok", "label": "Running"}}, {"status": "running"}


def test_control_socket_survives_a_client_thread_that_cannot_start(tmp_path, monkeypatch):
    """No thread to be had (RuntimeError: can't start new thread): before, the accept loop
    died and every later `caldera status` hung until its timeout."""
    real = threading.Thread
    refusals = {"left": 2}

    def thread(*args, name=None, **kwargs):
        if name == "control-client" and refusals["left"] > 0:
            refusals["left"] -= 1
            raise RuntimeError("can't start new thread")
        return real(*args, name=name, **kwargs)

    monkeypatch.setattr(control, "threading", types.SimpleNamespace(**{**vars(threading), "Thread": thread}))
    server = control.ControlServer(FakeDriver(), tmp_path, Redactor([]))
    server.start()
    answers = []

    def ask():
        try:
            answers.append(control.call(tmp_path, "status", timeout=5.0))
        except Exception:  # the refused connections end without an answer
            return False
        return True

    try:
        wait_for(ask, "an answer after the refused connections", timeout=WAIT)
        assert refusals["left"] == 0
        assert answers[-1]["ok"] is True and answers[-1]["process"] == {"status": "running"}
    finally:
        server.close()


def test_log_pump_writer_counts_what_a_full_disk_lost_and_writes_again(tmp_path):
    """A write that fails (ENOSPC) loses its chunk: before, silently; now counted, and said in the
    log once the disk takes writes again."""
    path = tmp_path / "agent.log"
    pump = LogPump(path)
    pump.file.write = Faulty(pump.file.write, times=2)
    try:
        pump.note("lost one")
        wait_for(lambda: pump.file.write.calls >= 1, "the first write tried")
        pump.note("lost two")
        wait_for(lambda: pump.file.write.calls >= 2, "the second write tried")
        pump.note("kept")
        wait_for(lambda: path.exists() and b"kept" in path.read_bytes(), "a write after the faults", timeout=WAIT)
    finally:
        pump.close(timeout=WAIT)
    text = path.read_text()
    assert "bytes of agent output dropped" in text and "lost" not in text
    assert pump.dropped_total == len(b"[caldera] lost one\n") + len(b"[caldera] lost two\n")


def test_log_pump_reader_keeps_draining_after_an_error(tmp_path):
    """A bug while queueing a chunk ended the reader before: the pipe was closed under the agent."""
    path = tmp_path / "agent.log"
    pump = LogPump(path)
    pump._put = Faulty(pump._put, times=1, error=lambda: RuntimeError("a bug"))
    read, write = os.pipe()
    reader = pump.attach(os.fdopen(read, "rb"))
    try:
        os.write(write, b"first\n")
        wait_for(lambda: pump._put.calls >= 1, "the first chunk read")
        os.write(write, b"second\n")
        wait_for(lambda: path.exists() and b"second" in path.read_bytes(), "the next chunk written", timeout=WAIT)
        assert reader.is_alive()
    finally:
        os.close(write)
        reader.join(WAIT)
        pump.close(timeout=WAIT)
    assert not reader.is_alive()  # it ends with its pipe, as before
    assert pump.dropped_total == len(b"first\n")
