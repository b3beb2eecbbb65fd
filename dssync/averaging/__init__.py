"""The DS-Sync engine: groups over time (``shuffle``), the group average over a
``Communicator`` on flat tensors (``flat``), the local ensemble (``ensemble``), layer-wise
overlapped averaging (``overlap``), and ``DSSyncAverager``, torch's model-averager interface
over all of them, which the ``ds-sync`` strategy drives too (docs/averaging.md)."""

from __future__ import annotations

from dssync.averaging.averager import (
    DSSyncAverager,
    LocalSGDState,
    default_topology,
    local_sgd_hook,
)
from dssync.averaging.ensemble import ENSEMBLES, Ensemble, debiased_ema
from dssync.averaging.flat import average_tensors, flatten_parameters, hookless_copy, world_average
from dssync.averaging.overlap import OverlapReducer
from dssync.averaging.shuffle import Shuffle

__all__ = [
    "ENSEMBLES", "DSSyncAverager", "Ensemble", "LocalSGDState", "OverlapReducer", "Shuffle", "average_tensors",
    "debiased_ema", "default_topology", "flatten_parameters", "hookless_copy", "local_sgd_hook", "world_average",
]
