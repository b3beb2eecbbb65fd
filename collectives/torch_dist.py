"""``Communicator`` over ``torch.distributed``: gloo for CPU tensors, NCCL for CUDA ones.

The process group is initialised with ``"cpu:gloo,cuda:nccl"`` when CUDA is present, so
the same subgroups serve both kinds of tensors. Subgroups are created by
``register_groups`` (``dist.new_group`` must be called by every rank, in the same order)
and cached by rank tuple; size-one groups need no communication and get none.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dssync.collectives.base import Communicator, Group
from dssync.errors import CommunicationError

__all__ = ["TorchCommunicator", "default_backend", "init_process_group"]


def default_backend() -> str:
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(
    *, rank: int, world_size: int, init_method: str, timeout_s: float, backend: str | None = None
) -> None:
    """Join the world; every later collective inherits ``timeout_s``."""
    if torch.cuda.is_available():  # one GPU a rank: the launcher's local rank, else the rank
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    try:
        with connect_noise_held():
            dist.init_process_group(
                backend=backend or default_backend(),
                init_method=init_method,
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
    except (RuntimeError, ValueError) as exc:
        raise CommunicationError(
            f"rank {rank}: could not join a world of {world_size} ranks at {init_method} within "
            f"{timeout_s:.0f} s: {_first_line(exc)}"
        ) from None


#: What gloo writes on stderr while a process group connects: each refused attempt it will
#: retry, and the failure that the raised error carries anyway. A peer that dies at
#: rendezvous would otherwise leave half a dozen native lines on every surviving rank
#: before the job's one-line error.
CONNECT_NOISE = re.compile(r"\] ERROR failed to connect, willRetry=|Gloo connectFullMesh failed with")


@contextlib.contextmanager
def connect_noise_held():
    """Hold this process's stderr (file descriptor 2, where native code writes) while a
    process group connects, and write back every line but ``CONNECT_NOISE``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not CONNECT_NOISE.search(line))
            if kept:
                os.write(2, kept.encode())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _TorchWork:
    def __init__(self, work: Any, describe: str, timeout_s: float,
                 scale: tuple[torch.Tensor, float] | None = None) -> None:
        self._work, self._describe, self._timeout_s = work, describe, timeout_s
        self._scale = scale

    def wait(self) -> None:
        try:
            self._work.wait(timeout=datetime.timedelta(seconds=self._timeout_s))
        except RuntimeError as exc:
            raise CommunicationError(f"{self._describe} failed: {_first_line(exc)}") from None
        if self._scale is not None:
            tensor, factor = self._scale
            tensor.mul_(factor)


#: The point-to-point tag of ``barrier``'s tokens, apart from every tag callers use.
_BARRIER_TAG = 0x7FFF_0001

#: Process groups one communicator may create. Groups are cached for the whole job
#: (torch.distributed cannot free one cheaply), and online regrouping adds new ones.
MAX_GROUPS = 1024


