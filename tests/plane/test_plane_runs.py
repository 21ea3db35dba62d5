"""Code-agent runs at the plane (issue 40): `caldera plane turn|runs|run`, the run's events kept
once per seq, replayed in order and followed, the run pages, the retention."""
import json
import subprocess
import sys
import threading
import time

import pytest
import requests
from plane_helpers import AGENT, BOOT, Agent, agent, clock, plane  # noqa: F401 -- the fixtures

from caldera.cli import main
from caldera.plane import runs as runs_mod
from caldera.plane.server import PlaneServer
from caldera.plane.store import Store

HOSTILE = '<script>alert("x")</script>'


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _ev(run_id, seq, type_, **data):
    return {"run_id": run_id, "seq": seq, "ts": "2026-12-05T10:00:00.000Z", "type": type_, "data": data}


def turn_events(run_id, status="completed", failure_kind=None):
    """A small turn as a backend tells it: the model's words, a command and its output, a file change, the diff."""
    end = {"status": status, "failure_kind": failure_kind}
    if status != "completed":
        end["message"] = "the provider timed out"
    return [_ev(run_id, 1, "backend_status", phase="turn_started"),
            _ev(run_id, 2, "assistant_message", text=f"I will run the tests {HOSTILE}"),
            _ev(run_id, 3, "tool_call", tool="command", command="make test", status="started"),
            _ev(run_id, 4, "command_output", command="make test", status="completed", exit_code=0,
                duration_ms=1200, output="ok: 12 passed\n\x1b[31mred\x1b[0m"),
            _ev(run_id, 5, "tool_call", tool="file_change", status="completed",
                changes=[{"path": "src/app.py", "kind": "update"}]),
            _ev(run_id, 6, "diff", diff="--- a/src/app.py\n+++ b/src/app.py\n@@\n-x = 1\n+x = 2\n", bytes=52),
            _ev(run_id, 7, "terminal_status", **end)]


def _queue(capsys, plane_, *extra):
    code, out, err = _cli(capsys, "plane", "turn", "--db", str(plane_.store.path), "--instance", "1",
                          "--workspace", "/srv/ws", *extra, f"fix the build {HOSTILE}")
    assert code == 0, err
    return out.splitlines()[0]


