"""Fixtures every area may use."""
import os

import pytest


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
