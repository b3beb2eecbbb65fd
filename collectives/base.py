"""The ``Communicator`` interface: the collectives a synchronization strategy needs.

Verbs follow Horovod's naming (``allreduce_`` works in place, ``allreduce_async_``
returns a handle to ``wait`` on). ``group`` is a sorted tuple of world ranks, or ``None``
for the whole world, and must hold the calling rank. Groups are created collectively
and once, by ``register_groups``, in the same order on every rank; an op on a group that
was never registered is an error rather than a silent hang.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import torch

from dssync.errors import CommunicationError

__all__ = ["Communicator", "Group", "Work", "poll_until"]

Group = tuple[int, ...]


class Work(Protocol):
    def wait(self) -> None:
        """Block until the op is done; raise ``CommunicationError`` on failure or timeout."""


def poll_until(done: Callable[[], bool], describe: str, timeout_s: float, *, max_delay_s: float = 5e-4) -> None:
    """Call ``done()`` until it is true, backing off from 20 µs to ``max_delay_s`` between calls;
    past ``timeout_s`` raise ``CommunicationError`` with ``describe``. For libraries whose
    own waits have no deadline (MPI requests, Horovod handles)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.0
    while not done():
        if time.monotonic() > deadline:
            raise CommunicationError(f"{describe} timed out after {timeout_s:.0f} s")
        delay = min(max_delay_s, max(2e-5, delay * 1.5))
        time.sleep(delay)


class Communicator(ABC):
    """Collectives over a fixed world of ranks, with cached subgroups."""

    rank: int
    world_size: int
    timeout_s: float

    @abstractmethod
    def register_groups(self, groups: Iterable[Sequence[int]]) -> None:
        """Create every listed group (collective: all ranks pass the same list)."""

    def allreduce_(self, tensor: torch.Tensor, group: Group | None = None, *, average: bool = False) -> None:
        """Sum (or, with ``average``, average) ``tensor`` over ``group`` in place."""
        self.allreduce_async_(tensor, group, average=average).wait()

    @abstractmethod
    def allreduce_async_(self, tensor: torch.Tensor, group: Group | None = None, *,
                         average: bool = False) -> Work:
        """Start an in-place sum (or average) over ``group``; ``wait()`` on the result.

        Backends with a native average (NCCL's ``AVG``) use it; the others sum and scale
        by ``1 / len(group)`` inside ``wait()``.
        """

    @abstractmethod
    def broadcast_(self, tensor: torch.Tensor, src: int = 0, group: Group | None = None) -> None:
        """Overwrite ``tensor`` on every rank of ``group`` with world rank ``src``'s."""

    @abstractmethod
    def reduce_(self, tensor: torch.Tensor, dst: int, group: Group | None = None) -> None:
        """Sum ``tensor`` over ``group`` into world rank ``dst``'s (the others' are left undefined)."""

    @abstractmethod
    def sendrecv_(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """Send ``send`` to world rank ``dst`` while receiving ``recv`` from ``src`` (point to point)."""

    @abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Work:
        """Start sending ``tensor`` to world rank ``dst``; ``wait()`` until it may be reused.

        Messages from one rank to another on one ``tag`` arrive in the order they were sent,
        whatever else is in flight; tags keep independent streams between the same two ranks
        apart. ``wait()`` raises ``CommunicationError`` naming both ranks past the timeout.
        """

    @abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Work:
        """Start receiving the next message from world rank ``src`` on ``tag`` into ``tensor``
        (a message shorter than ``tensor`` fills its front); ``wait()`` until it is there."""

    def _describe_p2p(self, op: str, peer: int, tag: int) -> str:
        return f"rank {self.rank}: {op} rank {peer} (tag {tag}, timeout {self.timeout_s:.0f} s)"

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise CommunicationError(f"rank {self.rank}: no point-to-point message with rank {peer} "
                                     f"in a world of {self.world_size}")

    @abstractmethod
    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, indexed by rank (world)."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait for every rank (world)."""

    def _describe(self, op: str, group: Group | None) -> str:
        where = "the world" if group is None else f"group {list(group)}"
        return f"rank {self.rank}: {op} over {where} (timeout {self.timeout_s:.0f} s)"

    def agreed_groups(self, groups: Iterable[Sequence[int]]) -> list[Group]:
        """The distinct groups of ``groups``, sorted, in first-seen order, once every rank has
        been shown to list the same ones (collective: an ``allgather_object``). A rank that
        lists other groups would block the others in group creation; this fails first."""
        wanted = list(dict.fromkeys(tuple(sorted(g)) for g in groups))
        outside = next((g for g in wanted if not g or g[0] < 0 or g[-1] >= self.world_size), None)
        if outside is not None:
            raise CommunicationError(
                f"rank {self.rank}: group {list(outside)} names ranks outside the world of {self.world_size}"
            )
        disagree = [r for r, other in enumerate(self.allgather_object(wanted)) if other != wanted]
        if disagree:
            raise CommunicationError(
                f"rank {self.rank}: ranks {disagree} asked for other groups than rank "
                f"{self.rank} ({len(wanted)} groups); every rank must use the same schedule"
            )
        return wanted

    def registered(self, table: dict[Group, Any], group: Group) -> Any:
        """``table[group]`` for a group this rank is in, or the error that it was never registered."""
        self.check_member(group)
        try:
            return table[group]
        except KeyError:
            raise CommunicationError(
                f"rank {self.rank}: group {list(group)} was never registered; list every group "
                "in register_groups() before using it (all ranks, same order)"
            ) from None

    def check_member(self, group: Group | None) -> None:
        if group is not None and self.rank not in group:
            raise CommunicationError(
                f"rank {self.rank} called a collective on group {list(group)}, which it is not in"
            )
