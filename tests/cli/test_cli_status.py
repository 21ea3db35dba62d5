"""`caldera status`: local, cheap, and it says how the connection is."""
import json
import os
import signal
import subprocess
import sys

import pytest
from core_helpers import BOOT, SECRET, install_agent
from daemon_helpers import Daemon, wait_for
from plane_helpers import heartbeats

PlaneServer = pytest.importorskip("caldera.plane.server").PlaneServer


def status(*extra):
    return subprocess.run([sys.executable, "-m", "caldera.cli", "status", "--agent", "demo", *extra],
                          capture_output=True, text=True, timeout=60)


def test_status_without_plane_or_daemon(caldera_env):
    install_agent(caldera_env)
    done = status("--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["agent_status"]["state"] == {"level": "ok", "label": "Ready"}
    assert doc["agent_status"]["gauges"][0]["used"] == 0.25
    assert doc["connection"]["last_successful"] == "never"
    assert doc["outbox"] == {"items": 0, "dropped": {}, "held_back": [], "rejected": 0}
    human = status()
    assert "Ready (ok)" in human.stdout and "[#####...............]  25%" in human.stdout
    # No state dir yet (install_agent makes none): not a bare "not running" (issue 36's review).
    assert "daemon: none with this state dir (it is not there), and no caldera run of agent demo" in human.stdout


def test_status_shows_the_drop_counters(caldera_env):
    install_agent(caldera_env)
    state_dir = caldera_env / "var" / "demo"
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(json.dumps({"drops": {"outbox": 3, "events": 0, "lanes": 1}}))
    doc = json.loads(status("--json").stdout)
    assert doc["outbox"]["dropped"] == {"outbox": 3, "events": 0, "lanes": 1}
    assert "dropped since the daemon started: events 0, lanes 1, outbox 3" in status().stdout


def test_status_imports_neither_requests_nor_jsonschema(caldera_env):
    install_agent(caldera_env)
    (caldera_env / "var" / "demo").mkdir()  # as caldera init makes it
    status()  # warms the manifest cache
    probe = ("import sys, runpy; sys.argv=['caldera','status','--agent','demo'];"
             "from caldera.cli import main; main(sys.argv[1:]);"
             "print('HEAVY', sorted(m for m in ('requests','jsonschema','yaml') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr


def test_status_shows_daemon_connection_and_no_secrets(caldera_env, tmp_path):
    plane = PlaneServer(str(tmp_path / "p.db"), tokens={BOOT: 7}, heartbeat_interval=1, poll_interval=1).start()
    install_agent(caldera_env, base_url=plane.url, instance_id=7)
    daemon = Daemon()
    try:
        wait_for(lambda: heartbeats(plane.store, 7), what="heartbeat")
        wait_for(lambda: json.loads(status("--json").stdout)["connection"].get("last_heartbeat_ok_at"),
                 what="connection recorded")
        done = status()
        assert f"daemon: running, pid {daemon.proc.pid}\n" in done.stdout
        assert "last heartbeat ok" in done.stdout
        assert "never" not in done.stdout.split("last heartbeat ok")[1].split("\n")[0]
        for text in (done.stdout, done.stderr):
            assert BOOT not in text and SECRET not in text
    finally:
        daemon.stop()
        plane.stop()


def test_status_masks_secrets_the_adapter_prints(caldera_env):
    config = install_agent(caldera_env)
    (config / "adapter.py").write_text(
        "import json\nprint(json.dumps({'state': {'level': 'ok', 'label': 'Ready'}, "
        f"'detail': 'using {SECRET} and Authorization: Bearer abcdefghijklmnop'}}))\n")
    for extra in ((), ("--json",)):
        done = status(*extra)
        assert done.returncode == 0, done.stderr
        assert SECRET not in done.stdout and "abcdefghijklmnop" not in done.stdout
        assert "[REDACTED]" in done.stdout


def test_status_shows_the_last_commands(caldera_env, tmp_path):
    plane = PlaneServer(str(tmp_path / "p.db"), tokens={BOOT: 7}, heartbeat_interval=1, poll_interval=1).start()
    install_agent(caldera_env, base_url=plane.url, instance_id=7)
    daemon = Daemon()
    try:
        ids = [plane.store.enqueue(7, t) for t in ("pause", "make_coffee")]
        wait_for(lambda: all(c["status"] in ("succeeded", "failed") for c in plane.store.commands(7)),
                 what="both commands finished")
        doc = json.loads(status("--json").stdout)
        assert [(c["id"], c["status"]) for c in doc["commands"]] == [(ids[1], "failed"), (ids[0], "succeeded")]
        text = status().stdout
        assert f"#{ids[0]} pause succeeded" in text
        assert f"#{ids[1]} make_coffee failed" in text and "unsupported command type: make_coffee" in text
    finally:
        daemon.stop()
        plane.stop()


def _watch(stdout, **kw):
    return subprocess.Popen([sys.executable, "-m", "caldera.cli", "status", "--agent", "demo", "--watch", "0.2"],
                            stdout=stdout, stderr=subprocess.PIPE, start_new_session=True, **kw)


def _collect(fd, sink: list):
    """Read fd until EOF (or EIO, a pty's end) into sink, on a thread."""
    import threading

    def pump():
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return
            if not chunk:
                return
            sink.append(chunk)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def test_watch_without_a_terminal_prints_successive_blocks(caldera_env):
    install_agent(caldera_env)
    proc = _watch(subprocess.PIPE)
    sink: list[bytes] = []
    reader = _collect(proc.stdout.fileno(), sink)
    try:
        wait_for(lambda: b"".join(sink).count(b"--- ") >= 3, timeout=60, what="three blocks")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    reader.join(10)
    proc.stdout.close()
    text = b"".join(sink).decode()
    assert "\x1b" not in text  # no terminal codes in a log or a pipe
    blocks = [b for b in text.split("--- ")[1:]]
    for block in blocks[:3]:
        assert "agent demo: Ready (ok)" in block and "[#####...............]  25%" in block
        assert "connection: no heartbeat has succeeded yet" in block and "commands: none yet" in block
    assert "Traceback" not in proc.stderr.read().decode()
    proc.stderr.close()


def test_watch_on_a_terminal_redraws_in_place(caldera_env):
    import pty

    install_agent(caldera_env)
    master, slave = pty.openpty()
    proc = _watch(slave)
    os.close(slave)
    sink: list[bytes] = []
    reader = _collect(master, sink)
    try:
        wait_for(lambda: b"".join(sink).count(b"\x1b[H") >= 3, timeout=60, what="three redraws")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    reader.join(10)
    os.close(master)
    proc.stderr.close()
    screen = b"".join(sink).decode()
    assert screen.startswith("\x1b[2J\x1b[H")  # cleared once, then each frame starts at home
    frame = screen.split("\x1b[H")[2]
    assert "agent demo: Ready (ok)\x1b[K" in frame and frame.rstrip().endswith("\x1b[J")
    assert "--- " not in screen and "Ctrl-C ends" in frame


def test_watch_refuses_a_nonsense_interval(caldera_env):
    install_agent(caldera_env)
    done = status("--watch", "0")
    assert done.returncode == 2 and "--watch" in done.stderr


def test_status_shows_held_back_and_rejected_outbox_items(caldera_env):
    from caldera.protocol.outbox import Outbox

    install_agent(caldera_env)
    outbox = Outbox(caldera_env / "var" / "demo" / "outbox")
    name = outbox.put("finish", {"command_id": 12, "body": {"status": "failed"}})
    outbox.hold(name, {"kind": "finish", "command_id": 12, "body": {}}, "HTTP 500: Data too long for column", 60)
    outbox.reject(outbox.put("finish", {"command_id": 13, "body": {}}), "HTTP 404: instance command not found")
    doc = json.loads(status("--json").stdout)
    [held] = doc["outbox"]["held_back"]
    assert held["command_id"] == 12 and held["attempts"] == 1 and "Data too long" in held["reason"]
    assert doc["outbox"]["rejected"] == 1
    human = status().stdout
    assert "held back: finish of command 12, 1 tries" in human and "1 rejected for good" in human

def test_status_shows_the_installed_and_the_effective_manifest(caldera_env):
    from core_helpers import Args

    from caldera.agents import updates
    from caldera.agents.manifest import load_manifest
    from caldera.config import agent_from_args

    install_agent(caldera_env)
    done = json.loads(status("--json").stdout)
    assert done["manifest"]["effective"] == {"source": "installed", "revision_id": None,
                                             "version": done["manifest"]["installed"]["version"]}
    paths = agent_from_args(Args(agent="demo"))
    doc = dict(load_manifest(paths.manifest_path).doc, version="2.0.0")
    updates.write(paths, updates.record_for(doc, 42))
    done = json.loads(status("--json").stdout)
    assert done["manifest"]["effective"] == {"source": "update", "revision_id": 42, "version": "2.0.0"}
    assert "in effect: update 2.0.0 from config revision 42" in status().stdout


def test_status_names_the_skill_dirs_the_scan_takes(caldera_env, tmp_path):
    """The dirs as the daemon reads them (secrets.env included), each once, a relative entry
    named as left out; the same list `caldera skills` scans."""
    config = install_agent(caldera_env)
    mine = tmp_path / "mine"
    mine.mkdir()
    with open(config / "secrets.env", "a") as fh:
        fh.write(f"CALDERA_SKILL_DIRS={mine}:{mine}/:relative/dir:{tmp_path}/gone\n")
    doc = json.loads(status("--json").stdout)["skills"]
    assert doc["discovered"] == [{"path": str(mine), "exists": True}, {"path": f"{tmp_path}/gone", "exists": False}]
    assert doc["left_out"] == ["relative/dir"] and doc["from"] == "CALDERA_SKILL_DIRS" and "unread" not in doc
    human = status().stdout
    assert (f"; {mine}, {tmp_path}/gone (not there) (CALDERA_SKILL_DIRS); left out (not absolute): relative/dir"
            in human), human
    scanned = json.loads(subprocess.run([sys.executable, "-m", "caldera.cli", "skills", "--agent", "demo", "--json"],
                                        capture_output=True, text=True, timeout=60, check=True).stdout)
    assert any("'relative/dir' is not an absolute path" in p for p in scanned["problems"])
