import pytest

from caldera.plane.server import PlaneServer
from plane_helpers import Agent, Clock


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def plane(tmp_path, clock):
    server = PlaneServer(tmp_path / "plane.db", tokens={"boot-secret-token": 1, "other-token": 2},
                         clock=clock).start()
    yield server
    server.stop()


@pytest.fixture
def agent(plane):
    a = Agent(plane.url)
    assert a.register().status_code == 200
    return a
