"""The agent's OpenCode server with the real CLI: reuse, replacement for a changed config and
after death (between turns and mid-turn), two turns at once, a stop during a turn; the
providers ClawManager gives it (OPENCODE_CONFIG_CONTENT, the gateway variables); SIGTERM to
`caldera turn`; containment under strace (no connection off loopback, no file written outside
the run's dirs and the workspace). What wins among the providers, the server's environment
and its idle stop are test_opencode_parts.py's (no server needed)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from backends_fake_chat import FakeChat as FakeChatProvider
from backends_helpers import everything_text, execute, of_type
from backends_proxy import PROXIES, ConnectProxy, tls_certificate
from opencode_helpers import (
    CANARY,
    KEY_ENV,
    assert_no_leak,
    environment,
    request,
    require_opencode,
    terminal,
    write_projection,
)

from caldera.backends import failures as fk
from caldera.backends import leftovers
from caldera.backends.opencode.owner import ServerOwner
from caldera.host import proc

ENV_DUMP = {"call": "bash", "args": {"command": f"echo key=${KEY_ENV}; env", "description": "env"}}


@pytest.fixture
def ws(tmp_path):
    require_opencode()
    path = tmp_path / "ws"
    path.mkdir()
    return path


def _wait(predicate: Any, stop: threading.Event | None = None, limit: int = 400) -> bool:
    """Poll `predicate` every 0.05 s, at most `limit` times (not a timed assertion: a bound)."""
    tick = stop or threading.Event()
    for _ in range(limit):
        if predicate():
            return True
        tick.wait(0.05)
    return bool(predicate())


# ---------------------------------------------------------------- the owner

def test_the_agents_server_is_reused_replaced_when_its_config_changes_or_it_dies(tmp_path, ws):
    """One agent's server through its life: reused by a later turn; replaced for a changed
    projection (the new provider gets the requests); killed mid-turn, that turn fails and the
    next gets a new one; killed between turns, replaced at the next. (Its idle stop is the
    owner's alone: test_opencode_parts, with a stand-in binary.)"""
    owner = ServerOwner(tmp_path / "state" / "runs", idle_seconds=600)
    with FakeChatProvider([{"text": "a"}]) as first, FakeChatProvider([{"text": "b"}]) as second:
        env = environment(tmp_path, write_projection(tmp_path, first.url), owner=owner)
        try:
            one = execute(request(ws, run_id="a"), env)[1]
            pid = owner.server.pid
            two = execute(request(ws, run_id="b"), env)[1]
            assert terminal(one)["status"] == terminal(two)["status"] == "completed"
            assert [d.get("server") for d in of_type(one, "backend_status") if d["phase"] == "ready"] == ["started"]
            assert [d.get("server") for d in of_type(two, "backend_status") if d["phase"] == "ready"] == ["reused"]
            assert owner.starts == 1 and owner.server.pid == pid
            assert oct(owner.server.dir.stat().st_mode & 0o777) == "0o700"

            write_projection(tmp_path, second.url)  # the projection changed
            three = execute(request(ws, run_id="c"), env)[1]
            assert [m["text"] for m in of_type(three, "assistant_message")] == ["b"]
            assert owner.starts == 2 and len(first.main) == 2 and len(second.main) == 1

            second.set_script([{"stall": 60}])  # dies mid-turn: that turn fails
            box: dict[str, Any] = {}
            thread = threading.Thread(target=lambda: box.update(out=execute(request(ws, run_id="dies"), env)))
            thread.start()
            assert second.wait_main(2)
            os.kill(owner.server.serving_pid(), signal.SIGKILL)  # the server, not its bwrap
            thread.join(60)
            assert not thread.is_alive()
            data = terminal(box["out"][1])
            assert data["status"] == "failed" and data["failure_kind"] == fk.BACKEND_FAILED and \
                "OpenCode server" in data["message"], data
            second.set_script([{"text": "back"}])
            four = execute(request(ws, run_id="after"), env)[1]
            assert terminal(four)["status"] == "completed" and owner.starts == 3

            pid, server_dir = owner.server.pid, owner.server.dir
            os.killpg(pid, signal.SIGKILL)  # dies between turns: replaced at the next
            assert _wait(lambda: not owner.server.alive())
            five = execute(request(ws, run_id="later"), env)[1]
            assert terminal(five)["status"] == "completed"
            assert owner.starts == 4 and owner.server.pid != pid and not server_dir.exists()

            _two_turns_at_once_share_it(owner, second, env, ws)
            _a_stop_during_a_turn_ends_it_and_no_new_turn_starts(owner, second, env, ws)
        finally:
            owner.close()
    assert owner.server is None and not list((tmp_path / "state" / "runs").iterdir())


def _two_turns_at_once_share_it(owner: ServerOwner, provider: FakeChatProvider, env: Any, ws: Path) -> None:
    gate = {"gate": "both", "then": {"text": "together"}}
    provider.set_script([gate, gate])
    before = len(provider.main)
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda rid=rid: out.update({rid: execute(request(ws, run_id=rid), env)}))
               for rid in ("one", "two")]
    for thread in threads:
        thread.start()
    assert provider.wait_main(before + 2)  # both requests are at the provider at the same time
    provider.release("both")
    for thread in threads:
        thread.join(60)
    for rid in ("one", "two"):
        events = out[rid][1]
        assert terminal(events)["status"] == "completed", events
        assert [m["text"] for m in of_type(events, "assistant_message")] == ["together"]
        assert all(e["run_id"] == rid for e in events)
    assert owner.starts == 4


