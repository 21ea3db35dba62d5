"""The backends of the contract test (test_backends_contract.py), one small driver each.

A driver says how to find its real CLI, which local fake provider speaks its protocol,
how a scenario's model turn is written for that provider, and how a run's projection and
environment are laid out. Another backend joins the contract test with one more driver
here and its name in DRIVERS.
"""
from __future__ import annotations

import os
import stat
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from backends_fake_anthropic import FakeAnthropic
from backends_fake_provider import FakeProvider

CANARY = "sk-fake-LEAKCANARY-0123456789abcdef"


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

    invalid_line: str  # a JSON line that lacks a field the protocol requires
    caps_retry_after: bool  # whether a provider's long Retry-After is shortened (else the test sends none)


def printing_binary(tmp: Path, name: str, lines: list[str]) -> str:
    """A CLI stand-in that prints `lines` on stdout (after reading one line of stdin) and exits."""
    data = tmp / f"{name}.lines"
    data.write_text("".join(line + "\n" for line in lines))
    binary = tmp / name
    binary.write_text(f"#!{sys.executable}\nimport sys\nsys.stdin.readline()\n"
                      f"sys.stdout.write(open({str(data)!r}).read())\nsys.stdout.flush()\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return str(binary)


class CodexDriver:
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


class ClaudeCodeDriver:
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


DRIVERS: dict[str, Driver] = {"codex": CodexDriver(), "claude-code": ClaudeCodeDriver()}
