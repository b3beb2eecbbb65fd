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
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, "mpich"),
    ({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, "horovodrun"),
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


def test_torch_needs_a_rendezvous_mpi_and_horovod_do_not():
    mpi = from_environ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})
    assert (mpi.launcher, mpi.init_method) == ("mpirun", None)
    with pytest.raises(DssyncError, match="MASTER_ADDR/MASTER_PORT are not set, which --backend torch needs"):
        mpi.torch_init_method()
    assert from_environ({**BASE, "RANK": "0", "WORLD_SIZE": "2"}).torch_init_method() == "env://"
    with pytest.raises(DssyncError, match="go together"):
        from_environ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})


@pytest.mark.parametrize(("env", "match"), [
    ({"WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "RANK": "0"},
     r"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 \(mpirun\) but RANK=0 WORLD_SIZE=4 \(torchrun\)"),
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "PMI_RANK": "2", "PMI_SIZE": "4"},
     r"HOROVOD_RANK=1 HOROVOD_SIZE=4 \(horovodrun\) but PMI_RANK=2 PMI_SIZE=4 \(mpich\)"),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"),
])
def test_launchers_that_disagree_are_named(env, match):
    with pytest.raises(DssyncError, match=match):
        from_environ(env)


def test_of_the_ranks_that_ended_the_one_a_signal_killed_is_named():
    """Rank 2 killed by SIGKILL, rank 0 exited 1 on the closed connection (its report still in
    flight): rank 2 is the one to name. With no signal among them, the lowest rank; with no
    rank ended, none."""
    from types import SimpleNamespace

    from dssync.launch.spawn import _culprit

    procs = [SimpleNamespace(exitcode=code) for code in (1, None, -9, None)]
    assert _culprit(procs, [0, 2]) == 2
    assert _culprit(procs, [0]) == 0
    assert _culprit([SimpleNamespace(exitcode=1), SimpleNamespace(exitcode=3)], [0, 1]) == 0
    assert _culprit(procs, []) is None


def test_a_rendezvous_port_is_free_and_outside_the_range_outgoing_connections_get():
    import socket

    from dssync.launch.spawn import _ephemeral_ports, free_port

    low, high = _ephemeral_ports()
    ports = {free_port() for _ in range(20)}
    assert all(not low <= p <= high and 1024 <= p <= 65535 for p in ports), ports
    assert len(ports) > 1  # drawn, not one fixed port that two jobs would both take
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free when drawn, still free now
