"""The daemon tests' loopback plane: instance 7, the bootstrap token BOOT, 1 s intervals
(a module that needs another plane defines its own `plane` fixture, which wins)."""
import pytest
from core_helpers import BOOT
from daemon_helpers import INSTANCE
from plane_helpers import InjectingPlane  # the plane that can be told to fail


@pytest.fixture
def plane(tmp_path):
    server = InjectingPlane(
        str(tmp_path / "plane.db"), tokens={BOOT: INSTANCE}, heartbeat_interval=1, poll_interval=1).start()
    yield server
    server.stop()