class TorchCommunicator(Communicator):
    """Adapter for an initialised ``torch.distributed`` default process group."""

    def __init__(self, *, timeout_s: float = 300.0) -> None:
        if not dist.is_initialized():
            raise CommunicationError(
                "torch.distributed is not initialised; call dssync.collectives.init_process_group "
                "first, or start the job with a launcher (torchrun) or --nproc"
            )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.timeout_s = timeout_s
        self._groups: dict[Group, Any] = {}

    # -- groups --------------------------------------------------------------------------
    def register_groups(self, groups: Iterable[Sequence[int]]) -> None:
        wanted = self.agreed_groups(groups)
        world = tuple(range(self.world_size))
        new = [g for g in wanted if len(g) >= 2 and g != world and g not in self._groups]
        if len(self._groups) + len(new) > MAX_GROUPS:
            raise CommunicationError(
                f"rank {self.rank}: {len(self._groups)} process groups exist and {len(new)} more were "
                f"asked for, over the bound of {MAX_GROUPS}; each holds sockets and threads on "
                "every member, so plans must reuse groups (regroup less often)"
            )
        for group in new:
            with connect_noise_held():
                self._groups[group] = dist.new_group(
                    ranks=list(group), timeout=datetime.timedelta(seconds=self.timeout_s)
                )

    def _process_group(self, group: Group | None) -> Any:
        if group is None or len(group) == self.world_size:
            return None  # the default (world) group
        return self.registered(self._groups, group)

    # -- collectives -----------------------------------------------------------------------
    def allreduce_async_(self, tensor: torch.Tensor, group: Group | None = None, *,
                         average: bool = False) -> _TorchWork:
        pg = self._process_group(group)
        describe = self._describe("allreduce", group)
        size = self.world_size if group is None else len(group)
        # NCCL averages natively; gloo has no AVG, so it sums and wait() scales.
        native_avg = average and tensor.is_cuda
        op = dist.ReduceOp.AVG if native_avg else dist.ReduceOp.SUM
        try:
            work = dist.all_reduce(tensor, op=op, group=pg, async_op=True)
        except RuntimeError as exc:
            raise CommunicationError(f"{describe} failed: {_first_line(exc)}") from None
        scale = (tensor, 1.0 / size) if average and not native_avg else None
        return _TorchWork(work, describe, self.timeout_s, scale)

    def _blocking(self, op: str, group: Group | None, start: Any) -> None:
        """Run ``start(process_group)`` (an async torch op) and wait for it, bounded and named."""
        pg = self._process_group(group)
        describe = self._describe(op, group)
        try:
            work = start(pg)
        except RuntimeError as exc:
            raise CommunicationError(f"{describe} failed: {_first_line(exc)}") from None
        _TorchWork(work, describe, self.timeout_s).wait()

    def broadcast_(self, tensor: torch.Tensor, src: int = 0, group: Group | None = None) -> None:
        self._blocking(f"broadcast from rank {src}", group,
                       lambda pg: dist.broadcast(tensor, src=src, group=pg, async_op=True))

    def reduce_(self, tensor: torch.Tensor, dst: int, group: Group | None = None) -> None:
        self._blocking(f"reduce to rank {dst}", group, lambda pg: dist.reduce(tensor, dst=dst, group=pg, async_op=True))

    def sendrecv_(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        describe = f"rank {self.rank}: send to rank {dst} / receive from rank {src} (timeout {self.timeout_s:.0f} s)"
        try:
            works = [dist.isend(send, dst), dist.irecv(recv, src)]
        except RuntimeError as exc:
            raise CommunicationError(f"{describe} failed: {_first_line(exc)}") from None
        for work in works:
            _TorchWork(work, describe, self.timeout_s).wait()

    def _p2p(self, op: Any, verb: str, tensor: torch.Tensor, peer: int, tag: int) -> _TorchWork:
        self._check_peer(peer)
        describe = self._describe_p2p(verb, peer, tag)
        try:
            return _TorchWork(op(tensor, peer, tag=tag), describe, self.timeout_s)
        except RuntimeError as exc:
            raise CommunicationError(f"{describe} failed: {_first_line(exc)}") from None

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> _TorchWork:
        return self._p2p(dist.isend, "send to", tensor, dst, tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> _TorchWork:
        return self._p2p(dist.irecv, "receive from", tensor, src, tag)

    def allgather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(out, obj)
        except RuntimeError as exc:
            raise CommunicationError(
                f"{self._describe('allgather', None)} failed: {_first_line(exc)}"
            ) from None
        return out

    def barrier(self) -> None:
        """Every rank waits until all have arrived. On gloo, rank 0 takes a token from each
        rank in turn, then releases them all, so the rank that never arrives is the one named;
        torch's ``monitored_barrier`` does the same but also logs its error to stderr from C++,
        a second line beside the one the job reports."""
        if dist.get_backend() != "gloo":
            self._blocking("barrier", None, lambda pg: dist.barrier(group=pg, async_op=True))
            return
        describe = self._describe("barrier", None)
        deadline = time.monotonic() + self.timeout_s
        token = torch.zeros(1)

        def wait(op: Any, peer: int, what: str) -> None:
            left = datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001))
            try:
                op(token, peer, tag=_BARRIER_TAG).wait(timeout=left)
            except RuntimeError as exc:
                raise CommunicationError(f"{describe} failed: {what}: {_first_line(exc)}") from None

        if self.rank == 0:
            for peer in range(1, self.world_size):
                wait(dist.irecv, peer, f"rank {peer} did not arrive")
            for peer in range(1, self.world_size):
                wait(dist.isend, peer, f"rank {peer} was not released")
        else:
            wait(dist.isend, 0, "rank 0 did not take this rank's arrival")
            wait(dist.irecv, 0, "rank 0 did not release this rank")

    def process_group(self, group: Group | None) -> Any:
        """The cached ``ProcessGroup`` for ``group`` (``None`` is the world)."""
        return self._process_group(group)