def _a_stop_during_a_turn_ends_it_and_no_new_turn_starts(owner: ServerOwner, provider: FakeChatProvider, env: Any,
                                                         ws: Path) -> None:
    provider.set_script([{"stall": 60}])
    before = len(provider.main)
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(out=execute(request(ws, run_id="stopped"), env)))
    thread.start()
    assert provider.wait_main(before + 1)
    owner.close()  # the daemon's stop sequence
    thread.join(60)
    data = terminal(box["out"][1])
    assert data["status"] == "failed" and data["failure_kind"] == fk.BACKEND_FAILED
    later = terminal(execute(request(ws, run_id="too-late"), env)[1])
    assert later["failure_kind"] == fk.BACKEND_FAILED and "stopping" in later["message"]


# ---------------------------------------------------------------- the providers ClawManager gives

CLAWMANAGER_CONFIG = json.dumps({
    "$schema": "https://opencode.ai/config.json",
    "provider": {"clawmanager": {"npm": "@ai-sdk/openai-compatible", "name": "ClawManager",
                                 "options": {"baseURL": "{env:CLAWMANAGER_LLM_BASE_URL}",
                                             "apiKey": "{env:CLAWMANAGER_LLM_API_KEY}"},
                                 "models": {"auto": {"name": "auto"}}}},
    "model": "clawmanager/auto"})


def _gateway_env(url: str, **extra: str) -> dict[str, str]:
    return dict({"CLAWMANAGER_LLM_BASE_URL": url, "CLAWMANAGER_LLM_API_KEY": CANARY,
                 "OPENAI_BASE_URL": url, "OPENAI_API_KEY": CANARY, "OPENAI_MODEL": "auto",
                 "CLAWMANAGER_LLM_MODEL": '["auto","gpt-4.1"]', "CLAWMANAGER_LLM_PROVIDER": "openai-compatible"},
                **extra)


def test_clawmanagers_opencode_config_content_with_the_gateway_token_as_server_password(tmp_path, ws):
    with FakeChatProvider([ENV_DUMP, {"text": "done"}], model="auto") as provider:
        env = environment(tmp_path, None, **_gateway_env(provider.url, OPENCODE_CONFIG_CONTENT=CLAWMANAGER_CONFIG,
                                                          OPENCODE_SERVER_USERNAME="opencode",
                                                          OPENCODE_SERVER_PASSWORD=CANARY))
        result, events = execute(request(ws), env)
        assert terminal(events)["status"] == "completed", events
        start = of_type(events, "backend_status")[0]
        assert start["provider_source"] == "opencode-config-content" and start["provider"] == "clawmanager"
        assert start["model"] == "auto" and start["base_url"] == provider.url
        assert provider.main[0]["headers"]["authorization"] == f"Bearer {CANARY}"
        output = of_type(events, "command_output")[0]["output"]
        assert "CLAWMANAGER_LLM" not in output and "OPENCODE_CONFIG_CONTENT" not in output
        assert_no_leak(result, events, env, provider)
        # A model of the catalogue is taken; one outside it is refused, naming the catalogue.
        provider.set_script([{"text": "other"}])
        refused = execute(dict(request(ws, run_id="r2"), model="gpt-5-secret-preview"), env)[1]
        assert terminal(refused)["status"] == "blocked" and "auto, gpt-4.1" in terminal(refused)["message"]


