"""The backends of the contract test (test_backends_contract.py), one small driver each.

A driver says how to find its real CLI, which local fake provider speaks its protocol,
how a scenario's model turn is written for that provider, and how a run's projection and
environment are laid out. Another backend joins the contract test with one more driver
here and its name in DRIVERS.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from backends_fake_anthropic import FakeAnthropic
from backends_fake_chat import FakeChat
from backends_fake_provider import FakeProvider

from caldera.backends.opencode.owner import ServerOwner
from caldera.backends.registry import BackendServers

CANARY = "sk-fake-LEAKCANARY-0123456789abcdef"
SUITE_TMP = tempfile.gettempdir()  # the suite's own dirs: not in a scenario's TMPDIR, which must end empty


class Provider(Protocol):
    url: str
    requests: list[dict]
    posts: list[dict]


class Driver(Protocol):
    profile: str  # the backend_profile
    bin_var: str  # the variable naming its binary (CI sets it)
    require_var: str  # CALDERA_REQUIRE_<BACKEND>=1: a missing CLI fails instead of skipping
    default_requests: int  # requests a failing provider gets with the backend's default retries, at most

    def binary(self) -> str | None: ...
    def provider(self, script: list[dict]) -> AbstractContextManager[Any]: ...
    def text(self, text: str) -> dict: ...
    def command(self, cmd: str) -> dict: ...
    def projection(self, root: Path, provider_url: str, key: str | None) -> Path: ...
    def env(self, binary: str) -> dict[str, str]: ...
    def key_seen(self, request: dict) -> str | None: ...
    def stdout_binary(self, tmp: Path, lines: list[str]) -> str: ...

    def check_command_env(self, printed: str) -> None: ...  # what `env` printed in a command of the agent
    def servers(self, binary: str) -> BackendServers | None: ...  # what the daemon would hold between runs
    def leftovers(self, workspace: Path) -> list[str]: ...  # what those still hold of its finished runs
    def close(self) -> None: ...  # at the end of the suite

    invalid_line: str  # a JSON line that lacks a field the protocol requires
    caps_retry_after: bool  # whether a provider's long Retry-After is shortened (else the test sends none)


def interpreter() -> str:
    """The Python a stand-in CLI runs on: the interpreter itself, not a venv's link to it. The
    OpenCode server's sandbox hides /tmp, where a CI checkout and its venv may live; a stand-in
    needs only the standard library."""
    return os.path.realpath(sys.executable)


def printing_binary(tmp: Path, name: str, lines: list[str]) -> str:
    """A CLI stand-in that prints `lines` on stdout (after reading one line of stdin) and exits.
    In tmp/bin: tmp is the agent's config dir, which no box binds whole."""
    tmp = tmp / "bin"
    tmp.mkdir(exist_ok=True)
    data = tmp / f"{name}.lines"
    data.write_text("".join(line + "\n" for line in lines))
    binary = tmp / name
    binary.write_text(f"#!{interpreter()}\nimport sys\nsys.stdin.readline()\n"
                      f"sys.stdout.write(open({str(data)!r}).read())\nsys.stdout.flush()\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return str(binary)


class OneProcessPerRun:
    """A backend that keeps nothing between runs: a run's process is all there is."""

    def servers(self, binary: str) -> BackendServers | None:
        return None

    def leftovers(self, workspace: Path) -> list[str]:
        return []

    def close(self) -> None:
        pass


class CodexDriver(OneProcessPerRun):
    profile = "codex"
    bin_var = "CALDERA_CODEX_BIN"
    require_var = "CALDERA_REQUIRE_CODEX"
    default_requests = 2 * 3  # request_max_retries 1, stream_max_retries 2 (docs/backends.md)
    invalid_line = '{"id": 1}'  # the answer to initialize without a result
    caps_retry_after = False  # Codex honours a provider's Retry-After as it is (codex-notes section 5)

    def binary(self) -> str | None:
        found = os.environ.get(self.bin_var)
        return found if found and os.access(found, os.X_OK) else None

    def provider(self, script: list[dict]) -> FakeProvider:
        return FakeProvider(script)

    def text(self, text: str) -> dict:
        return {"text": text}

    def command(self, cmd: str) -> dict:
        return {"call": "exec_command", "args": {"cmd": cmd}}

    def projection(self, root: Path, provider_url: str, key: str | None) -> Path:
        codex = root / "secrets" / "codex"
        (codex / "env").mkdir(parents=True, exist_ok=True)
        (codex / "config.toml").write_text(
            'model = "gpt-5.5"\nmodel_provider = "fake"\n[model_providers.fake]\nname = "Fake"\n'
            f'base_url = "{provider_url}/v1"\nenv_key = "FAKE_PROVIDER_API_KEY"\nwire_api = "responses"\n')
        if key is not None:
            (codex / "env" / "FAKE_PROVIDER_API_KEY").write_text(key + "\n")
        return root / "secrets"

    def env(self, binary: str) -> dict[str, str]:
        return {self.bin_var: binary, "CALDERA_CODEX_REQUEST_MAX_RETRIES": "0", "CALDERA_CODEX_STREAM_MAX_RETRIES": "0"}

    def key_seen(self, request: dict) -> str | None:
        value = request["headers"].get("authorization") or ""
        return value[len("Bearer "):] if value.startswith("Bearer ") else None

    def stdout_binary(self, tmp: Path, lines: list[str]) -> str:
        return printing_binary(tmp, "codex", lines)

    def check_command_env(self, printed: str) -> None:
        # shell_environment_policy.exclude: not even the variable's name reaches the command
        assert "FAKE_PROVIDER_API_KEY" not in printed and "PATH=" in printed, printed[-2000:]


class ClaudeCodeDriver(OneProcessPerRun):
    profile = "claude-code"
    bin_var = "CALDERA_CLAUDE_CODE_BIN"
    require_var = "CALDERA_REQUIRE_CLAUDE_CODE"
    default_requests = 3 + 1  # CLAUDE_CODE_MAX_RETRIES 2, and one non-streaming fallback
    invalid_line = '{"type": "result", "is_error": false}'  # a result without its subtype
    caps_retry_after = True  # the run's forwarder shortens it

    def binary(self) -> str | None:
        found = os.environ.get(self.bin_var)
        return found if found and os.access(found, os.X_OK) else None

    def provider(self, script: list[dict]) -> FakeAnthropic:
        return FakeAnthropic(script)

    def text(self, text: str) -> dict:
        return {"text": text}

    def command(self, cmd: str) -> dict:
        return {"tool": "Bash", "input": {"command": cmd, "description": "run a command"}}

    def projection(self, root: Path, provider_url: str, key: str | None) -> Path:
        env = root / "secrets" / "claude-code" / "env"
        env.mkdir(parents=True, exist_ok=True)
        (env / "ANTHROPIC_BASE_URL").write_text(provider_url + "\n")
        if key is not None:
            (env / "ANTHROPIC_API_KEY").write_text(key + "\n")
        return root / "secrets"

    def env(self, binary: str) -> dict[str, str]:
        return {self.bin_var: binary, "CALDERA_CLAUDE_CODE_MAX_RETRIES": "0"}

    def key_seen(self, request: dict) -> str | None:
        return request["headers"].get("x-api-key")

    def stdout_binary(self, tmp: Path, lines: list[str]) -> str:
        return printing_binary(tmp, "claude", lines)

    def check_command_env(self, printed: str) -> None:
        # The CLI's environment is the command's: it holds the run's token, worthless outside
        # the run's forwarder, and a loopback URL in place of the provider's.
        assert "ANTHROPIC_API_KEY=caldera-run-" in printed, printed[-2000:]
        assert "ANTHROPIC_BASE_URL=http://127.0.0.1:" in printed


STANDIN_SERVER = """
import http.server, json, socket, sys, time
lines = open(sys.argv[1]).read().splitlines()
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for line in ['{"type": "server.connected", "properties": {}}', *lines]:
            self.wfile.write(b"data: " + line.encode() + b"\\n\\n")
            self.wfile.flush()
            time.sleep(0.2)
        time.sleep(600)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"id": "ses_standin"} if self.path.startswith("/session?") else {}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_DELETE = do_POST
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"opencode server listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
"""


class OpenCodeDriver:
    """OpenCode keeps the agent's server between runs, as the daemon holds it: the scenarios
    share one server (BackendServers, its own runs dir) and one fake provider (one URL, one
    projection dir: the same launch), so that only the first pays the server's start."""

    profile = "opencode"
    bin_var = "CALDERA_OPENCODE_BIN"
    require_var = "CALDERA_REQUIRE_OPENCODE"
    default_requests = 3  # CALDERA_OPENCODE_MAX_RETRIES 2: the third failure ends the turn
    invalid_line = '{"type": "message.updated"}'  # an event without its properties
    caps_retry_after = True  # a retry announced past the turn's 60 s of retries ends it at once

    def __init__(self) -> None:
        self._root: Path | None = None
        self._chat: FakeChat | None = None
        self._servers: BackendServers | None = None
        self._owner: ServerOwner | None = None
        self._roots = ""

    def binary(self) -> str | None:
        found = os.environ.get(self.bin_var)
        return found if found and os.access(found, os.X_OK) else None

    def _home(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="caldera-contract-opencode-", dir=SUITE_TMP))
        return self._root

    def provider(self, script: list[dict]) -> AbstractContextManager[Any]:
        if self._chat is None:
            self._chat = FakeChat(script).__enter__()
        return self._chat.scenario(script)

    def text(self, text: str) -> dict:
        return {"text": text}

    def command(self, cmd: str) -> dict:
        return {"call": "bash", "args": {"command": cmd, "description": "run a command"}}

    def projection(self, root: Path, provider_url: str, key: str | None) -> Path:
        # One projection dir for every scenario; the workspaces below the tests' base dir are
        # the agent's workspace roots (the shared server's commands may write there).
        self._roots = str(root.parent)
        home = self._home() / "secrets" / "opencode"
        shutil.rmtree(home, ignore_errors=True)
        (home / "env").mkdir(parents=True)
        (home / "opencode.json").write_text(json.dumps({
            "provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "Fake",
                                  "options": {"baseURL": provider_url, "apiKey": "{env:FAKE_PROVIDER_API_KEY}"},
                                  "models": {"fake-model": {}}}},
            "model": "fake/fake-model"}))
        if key is not None:
            (home / "env" / "FAKE_PROVIDER_API_KEY").write_text(key + "\n")
        return home.parent

    def env(self, binary: str) -> dict[str, str]:
        return {self.bin_var: binary, "CALDERA_OPENCODE_MAX_RETRIES": "0", "CALDERA_WORKSPACE_ROOTS": self._roots}

    def servers(self, binary: str) -> BackendServers | None:
        if binary != self.binary():  # a stand-in or a missing binary: a server of the run's own
            return None
        if self._servers is None:
            self._servers = BackendServers(self._home() / "state" / "runs")
            self._owner = self._servers.get(self.profile, lambda runs: ServerOwner(runs, idle_seconds=600))
        return self._servers

    def key_seen(self, request: dict) -> str | None:
        value = request["headers"].get("authorization") or ""
        return value[len("Bearer "):] if value.startswith("Bearer ") else None

    def stdout_binary(self, tmp: Path, lines: list[str]) -> str:
        """OpenCode's output is its server's event stream: a stand-in server that says it
        listens and sends `lines` as the events of every stream."""
        (tmp / "events.lines").write_text("".join(line + "\n" for line in lines))
        (tmp / "standin.py").write_text(STANDIN_SERVER)
        binary = tmp / "opencode"
        binary.write_text(f"#!/bin/sh\nexec {interpreter()} {tmp / 'standin.py'} {tmp / 'events.lines'}\n")
        binary.chmod(0o755)
        return str(binary)

    def check_command_env(self, printed: str) -> None:
        # The command runs under bubblewrap with the server's environment less its password:
        # no key, no key name, no password, no ClawManager variable.
        assert "FAKE_PROVIDER_API_KEY" not in printed and "OPENCODE_SERVER_PASSWORD" not in printed, printed[-2000:]
        assert "PATH=" in printed and "OPENCODE_CONFIG=" in printed

    def leftovers(self, workspace: Path) -> list[str]:
        """The sessions of the workspace still on the shared server (each run deletes its own)."""
        server = self._owner.server if self._owner is not None else None
        if server is None or not server.alive():
            return []
        return [str(s.get("id")) for s in server.call("GET", "/session", directory=str(workspace)) or []]

    def close(self) -> None:
        if self._servers is not None:
            self._servers.close()
        if self._chat is not None:
            self._chat.__exit__(None, None, None)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root, self._chat, self._servers, self._owner = None, None, None, None


DRIVERS: dict[str, Driver] = {"codex": CodexDriver(), "claude-code": ClaudeCodeDriver(), "opencode": OpenCodeDriver()}


def ready(name: str) -> tuple[Driver, str]:
    """The driver `name` and its CLI's path; the test skips when the CLI is not installed, or
    fails when its CALDERA_REQUIRE_<BACKEND>=1 (CI sets it)."""
    import pytest

    found = DRIVERS[name]
    binary = found.binary()
    if binary is None:
        reason = f"the real {found.profile} CLI is not available ({found.bin_var} unset or not executable)"
        if os.environ.get(found.require_var) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return found, binary


def close_all() -> None:
    """At the end of a suite: what the drivers keep between its tests (OpenCode's server)."""
    for found in DRIVERS.values():
        found.close()

