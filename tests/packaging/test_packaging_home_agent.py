"""examples/home-agent: seed 000's manifest and "complete minimal adapter", byte for byte (issue 23).

CI (.ci/home-agent.sh) copies them into /home/agent/task-agent, so what runs under systemd is
the seed's own text. The digests below are of the seed's blocks; with the seed at hand
(CALDERA_SEED_000=path), the files are compared with it directly too.
"""
import hashlib
import os
from pathlib import Path

import pytest

from caldera.agents.manifest import load_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "home-agent"
ADAPTER_SHA256 = "8df3f63568fd4b39b35d2b5f96f5dfac1ca7fdd629e62d078e66542fff7007dd"
MANIFEST_SHA256 = "587a7c3af87dc4a5c6400dc31ffbd4eede0dc39389783cb57d2889ce47798660"


def test_the_examples_are_the_seeds_text():
    assert hashlib.sha256((EXAMPLE / "caldera" / "adapter.py").read_bytes()).hexdigest() == ADAPTER_SHA256
    assert hashlib.sha256((EXAMPLE / "caldera.agent.yaml").read_bytes()).hexdigest() == MANIFEST_SHA256


def test_against_the_seed_itself_when_given():
    seed_path = os.environ.get("CALDERA_SEED_000")
    if not seed_path or not Path(seed_path).is_file():
        pytest.skip("CALDERA_SEED_000 names no seed file")
    seed = Path(seed_path).read_text(encoding="utf-8")
    start = seed.index("#!/usr/bin/env python3")
    end = seed.index("main(sys.argv[1:])") + len("main(sys.argv[1:])") + 1
    assert (EXAMPLE / "caldera" / "adapter.py").read_text(encoding="utf-8") == seed[start:end]
    start = seed.index("# caldera.agent.yaml")
    end = seed.index("\n", seed.index("account: false")) + 1
    assert (EXAMPLE / "caldera.agent.yaml").read_text(encoding="utf-8") == seed[start:end]


def test_the_seed_manifest_is_a_home_agent_manifest():
    manifest = load_manifest(EXAMPLE / "caldera.agent.yaml", validate_schema=True)
    assert str(manifest.workdir) == "/home/agent/task-agent"
    assert manifest.command[0] == "/home/agent/task-agent/.venv/bin/python"