def _take(agent_, run_id, events, batches=2):
    """The agent's side: fetch, start, post the events in `batches` (the first again: a lost answer), finish."""
    command = agent_.next()
    assert command["command_type"] == "agent_run" and command["payload"]["run_id"] == run_id
    agent_.start(command["id"])
    size = -(-len(events) // batches)
    chunks = [events[i:i + size] for i in range(0, len(events), size)]
    for chunk in [chunks[0], *chunks]:
        resp = agent_.post(f"/runs/{run_id}/events", {"agent_id": AGENT, "events": chunk})
        assert resp.status_code == 200, resp.text
    end = events[-1]["data"]
    result = {"run_id": run_id, "status": end["status"], "failure_kind": end["failure_kind"],
              "events_total": len(events), "events": events[-50:]}
    agent_.finish(command["id"], "succeeded" if end["status"] == "completed" else "failed", result=result)
    return command


def test_turn_queues_an_agent_run_and_runs_lists_it_with_the_count_of_the_finish(plane, agent, capsys):
    run_id = _queue(capsys, plane, "--backend", "claude-code", "--timeout", "120")
    assert run_id.startswith("run-")
    command = plane.store.commands(1)[-1]
    assert command["payload"] == {"run_id": run_id, "prompt": f"fix the build {HOSTILE}", "workspace": "/srv/ws",
                                  "backend_profile": "claude-code", "execution_policy": {"timeout_seconds": 120}}
    assert command["timeout_seconds"] == 180
    code, out, _ = _cli(capsys, "plane", "runs", "--db", str(plane.store.path), "--instance", "1")
    assert code == 0 and run_id in out and "queued" in out
    _take(agent, run_id, turn_events(run_id))
    code, out, _ = _cli(capsys, "plane", "runs", "--db", str(plane.store.path), "--instance", "1", "--json")
    (row,) = json.loads(out)["runs"]
    assert row["status"] == "completed" and row["events"] == row["events_total"] == 7
    assert row["backend"] == "claude-code"
    assert row["started_at"].endswith("Z") and row["failure_kind"] is None


def test_run_replays_every_event_once_in_seq_order(plane, agent, capsys):
    run_id = _queue(capsys, plane)
    _take(agent, run_id, turn_events(run_id), batches=3)
    code, out, _ = _cli(capsys, "plane", "run", "--db", str(plane.store.path), run_id, "--json")
    assert code == 0
    assert [json.loads(line)["seq"] for line in out.splitlines()] == list(range(1, 8))
    code, out, err = _cli(capsys, "plane", "run", "--db", str(plane.store.path), run_id)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "· turn_started" and lines[1] == "assistant" and HOSTILE in lines[2]
    assert "$ make test  [started]" in lines and "$ make test  [exit 0, 1200 ms]" in lines
    assert "  \\x1b[31mred\\x1b[0m" in lines  # the terminal's escapes shown, not acted on
    assert "file_change: update src/app.py  [completed]" in lines and "  +x = 2" in lines
    assert lines[-1] == "── the turn completed"


def test_a_failed_run_exits_1_with_its_failure_kind_in_a_sentence(plane, agent, capsys):
    run_id = _queue(capsys, plane)
    _take(agent, run_id, turn_events(run_id, "failed", "provider-unavailable"))
    code, out, err = _cli(capsys, "plane", "run", "--db", str(plane.store.path), run_id)
    assert code == 1 and out.splitlines()[-1].startswith("── the turn failed (provider-unavailable)")
    assert err == (f"caldera plane: run {run_id}: the turn failed (provider-unavailable): "
                   "the provider timed out\n")


def test_the_agents_terminal_escapes_reach_no_terminal_in_runs_and_the_end_sentence(plane, agent, capsys):
    escape = "\x1b]0;PWNED\x07\x1b[2K\rFAKE"
    run_id = _queue(capsys, plane)
    events = turn_events(run_id, "failed", escape)
    events[-1]["data"]["message"] = escape
    _take(agent, run_id, events)
    code, out, _ = _cli(capsys, "plane", "runs", "--db", str(plane.store.path), "--instance", "1")
    assert code == 0 and "\x1b" not in out and "\r" not in out and "\\x1b]0;PWNED\\x07" in out
    code, out, err = _cli(capsys, "plane", "run", "--db", str(plane.store.path), run_id)
    assert code == 1 and "\x1b" not in out + err and "\x07" not in err and "\\x1b[2K\\x0dFAKE" in err


def test_a_run_refused_before_any_event_ends_with_the_commands_error(plane, agent, capsys):
    run_id = _queue(capsys, plane)
    command = agent.next()
    agent.finish(command["id"], "failed", error_message="payload refused: workspace is not allowed")
    code, out, err = _cli(capsys, "plane", "run", "--db", str(plane.store.path), run_id, "--follow")
    assert code == 1 and out == "" and "the turn failed: payload refused: workspace is not allowed" in err


def test_unknown_run_and_missing_workspace_are_said(plane, capsys):
    code, _, err = _cli(capsys, "plane", "run", "--db", str(plane.store.path), "nope")
    assert code == 1 and "has no run nope" in err and "caldera plane runs" in err
    code, _, err = _cli(capsys, "plane", "turn", "--db", str(plane.store.path), "--instance", "1", "hi")
    assert code == 2 and "workspace" in err and "--no-check" not in err


def _lines_with_times(proc):
    got = []

    def read():
        for line in proc.stdout:
            got.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return got, reader


def test_follow_prints_each_event_as_it_arrives_and_a_started_tool_before_its_end(plane, agent):
    proc = subprocess.Popen([sys.executable, "-m", "caldera.cli", "plane", "turn", "--db", str(plane.store.path),
                             "--instance", "1", "--workspace", "/srv/ws", "--follow", "--json", "go"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        got, reader = _lines_with_times(proc)
        said = proc.stderr.readline()  # before the agent takes it: the run waits, and says so once
        assert said.startswith("caldera plane: run run-") and "is queued: waiting for instance 1's agent" in said
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        run_id = json.loads(got[0][1])["run_id"]
        events = turn_events(run_id)
        command = agent.next()
        agent.start(command["id"])
        agent.post(f"/runs/{run_id}/events", {"agent_id": AGENT, "events": events[:3]})  # the tool started
        while len(got) < 4 and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        assert json.loads(got[-1][1])["data"]["status"] == "started" and proc.poll() is None
        agent.post(f"/runs/{run_id}/events", {"agent_id": AGENT, "events": events[3:]})
        agent.finish(command["id"], result={"status": "completed", "events_total": 7})
        assert proc.wait(timeout=20) == 0
        assert proc.stderr.read() == ""  # said once only; a completed run adds nothing
        reader.join(5)
    finally:
        proc.kill()
        proc.communicate()
    assert [json.loads(line)["seq"] for _, line in got[1:]] == list(range(1, 8))


def test_an_event_that_comes_late_is_waited_for_and_a_lost_one_is_said(plane, agent, monkeypatch, capsys):
    from caldera.plane import follow

    monkeypatch.setattr(follow, "POLL_SECONDS", 0.02)
    monkeypatch.setattr(follow, "GRACE_SECONDS", 0.3)
    run_id = _queue(capsys, plane)
    events = turn_events(run_id)
    command = agent.next()
    agent.post(f"/runs/{run_id}/events", {"agent_id": AGENT, "events": events[:2] + events[3:]})
    agent.finish(command["id"], result={"status": "completed", "events_total": 7})
    code, out, err = _cli(capsys, "plane", "run", "--db", str(plane.store.path), run_id, "--follow", "--json")
    assert code == 0 and [json.loads(x)["seq"] for x in out.splitlines()] == [1, 2, 4, 5, 6, 7]
    assert "events 3 to 3 of run" in err and "never reached the plane" in err


# ---- the pages --------------------------------------------------------------------------------

def test_the_agent_page_links_its_runs_and_the_run_page_reads_as_a_turn(plane, agent, capsys):
    run_id = _queue(capsys, plane)
    page = requests.get(plane.url + "/agents/1").text
    assert f'href="/agents/1/runs/{run_id}"' in page and 'class="status-queued"' in page
    live = requests.get(plane.url + f"/agents/1/runs/{run_id}").text
    assert f'http-equiv="refresh" content="5; url=/agents/1/runs/{run_id}#end"' in live and "running&hellip;" in live
    _take(agent, run_id, turn_events(run_id, "failed", "backend-timeout"))
    resp = requests.get(plane.url + f"/agents/1/runs/{run_id}")
    assert resp.status_code == 200 and 'http-equiv="refresh"' not in resp.text
    text = resp.text
    assert HOSTILE not in text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert 'id="prompt">fix the build &lt;script&gt;' in text
    assert "$ make test  [exit 0, 1200 ms]" in text and "ok: 12 passed" in text and "+x = 2" in text
    assert 'class="end failed" data-end>the turn failed (backend-timeout): the provider timed out' in text
    assert text.index('data-seq="1"') < text.index('data-seq="7"') < text.index('id="end"')
    assert requests.get(plane.url + "/agents/1/runs/nope").status_code == 404
    assert requests.get(plane.url + f"/agents/9/runs/{run_id}").status_code == 404


def test_a_long_run_page_shows_its_newest_events_and_pages_to_the_start(plane, agent, capsys):
    from caldera.plane import run_page

    run_id = _queue(capsys, plane)
    agent.next()
    many = [_ev(run_id, n, "assistant_message", text=f"line {n}") for n in range(1, run_page.PAGE_EVENTS + 101)]
    for i in range(0, len(many), 200):
        agent.post(f"/runs/{run_id}/events", {"agent_id": AGENT, "events": many[i:i + 200]})
    text = requests.get(plane.url + f"/agents/1/runs/{run_id}").text
    assert 'data-seq="101"' in text and 'data-seq="100"' not in text and "?from=1" in text
    first = requests.get(plane.url + f"/agents/1/runs/{run_id}?from=1").text
    assert 'data-seq="1"' in first and f'data-seq="{run_page.PAGE_EVENTS + 1}"' not in first
    assert "later events" in first


def test_the_json_reads_of_runs(plane, agent, capsys):
    run_id = _queue(capsys, plane)
    _take(agent, run_id, turn_events(run_id))
    listed = requests.get(plane.url + "/plane/api/runs?instance=1").json()["data"]["runs"]
    assert [r["run_id"] for r in listed] == [run_id]
    doc = requests.get(plane.url + f"/plane/api/run-events?instance=1&run={run_id}&after=5").json()["data"]
    assert [e["seq"] for e in doc["events"]] == [6, 7] and doc["run"]["status"] == "completed"
    assert requests.get(plane.url + "/plane/api/run-events?instance=1&run=nope").status_code == 400


@pytest.mark.parametrize("seq", [2**63, 2**70])
def test_a_seq_past_sqlites_integers_is_refused_with_a_sentence(plane, agent, seq):
    resp = agent.post("/runs/r-huge/events", {"agent_id": AGENT, "events": [_ev("r-huge", seq, "backend_status")]})
    assert resp.status_code == 400 and "seq" in resp.text and "Traceback" not in resp.text
    ok = agent.post("/runs/r-big/events", {"agent_id": AGENT, "events": [_ev("r-big", 2**63 - 1, "backend_status")]})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("bad", [str(2**64), "\u00b2", "1" * 19, "-1"])
def test_a_bad_page_or_after_number_is_a_400_with_a_sentence(plane, agent, capsys, bad):
    run_id = _queue(capsys, plane)
    _take(agent, run_id, turn_events(run_id))
    resp = requests.get(plane.url + f"/agents/1/runs/{run_id}", params={"from": bad})
    assert resp.status_code == 400 and "?from=SEQ must be a whole number" in resp.text
    resp = requests.get(plane.url + "/plane/api/run-events", params={"instance": "1", "run": run_id, "after": bad})
    assert resp.status_code == 400 and "?after=SEQ must be a whole number" in resp.text
    resp = requests.get(plane.url + "/plane/api/runs", params={"instance": bad})
    assert resp.status_code == 400 and "?instance=N" in resp.text


def test_a_terminal_event_before_a_missing_one_waits_for_it(tmp_path, monkeypatch):
    """The terminal event stored before seq 2: the replay waits for 2 (bounded by the grace),
    says the gap, and still gives the terminal event."""
    from caldera.plane import follow

    monkeypatch.setattr(follow, "POLL_SECONDS", 0.02)
    monkeypatch.setattr(follow, "GRACE_SECONDS", 0.3)
    store = Store(tmp_path / "p.db")
    store.add_run_events(1, "r", [_ev("r", 1, "assistant_message", text="one"),
                                  _ev("r", 3, "terminal_status", status="completed")])
    kinds = [type(i).__name__ for i in follow.replay(store, 1, "r", threading.Event(), follow=True) if i is not None]
    assert kinds == ["Stored", "Gap", "Stored", "End"]
    store.add_run_events(1, "s", [_ev("s", 1, "assistant_message"), _ev("s", 3, "terminal_status", status="completed")])
    late = threading.Timer(0.1, store.add_run_events, (1, "s", [_ev("s", 2, "assistant_message", text="two")]))
    late.start()
    got = [i.seq for i in follow.replay(store, 1, "s", threading.Event(), follow=True) if isinstance(i, follow.Stored)]
    late.join()
    assert got == [1, 2, 3]
    store.close()


def test_a_run_id_another_instance_posted_does_not_win_without_instance(plane, agent, capsys):
    run_id = _queue(capsys, plane)
    _take(agent, run_id, turn_events(run_id))
    plane.store.add_instance(2, "other")
    plane.store.add_run_events(2, run_id, [_ev(run_id, 1, "terminal_status", status="failed", message="FORGED")])
    code, out, err = _cli(capsys, "plane", "run", "--db", str(plane.store.path), run_id)
    assert code == 0 and "FORGED" not in out + err and out.splitlines()[-1] == "── the turn completed"
    plane.store.add_run_events(2, "posted", [_ev("posted", 1, "terminal_status", status="completed")])
    plane.store.add_run_events(1, "posted", [_ev("posted", 1, "terminal_status", status="completed")])
    code, out, err = _cli(capsys, "plane", "run", "--db", str(plane.store.path), "posted")
    assert code == 1 and "instances 1, 2 all have a run posted: say which with --instance N" in err


# ---- retention -------------------------------------------------------------------------------

def test_ended_runs_are_pruned_oldest_first_and_a_running_one_never(tmp_path):
    now = [1_800_000_000.0]
    store = Store(tmp_path / "p.db", clock=lambda: now[0])
    store.add_instance(1, "t")
    store.runs_kept = 3
    store.add_run_events(1, "running-old", [_ev("running-old", 1, "backend_status", phase="x")])
    for n in range(5):
        now[0] += 10
        run_id = f"r{n}"
        store.add_run_events(1, run_id, turn_events(run_id))
    gone = store.prune(now[0])
    assert gone["runs"] == 2 and gone["run_events"] == 14
    assert [r["run_id"] for r in store.runs(1)] == ["r4", "r3", "r2", "running-old"]
    queued = store.enqueue(1, "agent_run", {"run_id": "queued", "prompt": "p", "workspace": "/w"})
    now[0] += 8 * 86400
    store.add_run_events(1, "running-old", [_ev("running-old", 2, "backend_status", phase="y")])  # still talking
    store.prune(now[0])
    assert [r["run_id"] for r in store.runs(1)] == ["queued", "running-old"]
    assert store.run_events(1, "running-old") and not store.run_events(1, "r4")
    store.prune(now[0] + 8 * 86400)  # no command stands for it and it went silent a week ago: not running
    assert [r["run_id"] for r in store.runs(1)] == ["queued"] and store.command(1, queued)["status"] == "pending"
    store.close()


def test_an_older_planes_duplicate_events_are_kept_once_at_upgrade(tmp_path):
    import sqlite3

    db = sqlite3.connect(tmp_path / "p.db")
    db.executescript("CREATE TABLE run_events (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL,"
                     " instance_id INTEGER NOT NULL, seq INTEGER, received_at REAL, event TEXT NOT NULL);")
    for seq in (1, 1, 2):
        db.execute("INSERT INTO run_events (run_id, instance_id, seq, received_at, event) VALUES ('r', 1, ?, 0, ?)",
                   (seq, json.dumps(_ev("r", seq, "backend_status"))))
    db.commit()
    db.close()
    store = Store(tmp_path / "p.db")
    assert [e["seq"] for e in store.run_events(1, "r")] == [1, 2]
    store.close()


@pytest.mark.parametrize("count", [3])
def test_events_beyond_the_per_run_bound_are_counted_not_stored(tmp_path, monkeypatch, count):
    monkeypatch.setattr(runs_mod, "EVENTS_PER_RUN", count)
    store = Store(tmp_path / "p.db")
    store.add_instance(1, "t")
    assert store.add_run_events(1, "r", turn_events("r")) == count
    assert store.run("r", 1)["refused"] == 7 - count
    store.close()


def test_the_run_page_in_headless_chromium(plane, agent, capsys, tmp_path):
    """The DOM Chromium builds: the turn in order, the model's markup as text (no element made
    of it), no script, the end stated; a live run's page reloads at its newest event."""
    from test_plane_page import need_chromium

    need_chromium()
    plane = PlaneServer(tmp_path / "real-clock.db", tokens={BOOT: 1}).start()  # "queued 2 s ago", as a person sees it
    agent = Agent(plane.url)
    assert agent.register().status_code == 200
    try:
        _chromium_checks(plane, agent, capsys, tmp_path)
    finally:
        plane.stop()


def _chromium_checks(plane, agent, capsys, tmp_path):
    import os
    import re
    import shutil
    from pathlib import Path

    from test_plane_page import dump_dom, screenshot

    run_id = _queue(capsys, plane)
    _take(agent, run_id, turn_events(run_id, "failed", "backend-timeout"))
    dom = dump_dom(plane.url + f"/agents/1/runs/{run_id}")
    assert "<script" not in dom.lower() and "&lt;script&gt;alert" in dom and 'http-equiv="refresh"' not in dom
    assert re.findall(r'data-seq="(\d+)"', dom) == [str(n) for n in range(1, 8)]
    assert "the turn failed (backend-timeout): the provider timed out" in dom
    assert dom.index('id="prompt"') < dom.index('id="turn"') < dom.index('data-end')
    shot = tmp_path / "plane-run-page.png"
    screenshot(plane.url + f"/agents/1/runs/{run_id}", shot, size="1100,1000")
    keep = os.environ.get("CALDERA_PLANE_RUN_SCREENSHOT")  # docs/plane-run-page.png was made so
    if keep:
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, keep)