def test_the_gateway_variables_build_the_provider_and_the_catalogue_rule_picks_the_model(tmp_path, ws):
    with FakeChatProvider([{"text": "via gateway"}], model="gpt-4.1") as provider:
        env = environment(tmp_path, None, **_gateway_env(provider.url))
        result, events = execute(dict(request(ws), model="gpt-4.1"), env)
        assert terminal(events)["status"] == "completed", events
        start = of_type(events, "backend_status")[0]
        assert start["provider_source"] == "gateway" and start["provider"] == "clawmanager"
        assert [json.loads(r["body"])["model"] for r in provider.main] == ["gpt-4.1"]
        assert_no_leak(result, events, env, provider)


def test_the_provider_is_reached_through_https_proxy_and_nothing_of_it_reaches_opencode(tmp_path, ws, monkeypatch):
    """HTTPS_PROXY as requests honours it (the shared forwarder's): the provider on HTTPS as
    `provider.test`, a name only the proxy's tunnel reaches; the key inside TLS only, the
    proxy's credentials in no event or log, and neither the proxy nor the key in what the
    agent's command sees (OpenCode's environment is built from nothing)."""
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
    cert, key = tls_certificate(tmp_path, "provider.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with FakeChatProvider([ENV_DUMP, {"text": "through the proxy"}], tls=tls) as provider, \
            ConnectProxy(provider.httpd.server_address[1]) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://squid:proxy-Passw0rd@"))
        env = environment(tmp_path, write_projection(tmp_path, "https://provider.test/v1"))
        result, events = execute(request(ws), env)
    assert terminal(events)["status"] == "completed", events
    assert [m["text"] for m in of_type(events, "assistant_message")] == ["through the proxy"]
    assert {target for target, _ in proxy.connects} == {"provider.test:443"}
    [ready] = [d for d in of_type(events, "backend_status") if d["phase"] == "ready"]
    assert ready["proxy"] == f"127.0.0.1:{proxy.httpd.server_address[1]}"
    assert [r["headers"]["authorization"] for r in provider.main] == [f"Bearer {CANARY}"] * 2
    assert CANARY.encode() not in bytes(proxy.sent)  # inside the tunnel's TLS only
    output = of_type(events, "command_output")[0]["output"]
    assert "key=" in output and "PROXY" not in output.upper() and "provider.test" not in output
    assert_no_leak(result, events, env, provider)
    assert "proxy-Passw0rd" not in everything_text(result, events, env)


# ---------------------------------------------------------------- caldera turn

def _caldera_turn(tmp_path: Path, ws: Path, provider_url: str, **popen: Any) -> subprocess.Popen[Any]:
    """`caldera turn --json wait` on OpenCode with a projection for `provider_url`, started."""
    sec = write_projection(tmp_path, provider_url)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
           "CALDERA_OPENCODE_BIN": os.environ["CALDERA_OPENCODE_BIN"],
           "CALDERA_CONFIG_DIR": str(tmp_path / "no-config"), "CALDERA_STATE_DIR": str(tmp_path / "no-state")}
    return subprocess.Popen(
        [sys.executable, "-m", "caldera.cli", "turn", "--backend", "opencode", "--workspace", str(ws),
         "--secrets", str(sec), "--state-dir", str(tmp_path / "state"), "--json", "wait"], env=env, **popen)


