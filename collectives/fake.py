"""An in-process fake world for unit tests: one thread per rank, real reductions.

``FakeWorld(n).run(fn)`` calls ``fn(comm)`` on ``n`` threads, each with its own
``FakeCommunicator``, and returns the results by rank (re-raising the first rank's
error). Collectives really sum tensors, so strategy logic can be tested against an oracle
without processes; every call is also recorded in ``FakeWorld.calls``. For unit tests of
logic only; the feature is tested on real process groups too.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from dssync.collectives.base import Communicator, Group
from dssync.errors import CommunicationError

__all__ = ["FakeCommunicator", "FakeWorld"]


class _Slot:
    def __init__(self) -> None:
        self.values: dict[int, Any] = {}
        self.result: Any = None
        self.readers = 0


class FakeWorld:
    def __init__(self, world_size: int, *, timeout_s: float = 10.0) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.calls: list[tuple[int, str, Group, int]] = []  # (rank, op, group, numel)
        self._cond = threading.Condition()
        self._slots: dict[tuple[str, Group, int], _Slot] = {}
        self._mail: dict[tuple[int, ...], list[torch.Tensor]] = defaultdict(list)
        self._posted: dict[tuple[int, ...], int] = defaultdict(int)

    def communicator(self, rank: int) -> FakeCommunicator:
        return FakeCommunicator(self, rank)

    def run(self, fn: Callable[[FakeCommunicator], Any]) -> list[Any]:
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException | None] = [None] * self.world_size

        def body(rank: int) -> None:
            try:
                results[rank] = fn(self.communicator(rank))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                errors[rank] = exc

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for exc in errors:
            if exc is not None:
                raise exc
        return results

    def _exchange(self, rank: int, dst: int, src: int, value: torch.Tensor) -> torch.Tensor:
        """Post ``value`` for ``dst`` and take what ``src`` posted for ``rank`` (FIFO per pair)."""
        with self._cond:
            self._mail[(rank, dst)].append(value)
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._mail[(src, rank)], timeout=self.timeout_s):
                raise CommunicationError(f"rank {rank}: receive from rank {src} timed out after "
                                         f"{self.timeout_s:.0f} s")
            return self._mail[(src, rank)].pop(0)

    def _collective(
        self, rank: int, op: str, group: Group, seq: int, value: Any, combine: Callable[[list[Any]], Any]
    ) -> Any:
        key = (op, group, seq)
        with self._cond:
            slot = self._slots.setdefault(key, _Slot())
            slot.values[rank] = value
            if len(slot.values) == len(group):
                slot.result = combine([slot.values[r] for r in group])
                self._cond.notify_all()
            elif not self._cond.wait_for(lambda: slot.result is not None, timeout=self.timeout_s):
                waiting = sorted(set(group) - set(slot.values))
                raise CommunicationError(
                    f"rank {rank}: {op} over group {list(group)} timed out after "
                    f"{self.timeout_s:.0f} s waiting for ranks {waiting}"
                )
            slot.readers += 1
            if slot.readers == len(group):
                del self._slots[key]
            return slot.result


class _Done:  # completes eagerly; the handle is already done
    def wait(self) -> None:
        return None


class FakeCommunicator(Communicator):
    def __init__(self, world: FakeWorld, rank: int) -> None:
        self.world = world
        self.rank = rank
        self.world_size = world.world_size
        self.timeout_s = world.timeout_s
        self._registered: set[Group] = set()
        self._seq: dict[tuple[str, Group], int] = defaultdict(int)

    def _run(self, op: str, group: Group | None, value: Any, combine: Callable[[list[Any]], Any]) -> Any:
        group = tuple(range(self.world_size)) if group is None else tuple(group)
        self.check_member(group)
        if len(group) not in (1, self.world_size) and group not in self._registered:
            raise CommunicationError(f"rank {self.rank}: group {list(group)} was never registered")
        seq = self._seq[(op, group)]
        self._seq[(op, group)] += 1
        numel = value.numel() if isinstance(value, torch.Tensor) else 0
        with self.world._cond:
            self.world.calls.append((self.rank, op, group, numel))
        return self.world._collective(self.rank, op, group, seq, value, combine)

    def register_groups(self, groups: Iterable[Sequence[int]]) -> None:
        self._registered.update(self.agreed_groups(groups))

    def allreduce_async_(self, tensor: torch.Tensor, group: Group | None = None, *,
                         average: bool = False) -> Any:
        total = self._run("allreduce", group, tensor.detach().clone(), lambda xs: torch.stack(xs).sum(0))
        tensor.copy_(total)
        if average:
            tensor.mul_(1.0 / (self.world_size if group is None else len(group)))

        return _Done()

    def broadcast_(self, tensor: torch.Tensor, src: int = 0, group: Group | None = None) -> None:
        members = tuple(range(self.world_size)) if group is None else tuple(group)
        pick = members.index(src)
        tensor.copy_(self._run(f"broadcast{src}", group, tensor.detach().clone(), lambda xs: xs[pick]))

    def reduce_(self, tensor: torch.Tensor, dst: int, group: Group | None = None) -> None:
        total = self._run(f"reduce{dst}", group, tensor.detach().clone(), lambda xs: torch.stack(xs).sum(0))
        if self.rank == dst:
            tensor.copy_(total)

    def sendrecv_(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        with self.world._cond:
            self.world.calls.append((self.rank, f"send{dst}", (self.rank, dst), send.numel()))
        recv.copy_(self.world._exchange(self.rank, dst, src, send.detach().clone()))

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Any:
        self._check_peer(dst)
        with self.world._cond:
            self.world.calls.append((self.rank, f"send{dst}", (self.rank, dst), tensor.numel()))
            self.world._mail[(self.rank, dst, tag)].append(tensor.detach().clone())
            self.world._cond.notify_all()
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Any:
        self._check_peer(src)
        world, key, describe = self.world, (src, self.rank, tag), self._describe_p2p("receive from", src, tag)
        with world._cond:  # the k-th receive posted takes the k-th message sent, whenever waited on
            index = world._posted[key]
            world._posted[key] += 1

        class _Recv:
            def wait(self) -> None:
                with world._cond:
                    if not world._cond.wait_for(lambda: len(world._mail[key]) > index, timeout=world.timeout_s):
                        raise CommunicationError(f"{describe} timed out")
                    message = world._mail[key][index]
                tensor.view(-1)[: message.numel()].copy_(message.view(-1))

        return _Recv()

    def allgather_object(self, obj: Any) -> list[Any]:
        return list(self._run("allgather", None, obj, lambda xs: list(xs)))

    def barrier(self) -> None:
        self._run("barrier", None, 0, lambda xs: 0)
