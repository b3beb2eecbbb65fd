import pytest

from dssync.errors import DssyncError
from dssync.launch import from_environ

BASE = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_no_launcher():
    assert from_environ({}) is None


@pytest.mark.parametrize(("env", "launcher"), [
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, "torchrun"),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, "mpirun"),
    ({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1"}, "horovodrun"),
])
def test_launchers(env, launcher):
    got = from_environ({**BASE, **env})
    assert (got.rank, got.world_size, got.local_rank, got.launcher) == (3, 4, 1, launcher)


@pytest.mark.parametrize(("env", "match"), [
    ({"RANK": "x", "WORLD_SIZE": "4"}, "must be integers"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "outside a world of 4"),
    ({"RANK": "0", "WORLD_SIZE": "4", "MASTER_PORT": "0"}, "not a port"),
])
def test_malformed(env, match):
    with pytest.raises(DssyncError, match=match):
        from_environ({**BASE, **env})


def test_missing_master():
    with pytest.raises(DssyncError, match="MASTER_ADDR/MASTER_PORT"):
        from_environ({"RANK": "0", "WORLD_SIZE": "2"})
