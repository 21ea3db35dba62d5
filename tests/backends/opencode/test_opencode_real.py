"""The OpenCode backend's own scenarios with the real CLI (`opencode serve`, opencode-ai
1.18.33) against a fake chat-completions provider on 127.0.0.1: what the contract suite
(test_backends_contract.py) does not ask of every backend. The policy as bubblewrap enforces
it (a command writing outside the workspace, connecting to a loopback port, reading the
runtime's secrets), and Bash denied where nothing can confine it; edits and their diff;
OpenCode's retries against a gateway that lies or stalls (a provider nothing answers:
test_opencode_parts, the forwarder's 502); the server
surviving a timeout; asks rejected; a refused model; AGENTS.md. `.ci/install-opencode.sh`
installs the CLI; without CALDERA_OPENCODE_BIN these tests skip, unless
CALDERA_REQUIRE_OPENCODE=1 makes that a failure. The turns share one agent's server (a
`ServerOwner`, as the daemon holds it) and one provider.
"""
from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from backends_fake_chat import FakeChat as FakeChatProvider
from backends_helpers import execute, of_type
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
from caldera.backends.opencode.owner import ServerOwner
from caldera.backends.opencode.route import process_secret


class Harness:
    """One agent: its fake provider, its projection, its server owner, its workspace."""

    def __init__(self, root: Path, provider: FakeChatProvider):
        self.root = root
        self.provider = provider
        self.secrets = write_projection(root, provider.url)
        self.owner = ServerOwner(root / "state" / "runs", idle_seconds=600)
        self.ws = root / "ws"
        self.ws.mkdir(exist_ok=True)
        self.count = 0

    def env(self, **extra: str) -> Any:
        return environment(self.root, self.secrets, owner=self.owner, **extra)

    def run(self, script: list[dict[str, Any]], prompt: str = "Say hello", env: Any = None, ws: Path | None = None,
            **policy: Any) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
        self.provider.set_script(script)
        self.count += 1
        env = env or self.env()
        result, events = execute(request(ws or self.ws, run_id=f"run-{self.count}", prompt=prompt, **policy), env,
                                 roots=None)
        return result, events, env

    def command(self, script: str, env: Any = None, ws: Path | None = None,
                **policy: Any) -> tuple[str, list[dict[str, Any]]]:
        """One Bash command running `script` (a file in the workspace: OpenCode asks about a
        command that names a path outside the workspace itself): (its output, the events)."""
        (ws or self.ws).joinpath("probe.sh").write_text(script)
        result, events, env = self.run([{"call": "bash", "args": {"command": "sh probe.sh", "description": "probe"}},
                                        {"text": "done"}], env=env, ws=ws, **policy)
        assert terminal(events)["status"] == "completed", events
        [output] = of_type(events, "command_output")
        return output["output"], events


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    require_opencode()
    root = tmp_path_factory.mktemp("opencode-agent")
    with FakeChatProvider([{"text": "unused"}]) as provider:
        harness = Harness(root, provider)
        yield harness
        harness.owner.close()
    assert not list((root / "state" / "runs").iterdir())  # every server dir removed


@pytest.fixture
def agent(shared):
    require_opencode()
    return shared


def test_edits_are_file_changes_and_one_diff(agent):
    (agent.ws / "README.md").write_text("hello\n")
    script = [
        {"call": "write", "args": {"filePath": str(agent.ws / "NEW.txt"), "content": "new file\n"}},
        {"call": "edit", "args": {"filePath": str(agent.ws / "README.md"), "oldString": "hello",
                                  "newString": "hello world"}},
        {"text": "done"}]
    result, events, env = agent.run(script)
    assert terminal(events)["status"] == "completed", events
    diff = of_type(events, "diff")
    assert len(diff) == 1 and "+hello world" in diff[0]["diff"] and "NEW.txt" in diff[0]["diff"]
    assert (agent.ws / "README.md").read_text() == "hello world\n" and (agent.ws / "NEW.txt").exists()
    changes = [t["changes"] for t in of_type(events, "tool_call")
               if t["tool"] == "file_change" and t["status"] == "completed"]
    assert [{"path": str(agent.ws / "NEW.txt"), "kind": "add"}] in changes
    assert_no_leak(result, events, env, agent.provider)


