import os

import pytest

from dssync.launch import emulate


@pytest.fixture(scope="session")
def netns_support():
    try:
        emulate.check_support()
    except emulate.EmulationError as exc:
        pytest.skip(reason=f"network namespaces are impossible here: {exc}")


@pytest.fixture
def name(netns_support, tmp_path, monkeypatch):
    """A cluster name of this test alone; whatever the test does, nothing of it is left."""
    monkeypatch.setenv("DSSYNC_STATE_DIR", str(tmp_path / "state"))
    cluster_name = f"dst{os.getpid() % 10000}"
    emulate.down(cluster_name)
    yield cluster_name
    emulate.down(cluster_name)
    assert emulate.leftovers(cluster_name) == []


@pytest.fixture
def exec_workers(monkeypatch):
    """``dssync emulate run`` exec's a fresh Python per worker (``DSSYNC_EMULATE_FORK=0``)
    instead of forking them from itself, the default: the path a command other than this
    installation's ``dssync`` always takes."""
    monkeypatch.setenv("DSSYNC_EMULATE_FORK", "0")
