"""``gossip``: pairwise parameter averaging on a dynamic exponential graph (SGP-style).

After its local step, rank ``i`` averages its parameters with one peer, ``i XOR 2^k`` with
``k = step mod ceil(log2 n)``: over ``log2 n`` iterations every rank hears, through the
hypercube, from every other, and each exchange is one point-to-point swap (no group, no
barrier beyond the pair). When ``n`` is not a power of two a rank whose peer does not exist
sits that iteration out. The mixing matrix of every iteration is symmetric and doubly
stochastic, so the world average of the parameters never changes by gossip. The model
handed back is the world average of the ranks' models.
"""

from __future__ import annotations

import torch
from torch import nn

from dssync.flat import flatten_parameters
from dssync.strategy import Strategy, StrategyContext, world_average

__all__ = ["GossipStrategy", "gossip_peer"]


def gossip_peer(rank: int, world_size: int, step: int) -> int | None:
    """The peer of ``rank`` at iteration ``step``, or ``None`` when it sits out."""
    if world_size < 2:
        return None
    dims = (world_size - 1).bit_length()
    peer = rank ^ (1 << (step % dims))
    return peer if peer < world_size else None


class GossipStrategy(Strategy):
    name = "gossip"

    def __init__(self, ctx: StrategyContext, config: Strategy.Config | None = None) -> None:
        super().__init__(ctx, config)
        self._flat = flatten_parameters(self.model)
        self._inbox = [torch.empty_like(f) for f in self._flat]

    @torch.no_grad()
    def _after_step(self, step: int) -> bool:
        peer = gossip_peer(self.comm.rank, self.comm.world_size, step)
        if peer is None:
            return False
        for mine, theirs in zip(self._flat, self._inbox, strict=True):
            self.comm.sendrecv_(mine, peer, theirs, peer)
            mine.add_(theirs).mul_(0.5)
        return True

    def final_model(self) -> nn.Module:
        return world_average(self.comm, self.model)
