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
def forked(monkeypatch):
    """``dssync emulate run`` forks the workers from itself (``DSSYNC_EMULATE_FORK=1``)
    instead of exec'ing a Python per worker that imports torch again: some 8 s less per
    8-worker job on 2 cores. For the tests whose verdict no probe and no timing ratio
    decides (the probes' own tests keep exec'd workers: forked ones measured noisier)."""
    monkeypatch.setenv("DSSYNC_EMULATE_FORK", "1")
