"""The code-agent examples the package ships (/usr/share/caldera/examples/code-agents/) and
README's "Code agents" section that uses them (issue 39): the payloads are valid agent_runs, the
projections hold no key and, once a key is put in, each is what its backend plans a run from;
README names the files the examples have and the versions CI pins."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from caldera.backends import failures as fk
from caldera.backends.claude_code import config as claude_config
from caldera.backends.codex import config as codex_config
from caldera.backends.opencode import provider as opencode_provider
from caldera.backends.projection import Projection
from caldera.protocol import schemas

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "code-agents"
BACKENDS = ("codex", "claude-code", "opencode")
KEY = "sk-example-0123456789"


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Code agents\n")
    return text[start:text.index("\n## ", start + 1)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_example_payload_is_an_agent_run_of_its_backend(backend):
    payload = json.loads((EXAMPLES / f"agent-run-{backend}.json").read_text())
    schemas.validate("commands/agent_run.schema.json", payload)
    assert payload["backend_profile"] == backend and payload["run_id"] == f"example-{backend}-1"
    assert payload["workspace"].startswith("/srv/code-agents/")  # README's workspace root


def test_the_example_projections_hold_no_key():
    keys = [p for p in EXAMPLES.rglob("*") if p.is_file() and re.search(r"_(API_KEY|AUTH_TOKEN)$", p.name)]
    assert {p.relative_to(EXAMPLES).as_posix() for p in keys} == {
        "secrets/codex/env/OPENAI_API_KEY", "secrets/claude-code/env/ANTHROPIC_API_KEY",
        "secrets/opencode/env/OPENAI_API_KEY"}
    assert all(p.stat().st_size == 0 for p in keys)
    for path in EXAMPLES.rglob("*"):
        if path.is_file():
            assert not re.search(r"sk-[A-Za-z0-9]{8}", path.read_text()), path


def with_key(tmp_path: Path) -> Path:
    secrets = tmp_path / "secrets"
    shutil.copytree(EXAMPLES / "secrets", secrets)
    for key in secrets.rglob("*_API_KEY"):
        key.write_text(KEY + "\n")
    return secrets


def test_each_backend_plans_its_run_from_the_example_once_the_key_is_in(tmp_path):
    secrets = with_key(tmp_path)
    codex = codex_config.plan_provider(Projection.locate(secrets, backend="codex"), {})
    assert codex.source == "projection" and codex.base_url == "https://api.openai.com/v1"
    assert KEY in codex.secret_values and codex.env == {"OPENAI_API_KEY": KEY}
    claude = claude_config.plan_provider(Projection.locate(secrets, backend="claude-code"), {}, with_proxy=False)
    assert claude.key == KEY and claude.upstream.startswith("https://api.anthropic.com")
    spec = opencode_provider.plan_server({}, str(secrets), None)
    assert spec.source == "projection" and KEY in spec.secrets


def test_without_the_key_each_backend_refuses_with_the_file_named(tmp_path):
    secrets = tmp_path / "secrets"
    shutil.copytree(EXAMPLES / "secrets", secrets)
    for plan in (lambda: codex_config.plan_provider(Projection.locate(secrets, backend="codex"), {}),
                 lambda: claude_config.plan_provider(Projection.locate(secrets, backend="claude-code"), {},
                                                     with_proxy=False),
                 lambda: opencode_provider.plan_server({}, str(secrets), None)):
        with pytest.raises(fk.BackendFailure) as caught:
            plan()
        assert caught.value.kind == fk.SECRET_UNAVAILABLE and "_API_KEY" in str(caught.value)


def test_readme_names_the_examples_files():
    section = readme_section()
    shipped = "/usr/share/caldera/examples/code-agents/"
    for path in re.findall(re.escape(shipped) + r"([\w./-]+)", section):
        assert (EXAMPLES / path).exists(), path
    for path in re.findall(r"/etc/caldera/agents/task-agent/secrets/([\w./-]+)", section):
        assert (EXAMPLES / "secrets" / path).is_file(), path


def test_readme_names_the_versions_ci_pins():
    if not (ROOT / ".ci").is_dir():
        pytest.skip("no .ci/ here (the .deb's build tree)")
    section = readme_section()
    for script, package in (("install-codex.sh", "@openai/codex"),
                            ("install-claude-code.sh", "@anthropic-ai/claude-code"),
                            ("install-opencode.sh", "opencode-ai")):
        pinned = re.search(r':-([0-9.]+)}"', (ROOT / ".ci" / script).read_text()).group(1)
        assert f"{package}@{pinned}" in section, (package, pinned)
