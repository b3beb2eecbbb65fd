"""``Communicator`` over MPI (mpi4py), for jobs started by ``mpirun``/``mpiexec``.

Groups are MPI communicators made with ``Comm.Create_group`` from the world's group, which
only the group's members call (MPI-3), once per distinct rank set, in the order
``register_groups`` lists them, and cached. Every op is non-blocking underneath
(``Iallreduce``, ``Ibcast``, ``Ireduce``, ``Isend``/``Irecv``, ``Ibarrier``) and waited on by
polling ``Test``, which also drives MPI's progress, so that every wait has a deadline and a
rank that waits too long names itself, the op and the group instead of hanging. Communicator
creation has no non-blocking form; a watchdog aborts the job when it outlasts the timeout.

Tensors must be CPU tensors (``--backend torch`` runs NCCL on GPUs); they are handed to MPI
as NumPy views, so nothing is copied.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from dssync.collectives.base import Communicator, Group, poll_until
from dssync.errors import CommunicationError, DssyncError

__all__ = ["MPICommunicator", "import_mpi"]

_P2P_TAG = 17


def import_mpi() -> Any:
    """``mpi4py.MPI``, or a clear error naming the extra that installs it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise DssyncError(
            f"--backend mpi needs mpi4py, which is not installed ({exc}); "
            "install it with: pip install 'dssync[mpi]' (and an MPI library, e.g. apt-get install libopenmpi-dev)"
        ) from None
    return MPI


def _buffer(tensor: torch.Tensor) -> np.ndarray:
    if tensor.device.type != "cpu":
        raise CommunicationError(f"--backend mpi moves CPU tensors only, got one on {tensor.device}; "
                                 "use --backend torch (NCCL) for GPU tensors")
    if not tensor.is_contiguous():
        raise CommunicationError("--backend mpi needs contiguous tensors")
    return tensor.detach().numpy()


class _MPIWork:
    """A request (or several) with a deadline; ``wait`` polls ``Test`` until done."""

    def __init__(self, requests: list[Any], describe: str, timeout_s: float,
                 scale: tuple[torch.Tensor, float] | None = None, keep: Any = None, fast: bool = False) -> None:
        self._requests, self._describe, self._timeout_s = requests, describe, timeout_s
        self._scale, self._keep = scale, keep  # keep: buffers MPI writes until done
        # fast: point-to-point messages that time a path (the probe's pings) poll at most
        # every 0.1 ms, not 0.5 ms: a wait adds little to a round trip, while eight ranks'
        # waiting threads polling every 20 µs took the CPU that their streams needed on 2 cores
        self._max_delay = 1e-4 if fast else 5e-4

    def wait(self) -> None:
        from mpi4py import MPI

        try:
            poll_until(lambda: MPI.Request.Testall(self._requests), self._describe, self._timeout_s,
                       max_delay_s=self._max_delay)
        except CommunicationError:
            for req in self._requests:
                with contextlib.suppress(MPI.Exception):
                    req.Cancel()
            raise
        if self._scale is not None:
            tensor, factor = self._scale
            tensor.mul_(factor)


