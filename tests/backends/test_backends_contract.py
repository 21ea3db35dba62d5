"""T1-T3 of seed 003 against every backend: its real CLI, its own local fake provider.

One suite, parametrised by the drivers of backends_drivers.py (Codex, Claude Code, OpenCode;
another backend joins with one driver). Each scenario plants a canary key in the projection: it
must reach the provider (the key is used) and nothing else: events, finish result, run log
(the CLI's stderr included), what the model was sent (so the agent's own commands never
saw it), and nothing may be left: the run directory and any private TMPDIR gone, no
process holding the run's HOME (after a timeout and an interrupt too), nothing of the run on
what a backend keeps between runs (OpenCode's server: the scenarios share one, as an agent's
runs do under the daemon).

A driver whose CLI is missing skips, unless its CALDERA_REQUIRE_<BACKEND>=1 (CI sets it):
then the missing CLI fails the suite.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from backends_drivers import CANARY, DRIVERS, SUITE_TMP, close_all, ready

from caldera.backends import base, service
from caldera.backends import failures as fk
from caldera.redact import Redactor


@pytest.fixture(scope="module", autouse=True)
def _drivers_closed():
    yield
    close_all()


@pytest.fixture(scope="module")
def suite_tmpdir(tmp_path_factory):
    """The runtime's TMPDIR for the suite: one, as a runtime's is (OpenCode's server hides
    Claude Code's private dirs below it: another one would launch another server). Short:
    the sandbox's bridge sockets live below it, and a socket's path is at most 108 bytes.
    After tmp_path_factory: pytest's base temp dir is chosen by then, not in this one."""
    tmp_path_factory.getbasetemp()
    tmpdir = Path(tempfile.mkdtemp(prefix="t-", dir=SUITE_TMP))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmpdir))
        patch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
        yield tmpdir
    shutil.rmtree(tmpdir, ignore_errors=True)


@pytest.fixture(autouse=True)
def run_tmpdir(suite_tmpdir):
    """After every scenario the runtime's TMPDIR is empty, and no process holds it (Claude
    Code's private dirs live below it, and left their root behind)."""
    yield suite_tmpdir
    assert list(suite_tmpdir.iterdir()) == []
    assert processes_holding(str(suite_tmpdir)) == []


@pytest.fixture(params=sorted(DRIVERS), ids=sorted(DRIVERS))
def driver(request):
    return ready(request.param)[0]


class Turn:
    """One run of a scenario: its finish result, every event, and the provider's record."""

    def __init__(self, driver, tmp: Path, script: list[dict], key: str | None = CANARY, binary: str | None = None,
                 extra_env: dict | None = None, interrupt: bool = False, workspace: Path | None = None,
                 config_dir: Path | None = None, state_dir: Path | None = None, fields: dict | None = None,
                 prompt: str = "Do the thing", **policy):
        """`config_dir` holds the projection (tmp by default), `state_dir` the logs and runs
        (tmp/state); `fields` are more of the Environment's (its roots)."""
        self.tmp = tmp
        self.driver = driver
        self.workspace = workspace or tmp / "ws"
        self.workspace.mkdir(exist_ok=True, parents=True)
        state = state_dir or tmp / "state"
        with driver.provider(script) as provider:
            secrets = driver.projection(config_dir or tmp, provider.url, key)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            env.update(driver.env(binary or driver.binary()))
            env.update(extra_env or {})
            self.environment = base.Environment(
                redactor=Redactor(), logs_dir=str(state / "logs"), runs_dir=str(state / "runs"),
                secrets_dir=str(secrets), env=env, servers=driver.servers(binary or driver.binary()),
                **(fields or {}))
            request = {"run_id": "run-1", "prompt": prompt, "workspace": str(self.workspace),
                       "backend_profile": driver.profile,
                       "execution_policy": dict({"timeout_seconds": 60}, **policy)}
            self.events: list[dict] = []
            registry = service.ActiveRuns()
            stopper = threading.Thread(target=self._interrupt, args=(registry, provider), daemon=True)
            if interrupt:
                stopper.start()
            self.result = service.execute(request, self.environment, roots=None, listeners=[self.events.append],
                                          registry=registry)
            self.requests = list(provider.requests)
            self.posts = list(provider.posts)

    def _interrupt(self, registry, provider):
        """Once the provider holds the request (a stalled answer), interrupt the run."""
        stop = threading.Event()
        while not provider.posts and not stop.wait(0.05):
            pass
        stop.wait(0.3)  # the answer's first bytes reach the CLI
        handle = registry.get("run-1")
        if handle is not None:
            handle.interrupt()

    @property
    def terminal(self) -> dict:
        kinds = [e["type"] for e in self.events]
        assert kinds.count("terminal_status") == 1 and kinds[-1] == "terminal_status", kinds
        return self.events[-1]["data"]

    def of(self, kind: str) -> list[dict]:
        return [e["data"] for e in self.events if e["type"] == kind]

    def assert_no_leak(self) -> None:
        log = Path(self.result["log"]).read_text()
        text = "\n".join([json.dumps(self.events), json.dumps(self.result), log])
        assert CANARY not in text
        for req in self.requests:
            assert CANARY not in req["body"]  # the model never saw it: no command of the agent printed it
        self.assert_nothing_left(log)

    def assert_nothing_left(self, log: str) -> None:
        """The run's private dirs are gone and no process of the run is left: none has the
        run dir or a private HOME in its environment (every process a CLI starts, the
        agent's commands included, inherits its HOME), nor anything else of the run's."""
        runs = Path(self.environment.runs_dir)
        assert not runs.exists() or list(runs.iterdir()) == []
        assert self.driver.leftovers(self.workspace) == []
        assert_nothing_left(Path(self.environment.runs_dir, "run-1"), log)


