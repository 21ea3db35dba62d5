"""Fixtures every area may use.

The areas mirror caldera's layers (tests/agents, tests/cli, tests/daemon, …). An area's
helpers (`*_helpers.py`) are importable by name from every area: the CLI tests drive the
daemon's, the plane's and the sampler's fixtures too.
"""
import os
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
sys.path[:0] = sorted(str(d) for d in _TESTS.iterdir() if d.is_dir() and any(d.glob("*_helpers.py")))


@pytest.fixture
def caldera_env(tmp_path, monkeypatch):
    """An empty config and state tree, with no caldera variables leaking in from the host."""
    for key in list(os.environ):
        if key.startswith(("CALDERA_", "CLAWMANAGER_")):
            monkeypatch.delenv(key)
    config, state = tmp_path / "etc", tmp_path / "var"
    (config / "agents").mkdir(parents=True)
    state.mkdir()
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(config))
    monkeypatch.setenv("CALDERA_STATE_DIR", str(state))
    return tmp_path
