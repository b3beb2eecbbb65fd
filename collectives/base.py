"""The ``Communicator`` interface: the collectives a synchronization strategy needs.

Verbs follow Horovod's naming (``allreduce_`` works in place, ``allreduce_async_``
returns a handle to ``wait`` on). ``group`` is a sorted tuple of world ranks, or ``None``
for the whole world, and must hold the calling rank. Groups are created collectively
and once, by ``register_groups``, in the same order on every rank; an op on a group that
was never registered is an error rather than a silent hang.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch

from dssync.errors import CommunicationError

__all__ = ["Communicator", "Group", "Work"]

Group = tuple[int, ...]


class Work(Protocol):
    def wait(self) -> None:
        """Block until the op is done; raise ``CommunicationError`` on failure or timeout."""


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
    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, indexed by rank (world)."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait for every rank (world)."""

    def check_member(self, group: Group | None) -> None:
        if group is not None and self.rank not in group:
            raise CommunicationError(
                f"rank {self.rank} called a collective on group {list(group)}, which it is not in"
            )