def test_sigterm_to_caldera_turn_cancels_the_turn_and_stops_its_server(tmp_path, ws):
    with FakeChatProvider([{"stall": 120}]) as provider:
        proc = _caldera_turn(tmp_path, ws, provider.url, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert provider.wait_main(1, timeout=120)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 1, err
    last = json.loads(out.splitlines()[-1])
    assert last["data"]["status"] == "cancelled" and last["data"]["failure_kind"] == fk.CANCELLED
    assert not list((tmp_path / "state" / "runs").iterdir())


def test_a_server_whose_caldera_turn_was_killed_9_is_stopped_by_the_next_starts_sweep(tmp_path, ws):
    # the daemon's start (and every `caldera turn`) sweeps runs/: the orphaned server with it
    with FakeChatProvider([{"stall": 120}]) as provider:
        turn = _caldera_turn(tmp_path, ws, provider.url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert provider.wait_main(1, timeout=120)
        finally:
            turn.kill()
            turn.wait()
        [left] = (tmp_path / "state" / "runs").glob(".opencode-*")
        doc = json.loads((left / "server.json").read_text())
        try:
            assert proc.same_process(doc["pid"], doc["start_time"])  # orphaned, still running
            assert leftovers.sweep(tmp_path / "state" / "runs") == [str(left)]
            assert not proc.same_process(doc["pid"], doc["start_time"]) and not left.exists()
        finally:
            proc.signal_pgid(doc["pid"], signal.SIGKILL)


def test_a_deadline_while_the_server_starts_is_backend_timeout_and_leaves_nothing(tmp_path, ws):
    slow = tmp_path / "opencode-slow"  # the real binary, 5 s late: the 1 s deadline falls in its start
    slow.write_text(f'#!/bin/sh\nsleep 5\nexec "{os.environ["CALDERA_OPENCODE_BIN"]}" "$@"\n')
    slow.chmod(0o755)
    with FakeChatProvider([{"text": "never"}]) as provider:
        env = environment(tmp_path, write_projection(tmp_path, provider.url), binary=str(slow))
        result, events = execute(request(ws, timeout_seconds=1), env)
    data = terminal(events)
    assert data["status"] == "failed" and data["failure_kind"] == fk.BACKEND_TIMEOUT, events
    assert provider.requests == [] and not list((tmp_path / "state" / "runs").iterdir())


# ---------------------------------------------------------------- containment

_CONNECT = re.compile(r'connect\(.*sa_family=(AF_INET6?)\b.*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")')
_CALL = re.compile(r'\b(openat|open|mkdirat|mkdir|unlinkat|unlink|renameat2|renameat|rename)\('
                   r'(?:(?:AT_FDCWD|\d+)(?:<([^>]*)>)?, )?"([^"]*)"([^)]*)\)')


def _written(text: str) -> list[str]:
    """Paths the trace shows created, opened for writing, renamed or removed (successfully)."""
    out = []
    for line in text.splitlines():
        found = _CALL.search(line)
        if found is None or "= -1" in line[found.end():]:
            continue
        name, base, path, rest = found.groups()
        if name.startswith("open") and not re.search(r"O_WRONLY|O_RDWR|O_CREAT", rest):
            continue
        out.append(os.path.normpath(os.path.join(base or "/", path)))
    return out


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (apt-get install strace)")
def test_under_strace_nothing_leaves_loopback_and_nothing_is_written_outside_the_run_dirs(tmp_path, ws):
    trace = ws / ".trace"  # where the server's own sandbox lets strace (inside it) write
    wrapper = tmp_path / "opencode-traced"
    wrapper.write_text(f'#!/bin/sh\nexec strace -f -qq -y -e trace=connect,openat,open,mkdir,mkdirat,rename,'
                       f'renameat,renameat2,unlink,unlinkat -o "{trace}" "{os.environ["CALDERA_OPENCODE_BIN"]}" "$@"\n')
    wrapper.chmod(0o755)
    script = [{"call": "bash", "args": {"command": "echo made > made.txt", "description": "x"}}, {"text": "done"}]
    with FakeChatProvider(script) as provider:
        env = environment(tmp_path, write_projection(tmp_path, provider.url), binary=str(wrapper))
        result, events = execute(request(ws, timeout_seconds=120), env)
    assert terminal(events)["status"] == "completed", events
    assert (ws / "made.txt").read_text() == "made\n"
    text = trace.read_text()
    inet = list(_CONNECT.finditer(text))
    assert inet and len(inet) == len(re.findall(r"sa_family=AF_INET", text)), "the connect filter is wrong"
    assert {m.group(2) or m.group(3) for m in inet} <= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
    runs = str(tmp_path / "state" / "runs")
    # bubblewrap sets up each command's sandbox in a mount namespace of its own, on a tmpfs it
    # pivots into (its /newroot and /oldroot): nothing there reaches the host's disk
    allowed = (runs + "/", str(ws) + "/", "/dev/null", "/dev/tty", "/newroot", "/oldroot")
    written = _written(text)
    outside = sorted({p for p in written if not p.startswith(allowed)})
    assert any(p.endswith("/opencode.db") for p in written) and str(ws / "made.txt") in written
    assert written and outside == [], outside