class MPICommunicator(Communicator):
    """Adapter for ``MPI.COMM_WORLD`` (mpi4py)."""

    def __init__(self, *, timeout_s: float = 300.0) -> None:
        self._MPI = import_mpi()
        self._world = self._MPI.COMM_WORLD
        self.rank, self.world_size = self._world.Get_rank(), self._world.Get_size()
        self.timeout_s = timeout_s
        self._comms: dict[Group, Any] = {}

    def _comm(self, group: Group | None) -> Any:
        if group is None or len(group) == self.world_size:
            return self._world
        return self.registered(self._comms, group)

    def register_groups(self, groups: Iterable[Sequence[int]]) -> None:
        ordered = self.agreed_groups(groups)
        world_group = self._world.Get_group()
        for group in ordered:
            if len(group) < 2 or len(group) == self.world_size or group in self._comms \
                    or self.rank not in group:
                continue
            # Tags keep concurrent creations of overlapping groups apart; the list is the
            # same on every rank, so the tag of a group is too.
            tag = 1 + ordered.index(group)
            with self._watchdog(f"creating the communicator of group {list(group)}"):
                sub = world_group.Incl(list(group))
                self._comms[group] = self._world.Create_group(sub, tag)
                sub.Free()
        world_group.Free()

    @contextlib.contextmanager
    def _watchdog(self, what: str) -> Iterator[None]:
        """Abort the MPI job when the block outlasts the timeout (for calls MPI cannot bound)."""
        def expire() -> None:
            print(f"rank {self.rank}: {what} did not finish within {self.timeout_s:.0f} s; aborting the MPI job",
                  file=sys.stderr, flush=True)
            self._world.Abort(1)

        timer = threading.Timer(self.timeout_s, expire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def allreduce_async_(self, tensor: torch.Tensor, group: Group | None = None, *,
                         average: bool = False) -> _MPIWork:
        self.check_member(group)
        n = self.world_size if group is None else len(group)
        if n == 1:
            return _MPIWork([], "", self.timeout_s)
        buf = _buffer(tensor)
        req = self._comm(group).Iallreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM)
        return _MPIWork([req], self._describe("allreduce", group), self.timeout_s,
                        scale=(tensor, 1.0 / n) if average else None, keep=buf)

    def _root(self, world_rank: int, group: Group | None) -> int:
        if group is None:
            return world_rank
        if world_rank not in group:
            raise CommunicationError(f"rank {self.rank}: root rank {world_rank} is not in group {list(group)}")
        return group.index(world_rank)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0, group: Group | None = None) -> None:
        self.check_member(group)
        if group is not None and len(group) == 1:
            return
        buf = _buffer(tensor)
        req = self._comm(group).Ibcast(buf, root=self._root(src, group))
        _MPIWork([req], self._describe(f"broadcast from rank {src}", group), self.timeout_s, keep=buf).wait()

    def reduce_(self, tensor: torch.Tensor, dst: int, group: Group | None = None) -> None:
        self.check_member(group)
        if group is not None and len(group) == 1:
            return
        buf, root = _buffer(tensor), self._root(dst, group)
        comm = self._comm(group)
        if self.rank == dst:
            req = comm.Ireduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM, root=root)
        else:
            req = comm.Ireduce(buf, None, op=self._MPI.SUM, root=root)
        _MPIWork([req], self._describe(f"reduce to rank {dst}", group), self.timeout_s, keep=buf).wait()

    def sendrecv_(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        out, into = _buffer(send), _buffer(recv)
        # One tag for all: MPI matches messages between two ranks in the order they were sent.
        reqs = [self._world.Isend(out, dest=dst, tag=_P2P_TAG), self._world.Irecv(into, source=src, tag=_P2P_TAG)]
        describe = f"rank {self.rank}: send to rank {dst} / receive from rank {src} (timeout {self.timeout_s:.0f} s)"
        _MPIWork(reqs, describe, self.timeout_s, keep=(out, into)).wait()

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> _MPIWork:
        self._check_peer(dst)
        buf = _buffer(tensor)
        return _MPIWork([self._world.Isend(buf, dest=dst, tag=_P2P_TAG + 1 + tag)],
                        self._describe_p2p("send to", dst, tag), self.timeout_s, keep=buf, fast=True)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> _MPIWork:
        self._check_peer(src)
        buf = _buffer(tensor)
        return _MPIWork([self._world.Irecv(buf, source=src, tag=_P2P_TAG + 1 + tag)],
                        self._describe_p2p("receive from", src, tag), self.timeout_s, keep=buf, fast=True)

    def allgather_object(self, obj: Any) -> list[Any]:
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        sizes = np.zeros(self.world_size, dtype=np.int64)
        describe = self._describe("allgather", None)
        mine = np.array([data.size], dtype=np.int64)
        _MPIWork([self._world.Iallgather(mine, sizes)], describe, self.timeout_s, keep=mine).wait()
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        displs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        req = self._world.Iallgatherv(data, [out, (sizes, displs), self._MPI.BYTE])
        _MPIWork([req], describe, self.timeout_s, keep=(data, out)).wait()
        return [pickle.loads(out[d : d + s].tobytes()) for d, s in zip(displs, sizes, strict=True)]

    def barrier(self) -> None:
        _MPIWork([self._world.Ibarrier()], self._describe("barrier", None), self.timeout_s).wait()