def assert_nothing_left(run_dir: Path, log: str) -> None:
    assert not run_dir.exists()  # HOME, config: removed
    private = re.findall(r"(?:HOME|TMPDIR) (/\S+)", log)  # a private HOME and TMPDIR outside the run dir
    for path in private:
        assert not Path(path).exists(), path
    for marker in [str(run_dir), *private]:
        assert processes_holding(marker) == [], marker


def processes_holding(marker: str) -> list[str]:
    """The command lines of live processes whose environment or command line holds `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as env, open(f"/proc/{pid}/cmdline", "rb") as cmd:
                environ, cmdline = env.read(), cmd.read()
        except OSError:
            continue  # gone, or not ours to read
        if marker.encode() in environ or marker.encode() in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode("utf-8", "replace"))
    return found


def test_text_turn(driver, tmp_path):
    turn = Turn(driver, tmp_path, [driver.text("Hello from the fake model.")])
    assert turn.terminal["status"] == "completed", turn.events
    assert [m["text"] for m in turn.of("assistant_message")] == ["Hello from the fake model."]
    assert turn.of("backend_status")[0]["phase"] == "starting"
    assert driver.key_seen(turn.posts[0]) == CANARY  # the key was really used, and went nowhere else
    assert turn.result["status"] == "completed" and turn.result["events_total"] == len(turn.events)
    turn.assert_no_leak()


def test_tool_turn_runs_a_command_and_its_environment_holds_no_key(driver, tmp_path):
    script = [driver.command("echo hello; env; echo from-the-agent"), driver.text("done")]
    turn = Turn(driver, tmp_path, script)
    assert turn.terminal["status"] == "completed", turn.events
    [output] = turn.of("command_output")
    assert "hello" in output["output"] and "from-the-agent" in output["output"], output
    assert any(t["tool"] == "command" for t in turn.of("tool_call"))
    assert [m["text"] for m in turn.of("assistant_message")] == ["done"]
    assert len(turn.posts) == 2 and "from-the-agent" in turn.posts[1]["body"]  # the output went back
    driver.check_command_env(turn.posts[1]["body"])  # what `env` printed, as the model got it
    turn.assert_no_leak()


def test_caldera_turn_prints_no_secret(driver, tmp_path):
    """`caldera turn --json` (the CLI front): the agent's command prints its environment and
    the model's answer quotes the key; neither stdout nor stderr nor the run log holds it."""
    script = [driver.command("env; echo from-the-agent"), driver.text(f"I will not say {CANARY}")]
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with driver.provider(script) as provider:
        secrets = driver.projection(tmp_path, provider.url, CANARY)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
               "CALDERA_CONFIG_DIR": str(tmp_path / "no-config"), "CALDERA_STATE_DIR": str(tmp_path / "no-state"),
               "TMPDIR": os.environ["TMPDIR"]}  # run_tmpdir's: empty after the turn
        env.update(driver.env(driver.binary()))
        proc = subprocess.run(
            [sys.executable, "-m", "caldera.cli", "turn", "--backend", driver.profile, "--workspace", str(workspace),
             "--secrets", str(secrets), "--state-dir", str(tmp_path / "state"), "--json", "Run env"],
            env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert events[-1]["type"] == "terminal_status" and events[-1]["data"]["status"] == "completed", events
    assert [e["data"]["text"] for e in events if e["type"] == "assistant_message"] == ["I will not say [REDACTED]"]
    assert "from-the-agent" in json.dumps(events)
    [log] = (tmp_path / "state" / "logs").glob("run-*.log")
    assert CANARY not in proc.stdout + proc.stderr + log.read_text()
    assert_nothing_left(tmp_path / "state" / "runs" / events[-1]["run_id"], log.read_text())


@pytest.mark.parametrize("entry,kind", [
    ({"status": 401, "body": {"error": {"type": "authentication_error", "message": f"bad key {CANARY}"}}},
     fk.PROVIDER_AUTH_FAILED),
    ({"status": 403}, fk.PROVIDER_AUTH_FAILED),
    ({"status": 429}, fk.PROVIDER_RATE_LIMITED),
    ({"status": 500}, fk.PROVIDER_UNAVAILABLE),
    ({"status": 503}, fk.PROVIDER_UNAVAILABLE),
    ({"status": 529}, fk.PROVIDER_UNAVAILABLE),
    ({"cut": True}, fk.PROVIDER_UNAVAILABLE),
], ids=["401", "403", "429", "500", "503", "529", "cut-stream"])
def test_provider_failure_has_its_kind(driver, tmp_path, entry, kind):
    turn = Turn(driver, tmp_path, [entry])
    data = turn.terminal
    assert data["status"] == "failed" and data["failure_kind"] == kind, turn.events
    assert [e["failure_kind"] for e in turn.of("error")] == [kind]
    turn.assert_no_leak()  # the 401's body echoed the key: masked


def test_failing_provider_ends_within_a_minute_with_default_retries(driver, tmp_path):
    # The backend's own retry bounds (no test override): a bounded number of requests, then its kind.
    defaults = {name: "" for name in ("CALDERA_CODEX_REQUEST_MAX_RETRIES", "CALDERA_CODEX_STREAM_MAX_RETRIES",
                                      "CALDERA_CLAUDE_CODE_MAX_RETRIES", "CALDERA_OPENCODE_MAX_RETRIES")}
    # The first answer asks for an hour's wait (a backend that caps it waits its cap once);
    # the later ones ask nothing (the CLI's own short backoff): as short as the point allows.
    first = {"status": 529, "headers": {"retry-after": "3600"} if driver.caps_retry_after else {}}
    turn = Turn(driver, tmp_path, [first, {"status": 529}], extra_env=defaults)
    data = turn.terminal
    assert data["failure_kind"] == fk.PROVIDER_UNAVAILABLE, turn.events
    assert 1 <= len(turn.posts) <= driver.default_requests, len(turn.posts)
    assert data["duration_ms"] < 60_000
    turn.assert_no_leak()


def test_missing_key_is_secret_unavailable_before_anything_is_sent(driver, tmp_path):
    turn = Turn(driver, tmp_path, [driver.text("never")], key=None)
    assert turn.terminal["failure_kind"] == fk.SECRET_UNAVAILABLE, turn.events
    assert turn.requests == []


def test_bad_binary_is_spawn_failed_naming_it(driver, tmp_path):
    missing = str(tmp_path / "no-such-cli")
    turn = Turn(driver, tmp_path, [driver.text("never")], binary=missing)
    assert turn.terminal["failure_kind"] == fk.BACKEND_SPAWN_FAILED, turn.events
    assert missing in turn.terminal["message"]


def test_output_that_is_not_json_is_a_parse_error(driver, tmp_path):
    binary = driver.stdout_binary(tmp_path, ["this is not JSON"])
    turn = Turn(driver, tmp_path, [driver.text("never")], binary=binary)
    assert turn.terminal["failure_kind"] == fk.BACKEND_JSON_PARSE_ERROR, turn.events


def test_output_missing_a_field_is_response_invalid(driver, tmp_path):
    binary = driver.stdout_binary(tmp_path, [driver.invalid_line])
    turn = Turn(driver, tmp_path, [driver.text("never")], binary=binary)
    assert turn.terminal["failure_kind"] == fk.BACKEND_RESPONSE_INVALID, turn.events


def test_policy_timeout_during_a_long_command_leaves_no_process(driver, tmp_path):
    # OpenCode's turn may start its server first (1.1-1.2 s to listen, measured in CI's order and
    # alone), and 2 s then ended it before the command started: it gets 8 s, still far inside
    # the command's 31 s
    timeout = 8 if driver.profile == "opencode" else 2
    sleeper = "python3 -c 'import time; time.sleep(31.4159)'"
    turn = Turn(driver, tmp_path, [driver.command(sleeper), driver.text("never")], timeout_seconds=timeout)
    data = turn.terminal
    assert data["status"] == "failed" and data["failure_kind"] == fk.BACKEND_TIMEOUT, turn.events
    assert any(s["phase"] == "interrupting" for s in turn.of("backend_status"))
    events = "\n".join(json.dumps(e)[:300] for e in turn.events)
    assert [t["status"] for t in turn.of("tool_call")][:1] == ["started"], events  # the command was running
    assert processes_holding("31.4159") == []  # the agent's command is gone with the CLI
    turn.assert_no_leak()


def test_interrupt_during_a_stalled_answer_is_cancelled(driver, tmp_path):
    turn = Turn(driver, tmp_path, [{"stall": 30}], interrupt=True)
    data = turn.terminal
    assert data["status"] == "cancelled" and data["failure_kind"] == fk.CANCELLED, turn.events
    assert turn.result["status"] == "cancelled"
    turn.assert_no_leak()


# The backends' retry settings at one retry each: a failure, then one more try.
RETRY_ONCE = {"CALDERA_CODEX_REQUEST_MAX_RETRIES": "0", "CALDERA_CODEX_STREAM_MAX_RETRIES": "1",
              "CALDERA_CLAUDE_CODE_MAX_RETRIES": "1", "CALDERA_OPENCODE_MAX_RETRIES": "1"}


def test_dropped_connections_end_the_turn_saying_so_and_the_next_turn_works(driver, tmp_path):
    """A provider that drops every connection mid-answer (streaming or not, as behind a failing
    load balancer): the turn ends provider-unavailable at once, its error says what the
    provider did and how many tries it took; what the backend keeps between runs (OpenCode's
    shared server) then runs the next turn as before."""
    turn = Turn(driver, tmp_path, [{"drop": True}], extra_env=RETRY_ONCE)
    data = turn.terminal
    assert data["status"] == "failed" and data["failure_kind"] == fk.PROVIDER_UNAVAILABLE, turn.events
    [error] = turn.of("error")
    tries = len(turn.posts)  # one retry (Claude Code adds a non-streaming one): as the provider saw them
    assert 2 <= tries <= 3 and data["duration_ms"] < 30_000, (tries, data)
    assert error["tries"] == tries and f"{tries} tries" in error["message"], error
    turn.assert_no_leak()
    if driver.servers(driver.binary()) is None:
        return  # a process per run: nothing of this one is left to hold up the next
    after = Turn(driver, tmp_path, [driver.text("Back again.")], workspace=tmp_path / "ws-after")
    assert after.terminal["status"] == "completed", after.events
    assert [m["text"] for m in after.of("assistant_message")] == ["Back again."]
    [ready] = [s for s in after.of("backend_status") if s["phase"] == "ready"]
    assert ready["server"] == "reused", ready  # the same server, not a new one


def test_stalled_answer_ends_the_turn_at_the_stall_bound(driver, tmp_path):
    """A provider that answers 200 and then sends nothing: the turn ends when the answer has
    been silent for CALDERA_PROVIDER_STALL_SECONDS, unretried (each retry would wait as long)."""
    env = dict(RETRY_ONCE, CALDERA_PROVIDER_STALL_SECONDS="1")
    turn = Turn(driver, tmp_path, [{"stall": 30, "silent": True}], extra_env=env)
    data = turn.terminal
    assert data["status"] == "failed" and data["failure_kind"] == fk.PROVIDER_UNAVAILABLE, turn.events
    [error] = turn.of("error")
    assert "nothing for 1 s" in error["message"] and error["tries"] == 1, error
    assert len(turn.posts) == 1 and time.monotonic() - turn.posts[0]["at"] < 10, len(turn.posts)
    turn.assert_no_leak()


def test_provider_dropping_every_second_connection_still_completes(driver, tmp_path):
    """Failures are bounded in a row, not in total: two drops, each followed by an answer,
    with one retry allowed."""
    script = [{"drop": True}, driver.command("echo recovered"), {"drop": True}, driver.text("done")]
    turn = Turn(driver, tmp_path, script, extra_env=RETRY_ONCE)
    assert turn.terminal["status"] == "completed", turn.events
    assert [m["text"] for m in turn.of("assistant_message")] == ["done"]
    assert len(turn.posts) == 4 and "recovered" in turn.posts[3]["body"]
    turn.assert_no_leak()
