"""The registry of synchronization strategies: one file each, one name each."""

from __future__ import annotations

from dssync.strategies.allreduce import AllreduceStrategy
from dssync.strategies.ds_sync import DSSyncStrategy
from dssync.strategy import Strategy

__all__ = ["REGISTRY", "AllreduceStrategy", "DSSyncStrategy", "get_strategy"]

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (AllreduceStrategy, DSSyncStrategy)
}


def get_strategy(name: str) -> type[Strategy]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}; choose one of: {', '.join(sorted(REGISTRY))}"
        ) from None
