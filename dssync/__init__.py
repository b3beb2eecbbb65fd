"""dssync: divide-and-shuffle synchronization for data-parallel PyTorch training.

The core objects::

    from dssync.topology import Topology
    from dssync.planning.planner import static_plan
    topology = Topology.from_rack_sizes([4, 4])
    schedule = static_plan(topology)        # who averages with whom, iteration by iteration

In an existing DDP script (docs/averaging.md)::

    from dssync import DSSyncAverager, LocalSGDState, local_sgd_hook
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["DSSyncAverager", "LocalSGDState", "__version__", "local_sgd_hook"]

_AVERAGING = ("DSSyncAverager", "LocalSGDState", "local_sgd_hook")


def __getattr__(name: str) -> Any:
    # torch loads only when these are asked for, so that the command line starts fast
    if name in _AVERAGING:
        from dssync import averaging

        return getattr(averaging, name)
    raise AttributeError(f"module 'dssync' has no attribute {name!r}")
