"""``hierarchical``: BSP gradient averaging in three stages along the racks (BlueConnect-style).

Per iteration, on one flat gradient buffer: (1) every rack reduces its gradients to its
leader (its lowest rank), (2) the leaders allreduce the rack sums across racks, (3) every
leader broadcasts the world sum back into its rack, which divides by the world size. Only
one rank per rack sends across the rack uplinks, so the inter-rack stage carries
``1/rack size`` of flat allreduce's cross traffic; the result is exactly ``allreduce``'s.
Racks come from the topology (probed or given).
"""

from __future__ import annotations

import torch

from dssync.patterns import rack_leaders
from dssync.strategies.allreduce import GradientBuffer
from dssync.strategies.base import Strategy, StrategyContext

__all__ = ["HierarchicalStrategy"]


class HierarchicalStrategy(Strategy):
    name = "hierarchical"
    devices = ("cpu", "cuda")

    def __init__(self, ctx: StrategyContext, config: Strategy.Config | None = None) -> None:
        super().__init__(ctx, config)
        racks = [tuple(sorted(r)) for r in ctx.topology.racks()]
        self._rack = next(r for r in racks if self.comm.rank in r)
        self._leader = self._rack[0]
        self._leaders = rack_leaders(racks)
        self._grads = GradientBuffer(self.model)

    def setup(self) -> None:
        self.comm.register_groups([*self.ctx.topology.racks(), self._leaders])
        super().setup()

    @torch.no_grad()
    def _before_step(self, step: int) -> bool:
        flat = self._grads.gather()
        local = len(self._rack) > 1
        if local:
            self.comm.reduce_(flat, dst=self._leader, group=self._rack)
        if self.comm.rank == self._leader and len(self._leaders) > 1:
            self.comm.allreduce_(flat, self._leaders)
        if local:
            self.comm.broadcast_(flat, src=self._leader, group=self._rack)
        flat.mul_(1.0 / self.comm.world_size)
        self._grads.scatter()
        return True
