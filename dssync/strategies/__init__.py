"""Synchronization strategies: the interface (``base``), one file each, one name each in this registry."""

from __future__ import annotations

from dssync.patterns import MODELLED
from dssync.strategies.allreduce import AllreduceStrategy
from dssync.strategies.asp import ASPStrategy
from dssync.strategies.base import Strategy
from dssync.strategies.ddp import DDPStrategy
from dssync.strategies.diloco import DiLoCoStrategy
from dssync.strategies.ds_sync import DSSyncStrategy
from dssync.strategies.gossip import GossipStrategy
from dssync.strategies.hierarchical import HierarchicalStrategy
from dssync.strategies.local_sgd import LocalSGDStrategy
from dssync.strategies.psp import PSPStrategy
from dssync.strategies.specsync import SpecSyncStrategy
from dssync.strategies.ssp import SSPStrategy
from dssync.strategies.sync_switch import SyncSwitchStrategy
from dssync.strategies.torch_hier import TorchHierStrategy

__all__ = [
    "REGISTRY", "ASPStrategy", "AllreduceStrategy", "DDPStrategy", "DSSyncStrategy", "DiLoCoStrategy",
    "GossipStrategy", "HierarchicalStrategy", "LocalSGDStrategy", "PSPStrategy", "SSPStrategy",
    "SpecSyncStrategy", "SyncSwitchStrategy", "TorchHierStrategy", "compared_by_default", "get_strategy", "having",
    "probing", "simulated",
]

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (DDPStrategy, AllreduceStrategy, DSSyncStrategy, HierarchicalStrategy,
                              TorchHierStrategy, DiLoCoStrategy, GossipStrategy, LocalSGDStrategy,
                              ASPStrategy, SSPStrategy, PSPStrategy, SyncSwitchStrategy, SpecSyncStrategy)
}


#: The order benchmark tables list strategies in: the plain data-parallel baselines, the
#: protocols that relax them, DS-Sync last.
TABLE_ORDER: tuple[type[Strategy], ...] = (
    DDPStrategy, AllreduceStrategy, HierarchicalStrategy, TorchHierStrategy, DiLoCoStrategy, LocalSGDStrategy,
    GossipStrategy, ASPStrategy, SSPStrategy, PSPStrategy, SyncSwitchStrategy, SpecSyncStrategy, DSSyncStrategy)


def get_strategy(name: str) -> type[Strategy]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}; choose one of: {', '.join(sorted(REGISTRY))}"
        ) from None


def having(option: str) -> list[str]:
    """The strategies whose ``Config`` has the setting ``option``."""
    return [name for name, cls in REGISTRY.items() if option in cls.Config.settings()]


def probing() -> list[str]:
    """The strategies that plan around the measured network (``Strategy.probes``)."""
    return [name for name, cls in REGISTRY.items() if cls.probes]


def simulated() -> tuple[str, ...]:
    """The strategies ``dssync simulate`` has a pattern of (``dssync.patterns``), in table order."""
    return tuple(cls.name for cls in TABLE_ORDER if cls.name in MODELLED)


def compared_by_default() -> tuple[str, ...]:
    """The strategies ``dssync bench compare`` runs when none are named (``Strategy.compared``), in table order."""
    return tuple(cls.name for cls in TABLE_ORDER if cls.compared)
