"""``Communicator`` over Horovod (``horovod.torch``), for jobs started by ``horovodrun``.

Horovod is initialised with dynamic process sets; ``register_groups`` adds one process set
per distinct rank set of the schedule (``hvd.add_process_set``, a collective of all ranks),
in the order it is given, which is the same on every rank, and caches it. Ops on disjoint
process sets run concurrently in Horovod's background thread, as DS-Sync's groups need.

Horovod matches an op across ranks by its name, so every op gets one that all members
compute alike: the op, the process set and a per-(op, set) sequence number. Waits poll
the handle (``hvd.poll``) against a deadline and name the rank, the op and the group when
it passes. Horovod has no point-to-point send: ``sendrecv_`` is an ``alltoall`` over the
world in which each rank sends to one rank only, so every rank must call it in the same
iteration (gossip does). Horovod has no reduce-to-one either: ``reduce_`` is an allreduce
(the non-root ranks' result is left undefined by the interface anyway).
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from dssync.collectives.base import Communicator, Group, poll_until
from dssync.collectives.sockets import SocketMesh
from dssync.errors import CommunicationError, DssyncError

__all__ = ["HorovodCommunicator", "import_horovod"]


def import_horovod() -> Any:
    """``horovod.torch``, or a clear error naming how to install it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise DssyncError(
            f"--backend horovod needs Horovod, which is not installed ({exc}); build and install it with "
            "`python -m dssync.launch.build_horovod` (Horovod 0.28.1 for this torch, cached), then "
            "pip install 'dssync[horovod]'"
        ) from None
    return hvd


class _HorovodWork:
    def __init__(self, hvd: Any, handle: Any, describe: str, timeout_s: float) -> None:
        self._hvd, self._handle, self._describe, self._timeout_s = hvd, handle, describe, timeout_s
        self.result: Any = None

    def wait(self) -> None:
        if self._handle is None:
            return
        try:
            poll_until(lambda: self._hvd.poll(self._handle), self._describe, self._timeout_s)
            self.result = self._hvd.synchronize(self._handle)
        except CommunicationError:
            raise
        except Exception as exc:  # HorovodInternalError and friends: a peer died or shut down
            raise CommunicationError(f"{self._describe} failed: {str(exc).strip().splitlines()[0]}") from None
        finally:
            self._handle = None


class HorovodCommunicator(Communicator):
    """Adapter for ``horovod.torch``; initialises Horovod with dynamic process sets."""

    def __init__(self, *, timeout_s: float = 300.0) -> None:
        self._hvd = hvd = import_horovod()
        if not hvd.is_initialized():
            hvd.init(process_sets="dynamic")
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.timeout_s = timeout_s
        self._sets: dict[Group, Any] = {}
        self._seq: dict[tuple[str, Group | None], int] = defaultdict(int)
        # Horovod has collectives only; point-to-point messages go over TCP between the
        # ranks, on the interface Horovod's own gloo uses (built here: every rank constructs
        # its communicator at the same point, so the address exchange is collective)
        self._mesh = SocketMesh(self.rank, self.world_size, self.allgather_object, timeout_s)

    def _set(self, group: Group | None) -> Any:
        if group is None or len(group) == self.world_size:
            return self._hvd.global_process_set
        return self.registered(self._sets, group)

    def _name(self, op: str, group: Group | None) -> str:
        key = (op, None if group is None or len(group) == self.world_size else group)
        self._seq[key] += 1
        where = "world" if key[1] is None else "-".join(map(str, key[1]))
        return f"dssync.{op}.{where}.{self._seq[key]}"

    def register_groups(self, groups: Iterable[Sequence[int]]) -> None:
        for group in self.agreed_groups(groups):
            if len(group) < 2 or len(group) == self.world_size or group in self._sets:
                continue
            try:
                self._sets[group] = self._hvd.add_process_set(list(group))
            except Exception as exc:
                raise CommunicationError(f"rank {self.rank}: Horovod could not add the process set "
                                         f"{list(group)}: {str(exc).strip().splitlines()[0]}") from None

    def _start(self, fn: Any, describe: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise CommunicationError(f"{describe} failed: {str(exc).strip().splitlines()[0]}") from None

    def allreduce_async_(self, tensor: torch.Tensor, group: Group | None = None, *,
                         average: bool = False) -> _HorovodWork:
        self.check_member(group)
        describe = self._describe("allreduce", group)
        if group is not None and len(group) == 1:
            return _HorovodWork(self._hvd, None, describe, self.timeout_s)
        op = self._hvd.Average if average else self._hvd.Sum
        handle = self._start(self._hvd.allreduce_async_, describe, tensor, name=self._name("allreduce", group),
                             op=op, process_set=self._set(group))
        return _HorovodWork(self._hvd, handle, describe, self.timeout_s)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0, group: Group | None = None) -> None:
        self.check_member(group)
        if group is not None and len(group) == 1:
            return
        if group is not None and src not in group:
            raise CommunicationError(f"rank {self.rank}: root rank {src} is not in group {list(group)}")
        describe = self._describe(f"broadcast from rank {src}", group)
        handle = self._start(self._hvd.broadcast_async_, describe, tensor, root_rank=src,
                             name=self._name("broadcast", group), process_set=self._set(group))
        _HorovodWork(self._hvd, handle, describe, self.timeout_s).wait()

    def reduce_(self, tensor: torch.Tensor, dst: int, group: Group | None = None) -> None:
        if group is not None and dst not in group:
            raise CommunicationError(f"rank {self.rank}: root rank {dst} is not in group {list(group)}")
        self.allreduce_async_(tensor, group).wait()

    def sendrecv_(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        describe = f"rank {self.rank}: send to rank {dst} / receive from rank {src} (alltoall over the world, " \
                   f"timeout {self.timeout_s:.0f} s)"
        splits = [0] * self.world_size
        splits[dst] = send.numel()
        handle = self._start(self._hvd.alltoall_async, describe, send.reshape(-1), splits=splits,
                             name=self._name("sendrecv", None))
        work = _HorovodWork(self._hvd, handle, describe, self.timeout_s)
        work.wait()
        out, received = work.result if isinstance(work.result, tuple) else (work.result, None)
        if out.numel() != recv.numel() or (received is not None and int(received[src]) != recv.numel()):
            raise CommunicationError(f"{describe}: received {out.numel()} elements, expected {recv.numel()} "
                                     f"from rank {src} only; every rank must call sendrecv_ in the same step")
        recv.copy_(out.view_as(recv))

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Any:
        self._check_peer(dst)
        return self._mesh.isend(tensor, dst, tag, self._describe_p2p("send to", dst, tag))

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Any:
        self._check_peer(src)
        return self._mesh.irecv(tensor, src, tag, self._describe_p2p("receive from", src, tag))

    def allgather_object(self, obj: Any) -> list[Any]:
        describe = self._describe("allgather", None)
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes_work = _HorovodWork(self._hvd, self._start(
            self._hvd.allgather_async, describe, torch.tensor([data.numel()], dtype=torch.int64),
            name=self._name("allgather_sizes", None)), describe, self.timeout_s)
        sizes_work.wait()
        data_work = _HorovodWork(self._hvd, self._start(
            self._hvd.allgather_async, describe, data, name=self._name("allgather", None)), describe, self.timeout_s)
        data_work.wait()
        out, start = [], 0
        for size in sizes_work.result.tolist():
            out.append(pickle.loads(data_work.result[start : start + size].numpy().tobytes()))
            start += size
        return out

    def barrier(self) -> None:
        self.allreduce_async_(torch.zeros(1), None).wait()
