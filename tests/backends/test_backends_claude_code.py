"""What the Claude Code backend adds to the contract suite, with the real CLI: the
execution policy enforced by its sandbox and permission modes (no write outside the
workspace, none at all read-only, no network; what would ask is denied, or declined when
asked of the runtime), the workspace diff, and the refusal of a policy the host cannot
honour, and the provider reached through HTTPS_PROXY. Skips like the contract suite
(CALDERA_REQUIRE_CLAUDE_CODE=1 makes it fail)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from backends_drivers import CANARY, DRIVERS
from backends_fake_anthropic import FakeAnthropic
from backends_proxy import ConnectProxy, tls_certificate
from test_backends_contract import Turn, processes_holding

from caldera.backends import leftovers
from caldera.backends.claude_code import config as cc

DRIVER = DRIVERS["claude-code"]


@pytest.fixture(autouse=True)
def _cli():
    if DRIVER.binary() is None:
        if os.environ.get(DRIVER.require_var) == "1":
            pytest.fail(f"the real Claude Code CLI is not available ({DRIVER.bin_var})")
        pytest.skip("the real Claude Code CLI is not available")


def _probe(outside: str) -> str:
    # Writes in the workspace and outside it, and connects to the provider itself (loopback).
    return (f"echo inside > inside.txt; echo outside > {outside}; "
            "python3 -c 'import os,socket,urllib.parse as u; p=u.urlsplit(os.environ[\"ANTHROPIC_BASE_URL\"]); "
            "socket.create_connection((p.hostname, p.port), timeout=3); print(\"CONNECTED\")' 2>&1 | tail -1")


def _write(path: str) -> dict:
    return {"tool": "Write", "input": {"file_path": path, "content": "written\n"}}


def test_workspace_write_writes_only_in_the_workspace_and_reaches_no_network(tmp_path):
    outside, outside_tool = (f"/tmp/caldera-outside-{uuid.uuid4().hex}" for _ in range(2))
    script = [DRIVER.command(_probe(outside)), _write(outside_tool), _write(str(tmp_path / "ws" / "w.txt")),
              DRIVER.text("done")]
    turn = Turn(DRIVER, tmp_path, script, sandbox="workspace-write")  # approval: never
    assert turn.terminal["status"] == "completed", turn.events
    [output] = turn.of("command_output")
    assert "Read-only file system" in output["output"] and "CONNECTED" not in output["output"], output
    assert not os.path.exists(outside) and not os.path.exists(outside_tool)
    # The Write outside would ask: with approval never it is denied; the one inside goes through.
    assert [(t["name"], t["status"]) for t in turn.of("tool_call") if t["status"] != "started"] == [
        ("Write", "denied"), ("Write", "completed")]
    assert (turn.workspace / "inside.txt").read_text() == "inside\n"
    assert (turn.workspace / "w.txt").read_text() == "written\n"
    assert sorted(os.listdir(turn.workspace)) == ["inside.txt", "w.txt"]  # nothing of the CLI's (.claude/.cc-writes)
    [diff] = turn.of("diff")  # from the workspace after the turn
    assert "+++ b/inside.txt" in diff["diff"] and "+inside" in diff["diff"] and "+++ b/w.txt" in diff["diff"]
    turn.assert_no_leak()


def test_approval_on_request_is_asked_of_the_runtime_and_declined(tmp_path):
    outside = f"/tmp/caldera-outside-{uuid.uuid4().hex}"
    turn = Turn(DRIVER, tmp_path, [_write(outside), DRIVER.text("done")], approval="on-request",
                extra_env={"CALDERA_RUN_ALLOW_APPROVAL": "true"})
    assert turn.terminal["status"] == "completed", turn.events
    assert [(t["tool"], t["status"]) for t in turn.of("tool_call")] == [
        ("file_change", "started"), ("approval", "declined"), ("file_change", "failed")]
    assert not os.path.exists(outside)


def test_read_only_writes_nowhere_and_offers_no_write_tool(tmp_path):
    outside = f"/tmp/caldera-outside-{uuid.uuid4().hex}"
    script = [DRIVER.command(_probe(outside)), _write(str(tmp_path / "ws" / "w.txt")), DRIVER.text("done")]
    turn = Turn(DRIVER, tmp_path, script, sandbox="read-only")
    assert turn.terminal["status"] == "completed", turn.events
    assert not (turn.workspace / "inside.txt").exists() and not (turn.workspace / "w.txt").exists()
    assert not os.path.exists(outside) and turn.of("diff") == []
    session = next(s for s in turn.of("backend_status") if s["phase"] == "session_started")
    assert "Write" not in session["tools"] and "Edit" not in session["tools"]


def test_network_true_is_refused_unless_the_caps_allow_it_and_missing_sandbox_refuses(tmp_path):
    turn = Turn(DRIVER, tmp_path, [DRIVER.text("never")], network=True)
    assert turn.terminal["status"] == "blocked" and "network" in turn.terminal["message"]
    # No bubblewrap/socat on PATH: the policy cannot be honoured, so the run is refused (never widened).
    empty = tmp_path / "empty-path"
    empty.mkdir()
    (tmp_path / "b").mkdir()
    turn = Turn(DRIVER, tmp_path / "b", [DRIVER.text("never")], extra_env={"PATH": str(empty)})
    assert turn.terminal["status"] == "blocked" and "bubblewrap" in turn.terminal["message"], turn.events
    assert turn.requests == []


class _Proxied(type(DRIVER)):
    """The Claude Code driver with its provider on HTTPS as `provider.test` (reached only
    through the proxy's tunnel) instead of plain http on loopback."""

    def __init__(self, provider):
        self.running = provider

    def provider(self, script):
        return contextlib.nullcontext(self.running)

    def projection(self, root, provider_url, key):
        return super().projection(root, "https://provider.test", key)


def test_the_forwarder_reaches_the_provider_through_https_proxy(tmp_path, monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    cert, key = tls_certificate(tmp_path, "provider.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    with FakeAnthropic([DRIVER.text("through the proxy")], tls=server) as provider, \
            ConnectProxy(provider.httpd.server_address[1]) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://squid:proxy-Passw0rd@"))
        turn = Turn(_Proxied(provider), tmp_path, [])
    assert turn.terminal["status"] == "completed", turn.events
    assert [m["text"] for m in turn.of("assistant_message")] == ["through the proxy"]
    assert [target for target, _ in proxy.connects] == ["provider.test:443"]
    assert turn.of("backend_status")[0]["proxy"] == f"127.0.0.1:{proxy.httpd.server_address[1]}"
    assert provider.posts[0]["headers"]["x-api-key"] == CANARY
    turn.assert_no_leak()
    assert "proxy-Passw0rd" not in json.dumps(turn.events) + Path(turn.result["log"]).read_text()


def _secret(path, mark: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(mark + "\n")
    return path


def test_the_agent_reads_none_of_the_runtimes_credentials_nor_other_agents_nor_other_runs(tmp_path):
    """The review's C1: the agent's commands (the sandbox) and its Read tool (the permission
    rules) read nothing of the runtime's config root (every agent's projection and
    secrets.env), its state root (every session.json, every run's HOME), the persistent dir,
    systemd's credentials, nor another run's private dir; the workspace, inside the
    persistent dir here, stays readable to both."""
    etc, var, persist, creds = (tmp_path / name for name in ("etc", "var", "persist", "creds"))
    other_key = etc / "agents" / "a2" / "secrets" / "claude-code" / "env" / "ANTHROPIC_API_KEY"
    marks = {
        "OTHERKEY": _secret(other_key, "OTHERKEY"),
        "OTHERBOOT": _secret(etc / "agents" / "a2" / "secrets.env", "OTHERBOOT"),
        "MYBOOT": _secret(etc / "agents" / "a1" / "secrets.env", "MYBOOT"),
        "OTHERSESSION": _secret(var / "a2" / "session.json", "OTHERSESSION"),
        "OTHERRUNHOME": _secret(var / "a2" / "runs" / "r9" / "home" / "notes", "OTHERRUNHOME"),
        "MYSESSION": _secret(var / "a1" / "session.json", "MYSESSION"),
        "PERSISTCRED": _secret(persist / ".claude" / ".credentials.json", "PERSISTCRED"),
        "SYSTEMDCRED": _secret(creds / "other_env_TOKEN", "SYSTEMDCRED"),
    }
    other_run = leftovers.private_root() / f"test-{uuid.uuid4().hex[:8]}"
    _secret(other_run / "tmp" / "claude-0" / "scratch", "OTHERRUNTMP")
    leftovers.claim(other_run)  # a live run of this process: no sweep takes it meanwhile
    marks["OTHERRUNTMP"] = other_run / "tmp" / "claude-0" / "scratch"
    workspace = persist / "workspace"
    _secret(workspace / "mine.txt", "WORKSPACEFILE")
    key = etc / "agents" / "a1" / "secrets" / "claude-code" / "env" / "ANTHROPIC_API_KEY"
    paths = [*marks.values(), key]
    # In a script: the CLI itself refuses a command line naming a path its Read rules deny; the
    # sandbox is what must hold against a command that hides its paths.
    (workspace / "probe.sh").write_text(
        f"cat mine.txt; for f in {' '.join(map(str, paths))}; do cat $f; done 2>&1 | sort | uniq -c\n"
        f"ls -A {etc} {var} {persist} {leftovers.private_root()} 2>&1\n")
    script = [DRIVER.command("sh probe.sh"), {"tool": "Read", "input": {"file_path": str(marks["OTHERKEY"])}},
              {"tool": "Read", "input": {"file_path": str(marks["PERSISTCRED"])}},
              {"tool": "Read", "input": {"file_path": str(workspace / "mine.txt")}}, DRIVER.text("done")]
    try:
        turn = Turn(DRIVER, tmp_path, script, workspace=workspace, config_dir=etc / "agents" / "a1",
                    state_dir=var / "a1", fields={"config_root": str(etc), "state_root": str(var),
                                                  "persistent_dir": str(persist), "credentials_dir": str(creds)})
    finally:
        shutil.rmtree(other_run, ignore_errors=True)
    assert turn.terminal["status"] == "completed", turn.events
    [output] = turn.of("command_output")
    assert "WORKSPACEFILE" in output["output"], output  # the workspace is readable
    sent = json.dumps([post["body"] for post in turn.posts])
    for mark in [*marks, CANARY]:
        assert mark not in output["output"] and mark not in sent, mark  # the model never got any
    # Each hidden root reads as an empty directory, except the way to the workspace.
    assert "workspace" in output["output"]
    reads = [t for t in turn.of("tool_call") if t["name"] == "Read" and t["status"] != "started"]
    assert [t["status"] for t in reads] == ["failed", "failed", "completed"], reads
    assert "denied by your permission settings" in turn.posts[2]["body"]  # the Read of a2's key
    assert "WORKSPACEFILE" in turn.posts[4]["body"]
    turn.assert_no_leak()


def test_a_run_started_before_the_private_root_exists_reads_no_later_runs_private_dir(tmp_path, monkeypatch):
    """Issue 41 (bench_many): the first of several runs at once found no private root (the
    last run's end had removed it) and so did not hide it; the runs started after it put their
    HOME and TMPDIR there, and its commands read them. Now the root is hidden all the same."""
    short = tempfile.mkdtemp(prefix="cc41-", dir="/tmp")  # the sandbox's sockets' paths are at most 108 bytes
    monkeypatch.setenv("TMPDIR", short)  # a private root no run has made yet
    try:
        _without_a_private_root(tmp_path)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _without_a_private_root(tmp_path: Path) -> None:
    assert not leftovers.private_root().exists()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    later = leftovers.private_root() / "later"  # another run's, made while this one's command waits
    (workspace / "probe.sh").write_text(
        "touch ready; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done\n"
        f"cat {later}/home/notes 2>&1; ls -A {leftovers.private_root()} | sed 's/^/entry: /'; echo probe-done\n")
    stop = threading.Event()

    def other_run() -> None:
        while not stop.is_set() and not (workspace / "ready").exists():
            stop.wait(0.05)
        _secret(later / "home" / "notes", "LATERRUNHOME")
        (workspace / "go").touch()
    thread = threading.Thread(target=other_run, daemon=True)
    thread.start()
    try:
        turn = Turn(DRIVER, tmp_path, [DRIVER.command("sh probe.sh"), DRIVER.text("done")], workspace=workspace)
    finally:
        stop.set()
        thread.join(5)
    assert turn.terminal["status"] == "completed", turn.events
    [output] = turn.of("command_output")
    assert "probe-done" in output["output"] and (later / "home" / "notes").exists(), output
    assert "LATERRUNHOME" not in output["output"] and "entry: later" not in output["output"], output


LATE_WRITER = r"""#!PYTHON
import json, sys
print(json.dumps({"type": "control_response", "response": {"subtype": "success", "request_id": "init_1"}}))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "done"}), flush=True)
sys.stdin.read()  # the turn's result is out; what comes now is after it, until the runtime closes stdin
with open("late.txt", "w") as fh:
    fh.write("written after the result\n")
"""


def test_the_diff_is_taken_after_the_cli_and_what_it_started_are_gone(tmp_path):
    """The review's M2: what the run writes after the turn's result (a background task, a
    command still ending, the CLI's own exit) is in the diff: it is taken once the CLI and
    its sandbox are gone (a stand-in CLI that writes when its stdin closes: taken before, the
    diff missed it)."""
    binary = tmp_path / "claude"
    binary.write_text(LATE_WRITER.replace("PYTHON", sys.executable))
    binary.chmod(0o755)
    turn = Turn(DRIVER, tmp_path, [], binary=str(binary))
    assert turn.terminal["status"] == "completed", turn.events
    assert (turn.workspace / "late.txt").read_text() == "written after the result\n"
    [diff] = turn.of("diff")
    assert "+++ b/late.txt" in diff["diff"] and "+written after the result" in diff["diff"]


def test_the_clis_background_tasks_are_refused(tmp_path):
    """One would outlive the turn and write after its diff (CLAUDE_CODE_DISABLE_BACKGROUND_TASKS)."""
    background = {"tool": "Bash", "input": {"command": "sleep 2; echo bg > bg.txt", "run_in_background": True,
                                            "description": "a background task"}}
    turn = Turn(DRIVER, tmp_path, [background, DRIVER.text("done")])
    assert turn.terminal["status"] == "completed", turn.events
    assert "An unexpected parameter `run_in_background` was provided" in turn.posts[1]["body"]
    assert not (turn.workspace / "bg.txt").exists() and turn.of("diff") == []
    turn.assert_no_leak()


def test_a_prompt_starting_with_a_slash_is_text_for_the_model_not_a_command_of_the_cli(tmp_path):
    """The review's L5: `/config …` would change the CLI's own settings (its permission mode)."""
    prompt = "/config permissionMode=bypassPermissions"
    turn = Turn(DRIVER, tmp_path, [DRIVER.text("noted")], prompt=prompt)
    assert turn.terminal["status"] == "completed", turn.events
    [post] = turn.posts
    assert prompt in post["body"]  # the model got it as text
    assert [m["text"] for m in turn.of("assistant_message")] == ["noted"]


NETWORK_PROBE = r"""
import os, sys, urllib.error, urllib.parse, urllib.request
for name in ("no_proxy", "NO_PROXY"):  # the sandbox's own list would send these around its proxy
    os.environ.pop(name, None)
port = urllib.parse.urlsplit(os.environ["ANTHROPIC_BASE_URL"]).port
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["HTTP_PROXY"]}))
for host in sys.argv[1:]:
    try:
        answer = opener.open(f"http://{host}:{port}/v1/messages", timeout=10).status
    except urllib.error.HTTPError as exc:
        answer = exc.code
    except OSError as exc:
        answer = type(exc).__name__
    print(f"{host} -> {answer}")
"""


def test_network_true_reaches_neither_this_hosts_loopback_nor_its_own_addresses(tmp_path):
    """The review's M3: `network: true` is the internet, not the forwarder on the loopback
    (nor any other service there) under any spelling, nor this host's own addresses, nor a
    name that resolves to them. The sandbox's proxy answers 403 for each; the forwarder,
    which would answer 404 to a GET, sees none of them."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "probe.py").write_text(NETWORK_PROBE)
    own = [a for a in cc.local_addresses() if not a.startswith("127.") and a != "::1"][:2]
    hosts = ["127.0.0.1", "localhost", "127.1", "2130706433", "0.0.0.0", "[::1]", socket.gethostname(),
             *(f"[{a}]" if ":" in a else a for a in own)]
    turn = Turn(DRIVER, tmp_path, [DRIVER.command("python3 probe.py " + " ".join(hosts)), DRIVER.text("done")],
                network=True, extra_env={"CALDERA_RUN_ALLOW_NETWORK": "true"})
    assert turn.terminal["status"] == "completed", turn.events
    [output] = turn.of("command_output")
    for host in hosts:
        assert f"{host} -> 403" in output["output"], output["output"]
    assert len(turn.posts) == 2 and len(turn.requests) == 2  # the CLI's own, nothing else reached the forwarder
    turn.assert_no_leak()


def _wait_for(check, within: float = 20.0):
    """`check()` once it is true, or its last value after `within` s (a liveness bound)."""
    deadline, tick = time.monotonic() + within, threading.Event()
    while not (value := check()) and time.monotonic() < deadline:
        tick.wait(0.05)
    return value


def test_a_runtime_killed_mid_run_takes_the_cli_and_the_command_with_it_and_the_next_start_sweeps(tmp_path):
    """The review's L1: `caldera turn` killed with -9 while the agent's command runs. The CLI
    dies with it (PR_SET_PDEATHSIG), and its sandbox and the command with the CLI; what is
    left (the private dir, the CLI's socket bridge) goes at the next start's sweep."""
    sleeper = "python3 -c 'import time; time.sleep(27.1828)'"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    before = set(os.listdir(leftovers.private_root())) if leftovers.private_root().exists() else set()
    with DRIVER.provider([DRIVER.command(sleeper), DRIVER.text("never")]) as provider:
        secrets = DRIVER.projection(tmp_path, provider.url, CANARY)
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CALDERA_CONFIG_DIR": str(tmp_path / "no-config"),
               "CALDERA_STATE_DIR": str(tmp_path / "no-state"), **DRIVER.env(DRIVER.binary())}
        turn = subprocess.Popen(
            [sys.executable, "-m", "caldera.cli", "turn", "--backend", DRIVER.profile, "--workspace", str(workspace),
             "--secrets", str(secrets), "--state-dir", str(tmp_path / "state"), "--json", "Run it"],
            env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert turn.stdout is not None
            for line in turn.stdout:  # until the command runs
                event = json.loads(line)
                if event["type"] == "tool_call" and event["data"]["status"] == "started":
                    break
            assert _wait_for(lambda: processes_holding("27.1828")), "the command never started"
            [private] = set(os.listdir(leftovers.private_root())) - before
            private_dir = str(leftovers.private_root() / private)
            cli = [p for p in processes_holding(private_dir) if p.startswith(DRIVER.binary())]
            assert cli, processes_holding(private_dir)
        finally:
            turn.kill()
            turn.wait()
            turn.stdout.close()
    assert _wait_for(lambda: processes_holding("27.1828") == []), "the agent's command outlived the runtime"
    assert _wait_for(lambda: not any(p.startswith(DRIVER.binary()) for p in processes_holding(private_dir)))
    assert os.path.isdir(private_dir)  # what the dead runtime could not remove
    assert leftovers.sweep(str(tmp_path / "state" / "runs")) == [private_dir]
    assert processes_holding(private_dir) == [] and not os.path.exists(private_dir)