# A script the test writes into the workspace: OpenCode asks (and so rejects) a command that
# names a path outside the workspace itself; a script's paths it does not see.
PROBE = ("echo in > inside.txt; echo out > {outside}; echo write=$?\n"
         "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 5); print(\"connected\")'\n"
         "cat {key} || echo no-key\necho config-routes=$(cat \"$OPENCODE_CONFIG\" | grep -c /r/)\n"
         "[ -z \"$OPENCODE_SERVER_PASSWORD\" ] && echo no-server-password\n"
         "grep -l OPENCODE_SERVER_PASSWORD /proc/[0-9]*/environ 2>/dev/null || echo no-server-process\n")


def _probe(agent: Any, tmp: Path, env: Any = None, **policy: Any) -> tuple[str, list[dict[str, Any]], int]:
    """One Bash command that tries what the policy forbids: (its output, the events, the
    connections a loopback listener of the test's accepted)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.5)
        (agent.ws / "probe.sh").write_text(PROBE.format(outside=tmp / "outside.txt", port=listener.getsockname()[1],
                                                        key=agent.secrets / "opencode" / "env" / KEY_ENV))
        result, events, env = agent.run([{"call": "bash", "args": {"command": "sh probe.sh", "description": "probe"}},
                                         {"text": "done"}], env=env, **policy)
        accepted = 0
        try:
            while True:
                listener.accept()[0].close()
                accepted += 1
        except OSError:
            pass  # nothing more waits
    assert terminal(events)["status"] == "completed", events
    [output] = of_type(events, "command_output")
    return output["output"], events, accepted


def test_bubblewrap_keeps_commands_in_the_workspace_off_the_network_and_out_of_the_secrets(agent, tmp_path):
    output, events, accepted = _probe(agent, tmp_path)
    assert of_type(events, "backend_status")[0]["commands"] == "confined (bubblewrap), no network"
    assert (agent.ws / "inside.txt").read_text() == "in\n"  # the workspace is writable
    assert not (tmp_path / "outside.txt").exists() and "Directory nonexistent" in output  # /tmp: hidden
    assert accepted == 0 and "connected" not in output  # not even the host's loopback
    assert "no-key" in output and CANARY not in output  # the projection is hidden
    assert "config-routes=0" in output  # the server's config (the forwarder's routes) cannot be read
    assert "no-server-password" in output  # the server's API cannot be used
    assert "no-server-process" in output  # nor its password read in its /proc/PID/environ



def test_a_command_has_no_capability_and_cannot_read_the_servers_password(agent):
    # as root (CI), bubblewrap keeps every capability unless told: a command could remount /
    output, events = agent.command(
        "grep CapEff /proc/self/status\n"
        "mount -o remount,rw / 2>/dev/null && echo remounted\n"
        "for f in /proc/1/environ /proc/self/environ; do tr '\\0' '\\n' < $f | grep -c SERVER_PASSWORD; done\n")
    password = agent.owner.server.password
    assert "CapEff:\t0000000000000000" in output and "remounted" not in output
    assert password not in output
    assert [line for line in output.splitlines() if line.isdigit()] == ["0", "0"]  # pid 1 (bwrap's) and its own


def test_a_command_cannot_change_or_read_the_servers_dir_other_agents_state_or_host_sockets(agent, tmp_path):
    server = agent.owner.server
    other = tmp_path / "other-agent" / "state"
    other.mkdir(parents=True)
    (other / "session.json").write_text('{"agent_token": "OTHER-AGENTS-TOKEN"}')
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.sock"))
    sock.listen(4)
    sock.settimeout(0.5)
    with sock:
        output, events = agent.command(
            "printf '#!/bin/sh\\nexec /bin/bash \"$@\"\\n' > \"$SHELL\"\n"
            "mkdir -p \"$XDG_CONFIG_HOME/opencode\" && echo PLANTED > \"$XDG_CONFIG_HOME/opencode/AGENTS.md\"\n"
            f"cat {other}/session.json || echo no-other-state\n"
            "cat \"$XDG_DATA_HOME\"/opencode/opencode.db* 2>/dev/null | grep -ac SECRET-PROMPT-31\n"
            f"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{tmp_path}/s.sock\"); "
            "print(\"unix-connected\")'\n", )
        accepted = 0
        try:
            sock.accept()[0].close()
            accepted += 1
        except OSError:
            pass
    assert "bubblewrap" in (server.dir / "bin" / "bash").read_text()  # the wrapper is still caldera's
    assert not (server.dir / "config" / "opencode" / "AGENTS.md").exists()
    assert "OTHER-AGENTS-TOKEN" not in output and "no-other-state" in output
    assert list((server.dir / "data" / "opencode").glob("opencode.db*"))  # there, and not to be read:
    result, events, env = agent.run([{"text": "ok"}], prompt="remember SECRET-PROMPT-31")
    output, events = agent.command("cat \"$XDG_DATA_HOME\"/opencode/opencode.db* 2>/dev/null "
                                   "| grep -ac SECRET-PROMPT-31 "
                                   "|| echo no-transcripts\n")
    assert "no-transcripts" in output
    assert accepted == 0 and "unix-connected" not in output






def _plugin(marker: Path) -> str:
    return f'require("fs").writeFileSync({json.dumps(str(marker))}, "ran"); export const P = async () => ({{}})\n'


@pytest.mark.parametrize("where", ["workspace", "parent", "escaped-key", "commented-key"])
def test_a_plugin_in_the_workspace_or_a_parent_refuses_the_turn_and_never_runs(agent, where):
    # OpenCode imports .opencode/plugin/*.js, and the plugins its opencode.json[c] names, into
    # its own process: no flag stops it. The marker is in the workspace: the server's sandbox
    # hides the rest of /tmp, where a plugin's write would land unseen.
    marker = agent.ws / f"PLUGIN-RAN-{where}"
    base = agent.ws if where != "parent" else agent.root
    plugin = base / ".opencode" / "plugin" / "p.js"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(_plugin(marker))
    if where.endswith("-key"):  # not in a plugin dir: named by a config that hides its key
        plugin = plugin.rename(base / ".opencode" / "p.js")
        spec = json.dumps(f"file://{plugin}")
        if where == "escaped-key":
            plugin = base / "opencode.json"
            plugin.write_text('{"plug\\u0069n": [' + spec + "]}")
        else:
            plugin = base / "opencode.jsonc"
            plugin.write_text('{"plugin" /* c */ : [' + spec + "]}")
    try:
        result, events, env = agent.run([{"text": "never"}])
    finally:
        shutil.rmtree(base / ".opencode")
        for name in ("opencode.json", "opencode.jsonc"):
            (base / name).unlink(missing_ok=True)
    data = terminal(events)
    assert not marker.exists()
    assert data["status"] == "blocked" and str(plugin) in data["message"], events






def test_opencodes_own_file_tools_follow_no_symlink_out_of_the_sandbox(agent):
    # read/write/edit run in the server's process, not in a command: the server has its own sandbox
    (agent.root / "state").mkdir(exist_ok=True)
    (agent.root / "state" / "session.json").write_text('{"agent_token": "SESSION-TOKEN-SYM-9"}')
    (agent.root / "outside").mkdir(exist_ok=True)
    links = {"key.txt": agent.secrets / "opencode" / "env" / KEY_ENV,
             "sess.txt": agent.root / "state" / "session.json", "out": agent.root / "outside"}
    for name, target in links.items():
        (agent.ws / name).symlink_to(target)
    before = len(agent.provider.requests)
    try:
        result, events, env = agent.run([
            {"call": "read", "args": {"filePath": str(agent.ws / "key.txt")}},
            {"call": "read", "args": {"filePath": str(agent.ws / "sess.txt")}},
            {"call": "write", "args": {"filePath": str(agent.ws / "out" / "written.txt"), "content": "escaped\n"}},
            {"text": "done"}])
    finally:
        for name in links:
            (agent.ws / name).unlink()
    assert terminal(events)["status"] == "completed", events
    bodies = "\n".join(r["body"] for r in agent.provider.requests[before:])
    assert CANARY not in bodies and "SESSION-TOKEN-SYM-9" not in bodies
    assert list((agent.root / "outside").iterdir()) == []


def test_opencodes_write_tool_cannot_rewrite_the_wrapper_or_plant_config_through_a_symlink(agent):
    # a command knows the server's dir ($SHELL, $HOME) and may link to it from the workspace;
    # the server's own write tool follows the link: the wrapper would run the next command bare
    output, events = agent.command('ln -s "$SHELL" w; ln -s "$(dirname "$SHELL")/workspaces" l; '
                                   'ln -s "$XDG_CONFIG_HOME" c; ln -s "$HOME" h; ln -s "$HOME/../server.json" s; '
                                   'ln -s "$HOME/../.owner" o; echo linked\n')
    server = agent.owner.server
    assert "linked" in output and server.launch.sandbox.server  # bubblewrap nests here (CI: it must)
    wrapper = (server.dir / "bin" / "bash").read_text()
    claims = [(server.dir / name).read_text() for name in ("server.json", ".owner")]
    try:
        result, events, env = agent.run([
            {"call": "write", "args": {"filePath": str(agent.ws / "w"), "content": "#!/bin/sh\nexec bash \"$@\"\n"}},
            {"call": "write", "args": {"filePath": str(agent.ws / "l"), "content": "w:/\n"}},
            {"call": "write", "args": {"filePath": str(agent.ws / "c" / "opencode" / "plugin" / "p.js"),
                                       "content": "export const P = async () => ({})\n"}},
            {"call": "write", "args": {"filePath": str(agent.ws / "h" / ".opencode" / "plugin" / "p.js"),
                                       "content": "export const P = async () => ({})\n"}},
            {"call": "write", "args": {"filePath": str(agent.ws / "s"), "content": '{"pid": 1, "start_time": 1}'}},
            {"call": "write", "args": {"filePath": str(agent.ws / "o"), "content": "1 1\n"}},
            {"text": "done"}])
    finally:
        for name in ("w", "l", "c", "h", "s", "o"):
            (agent.ws / name).unlink()
    assert terminal(events)["status"] == "completed", events
    assert agent.owner.server is server and (server.dir / "bin" / "bash").read_text() == wrapper
    assert "w:/\n" not in (server.dir / "bin" / "workspaces").read_text()
    assert not list(server.dir.glob("*/**/plugin/p.js"))
    assert [(server.dir / name).read_text() for name in ("server.json", ".owner")] == claims  # a sweep's pids


def test_the_servers_password_and_route_tokens_never_reach_the_model_through_a_symlink(agent):
    # the server's read tool follows a link to its own environment or its config: the forwarder masks them
    (agent.ws / "e").symlink_to("/proc/self/environ")
    (agent.ws / "t").symlink_to("/proc/thread-self/environ")
    try:
        agent.run([{"text": "start"}])
        server = agent.owner.server
        (agent.ws / "c").symlink_to(server.dir / "opencode.json")
        before = len(agent.provider.requests)
        result, events, env = agent.run([{"call": "read", "args": {"filePath": str(agent.ws / name)}}
                                         for name in ("e", "t", "c")] + [{"text": "done"}])
    finally:
        for name in ("e", "t", "c"):
            (agent.ws / name).unlink(missing_ok=True)
    assert terminal(events)["status"] == "completed", events
    bodies = "\n".join(r["body"] for r in agent.provider.requests[before:])
    assert "OPENCODE_SERVER_PASSWORD=[REDACTED]" in bodies and '"baseURL' in bodies  # read, and masked
    assert server.password not in bodies and process_secret() not in bodies


@pytest.mark.parametrize("entry,kind,words", [
    ({"raw": "<html>Welcome to the captive portal</html>"}, fk.PROVIDER_UNAVAILABLE, "ended before it was complete"),
    ({"status": 429, "headers": {"Retry-After": "100"}, "body": {"error": {"message": "slow down"}}},
     fk.PROVIDER_RATE_LIMITED, "would wait 100 s"),
    ({"status": 404, "body": {"error": {"message": "no such model"}}}, fk.BACKEND_FAILED, "HTTP 404"),
], ids=["html-200", "retry-after-100", "404"])
def test_a_gateway_that_lies_or_stalls_ends_the_turn_with_a_kind(agent, entry, kind, words):
    result, events, env = agent.run([entry])
    data = terminal(events)
    assert data["status"] == "failed" and data["failure_kind"] == kind and words in data["message"], events


def test_policy_timeout_on_a_stalled_provider_is_backend_timeout(agent):
    result, events, env = agent.run([{"stall": 60}], timeout_seconds=1)
    data = terminal(events)
    assert data["status"] == "failed" and data["failure_kind"] == fk.BACKEND_TIMEOUT, events
    assert any(s["phase"] == "interrupting" and s["reason"] == "timeout" for s in of_type(events, "backend_status"))
    # The server survives a turn's timeout: the next turn runs on it.
    result, events, env = agent.run([{"text": "still here"}])
    assert terminal(events)["status"] == "completed"
    assert of_type(events, "backend_status")[1]["server"] == "reused"


def test_read_only_policy_takes_bash_and_edits_away(agent):
    (agent.ws / "keep.txt").write_text("keep\n")
    result, events, env = agent.run([{"call": "bash", "args": {"command": "rm keep.txt", "description": "x"}},
                                     {"text": "could not"}], sandbox="read-only")
    assert terminal(events)["status"] == "completed", events
    tools = [t["name"] for t in _request_tools(agent.provider.main[-1])]
    assert "bash" not in tools and "edit" not in tools and "write" not in tools and "read" in tools
    assert (agent.ws / "keep.txt").exists()
    assert not of_type(events, "command_output")


def test_an_ask_is_rejected_and_reported_and_the_turn_goes_on(agent):
    # Reading outside the workspace is an ask in OpenCode (external_directory); approval never: rejected.
    outside = agent.root / "outside.txt"
    outside.write_text("secret-ish\n")
    result, events, env = agent.run([{"call": "read", "args": {"filePath": str(outside)}}, {"text": "ok"}])
    assert terminal(events)["status"] == "completed", events
    approvals = [t for t in of_type(events, "tool_call") if t["tool"] == "approval"]
    assert len(approvals) == 1 and approvals[0]["status"] == "declined"
    assert approvals[0]["request"] == "permission/external_directory"
    assert "secret-ish" not in agent.provider.main[-1]["body"]
    assert "allows no approvals" in agent.provider.main[-1]["body"]  # the model was told why
    assert of_type(events, "assistant_message")[-1]["text"] == "ok"


def test_a_model_the_projection_does_not_offer_is_refused(agent):
    agent.provider.set_script([{"text": "never"}])
    before = len(agent.provider.requests)
    req = dict(request(agent.ws, run_id="other-model"), model="gpt-nope")
    result, events = execute(req, agent.env())
    data = terminal(events)
    assert data["status"] == "blocked" and "gpt-nope" in data["message"] and "fake-model" in data["message"]
    assert len(agent.provider.requests) == before


def test_instructions_from_agents_md_reach_the_model_and_a_symlink_does_not(agent):
    (agent.ws / "AGENTS.md").write_text("Always answer in haiku. ZEBRA-42\n")
    result, events, env = agent.run([{"text": "ok"}])
    assert terminal(events)["status"] == "completed"
    assert "ZEBRA-42" in agent.provider.main[-1]["body"]
    (agent.ws / "AGENTS.md").unlink()
    (agent.root / "elsewhere.md").write_text("LEAKED-FILE-77\n")
    (agent.ws / "AGENTS.md").symlink_to(agent.root / "elsewhere.md")
    result, events, env = agent.run([{"text": "ok"}])
    assert terminal(events)["status"] == "completed"
    assert "LEAKED-FILE-77" not in agent.provider.main[-1]["body"]
    (agent.ws / "AGENTS.md").unlink()


# From here on each test replaces the shared server (a poisoned one, another launch): last.
def test_a_plugin_a_command_plants_stops_the_server_and_refuses_the_next_turn(agent):
    marker = agent.root / "PLUGIN-RAN-planted"
    output, events = agent.command(f"mkdir -p .opencode/plugins && cat > .opencode/plugins/x.js <<'X'\n"
                                   f"{_plugin(marker)}X\necho planted\n")
    assert "planted" in output and agent.owner.server is None  # poisoned: stopped once free
    try:
        result, events, env = agent.run([{"text": "never"}])
        data = terminal(events)
        assert data["status"] == "blocked" and ".opencode/plugins/x.js" in data["message"], events
    finally:
        shutil.rmtree(agent.ws / ".opencode")
    assert not marker.exists()


def test_a_command_writes_only_in_its_own_turns_workspace(agent, tmp_path):
    # one server serves every workspace under the roots; a command writes only in its turn's
    roots = agent.root / "roots"
    (roots / "one").mkdir(parents=True)
    (roots / "two").mkdir()
    (roots / "two" / "theirs.txt").write_text("theirs\n")
    env = agent.env(CALDERA_WORKSPACE_ROOTS=str(roots))
    output, events = agent.command(f"echo mine > mine.txt\necho changed > {roots}/two/theirs.txt || echo refused\n"
                                   f"cat {roots}/two/theirs.txt\n", env=env, ws=roots / "one")
    assert (roots / "one" / "mine.txt").read_text() == "mine\n"
    assert (roots / "two" / "theirs.txt").read_text() == "theirs\n"
    assert "refused" in output and "Read-only file system" in output and "theirs" in output  # readable


def test_without_ripgrep_on_path_grep_and_glob_are_denied_never_downloaded(agent, tmp_path):
    # OpenCode downloads ripgrep from GitHub into its data dir when `rg` is not on its PATH
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bwrap", "bash", "true", "sh"):
        found = shutil.which(name)
        assert found, name
        (bin_dir / name).symlink_to(found)
    before = len(agent.provider.main)
    result, events, env = agent.run([{"call": "grep", "args": {"pattern": "x", "path": str(agent.ws)}},
                                     {"text": "done"}], env=agent.env(PATH=str(bin_dir)))
    assert terminal(events)["status"] == "completed", events
    tools = [t["name"] for t in _request_tools(agent.provider.main[before])]
    assert "grep" not in tools and "glob" not in tools and "read" in tools
    [ready] = [s for s in of_type(events, "backend_status") if s["phase"] == "ready"]
    assert "denied" in ready["search"] and "ripgrep" in ready["search"]
    assert not [t for t in of_type(events, "tool_call") if t.get("tool") == "grep" and t["status"] == "completed"]


def test_network_true_lets_a_command_connect_and_still_confines_its_writes(agent, tmp_path):
    # last in this module: another launch (its network), so the shared server is replaced
    output, events, accepted = _probe(agent, tmp_path, network=True, env=agent.env(CALDERA_RUN_ALLOW_NETWORK="true"))
    assert of_type(events, "backend_status")[0]["commands"] == "confined (bubblewrap)"
    assert accepted == 1 and "connected" in output
    assert not (tmp_path / "outside.txt").exists() and "Directory nonexistent" in output
    assert "no-key" in output and "no-server-password" in output


def _request_tools(req: dict[str, Any]) -> list[dict[str, Any]]:
    body = json.loads(req["body"])
    return [t["function"] for t in body.get("tools") or []]
