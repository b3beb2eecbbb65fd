"""Point-to-point messages (``Communicator.isend``/``irecv``): order per (sender, tag), tags
apart, short messages into longer buffers, and bounded waits that name both ranks; on the
in-process fake world and on the TCP mesh Horovod's communicator uses (threads, loopback).
The real libraries' point-to-point is tested in tests/multiproc and tests/launchers."""

from __future__ import annotations

import pytest
import torch

from dssync.collectives.fake import FakeWorld
from dssync.collectives.sockets import SocketMesh
from dssync.errors import CommunicationError


class _MeshComm:
    """A fake rank's communicator with the TCP mesh's point-to-point in place of its own."""

    def __init__(self, comm, timeout_s: float) -> None:
        self.rank, self.world_size = comm.rank, comm.world_size
        self.comm = comm
        self.mesh = SocketMesh(comm.rank, comm.world_size, comm.allgather_object, timeout_s, ifname="lo")

    def isend(self, tensor, dst, tag=0):
        return self.mesh.isend(tensor, dst, tag, f"rank {self.rank}: send to rank {dst}")

    def irecv(self, tensor, src, tag=0):
        return self.mesh.irecv(tensor, src, tag, f"rank {self.rank}: receive from rank {src}")


def _exchange(comm):
    """Rank 0 sends 5 numbered messages on tag 1 and 3 on tag 2, interleaved, plus a short
    one; rank 1 posts its receives for tag 2 first, then tag 1's, and waits in reverse."""
    if comm.rank == 0:
        works = []
        for k in range(5):
            works.append(comm.isend(torch.full((4,), float(k)), 1, tag=1))
            if k < 3:
                works.append(comm.isend(torch.full((4,), 100.0 + k), 1, tag=2))
        works.append(comm.isend(torch.tensor([7.0]), 1, tag=3))
        for w in works:
            w.wait()
        return None
    t2 = [torch.zeros(4) for _ in range(3)]
    t1 = [torch.zeros(4) for _ in range(5)]
    short = torch.full((4,), -1.0)
    works = [comm.irecv(t, 0, tag=2) for t in t2] + [comm.irecv(t, 0, tag=1) for t in t1]
    works.append(comm.irecv(short, 0, tag=3))
    for w in reversed(works):
        w.wait()
    return [t[0].item() for t in t1], [t[0].item() for t in t2], short.tolist()


@pytest.mark.parametrize("transport", ["fake", "tcp"])
def test_messages_arrive_in_order_per_tag_and_short_ones_fill_the_front(transport):
    world = FakeWorld(2, timeout_s=10)

    def body(comm):
        return _exchange(comm if transport == "fake" else _MeshComm(comm, 10))

    _, got = world.run(body)
    assert got == ([0.0, 1.0, 2.0, 3.0, 4.0], [100.0, 101.0, 102.0], [7.0, -1.0, -1.0, -1.0])


def test_a_large_message_crosses_the_tcp_mesh_whole():
    world = FakeWorld(2, timeout_s=10)
    payload = torch.randint(0, 256, (3 * 2**20 + 5,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def body(comm):
        mesh = _MeshComm(comm, 10)
        if comm.rank == 0:
            mesh.isend(payload, 1).wait()
            return None
        out = torch.zeros_like(payload)
        mesh.irecv(out, 0).wait()
        return bool(torch.equal(out, payload))

    assert world.run(body)[1] is True


@pytest.mark.parametrize("transport", ["fake", "tcp"])
def test_a_receive_nobody_answers_times_out_naming_both_ranks(transport):
    world = FakeWorld(2, timeout_s=0.5)

    def body(comm):
        c = comm if transport == "fake" else _MeshComm(comm, 0.5)
        if comm.rank == 1:
            with pytest.raises(CommunicationError, match=r"rank 1: receive from rank 0.*timed out"):
                c.irecv(torch.zeros(2), 0, tag=5).wait()

    world.run(body)


def test_a_closed_peer_is_named_not_waited_for():
    world = FakeWorld(2, timeout_s=10)

    def body(comm):
        mesh = _MeshComm(comm, 10)
        if comm.rank == 0:
            mesh.isend(torch.zeros(1), 1).wait()
            comm.barrier()
            mesh.mesh.close()
            return None
        mesh.irecv(torch.zeros(1), 0).wait()
        comm.barrier()
        with pytest.raises(CommunicationError, match="connection closed"):
            mesh.irecv(torch.zeros(1), 0).wait()
        return None

    world.run(body)


def test_a_peer_outside_the_world_is_refused():
    world = FakeWorld(2)
    comm = world.communicator(0)
    with pytest.raises(CommunicationError, match="no point-to-point message with rank 2"):
        comm.isend(torch.zeros(1), 2)
    with pytest.raises(CommunicationError, match="rank 0"):
        comm.irecv(torch.zeros(1), 0)
