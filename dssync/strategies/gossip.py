"""``gossip``: pairwise parameter averaging on the dynamic exponential graph (SGP-style).

The one-peer exponential graph of Stochastic Gradient Push (Assran et al., 2019): after its
local step, rank ``i`` sends its parameters to ``i + 2^k`` and receives those of
``i - 2^k`` (mod ``n``), with ``k = step mod ceil(log2 n)``, and keeps the average of its own
and the received ones. Each iteration is one point-to-point send and one receive per rank
(no group, no barrier). The mixing matrix ``(I + P)/2`` of a cyclic shift ``P`` is doubly
stochastic, so gossip never changes the world average of the parameters, and with ``n`` a
power of two every rank holds the exact average after ``log2 n`` iterations. Like the
gossip the paper compares with, the graph follows rank numbers, not racks: with ranks
numbered rack by rack some exchanges cross an uplink in every iteration, and in one of
every ``log2 n`` all of them do. The model handed back is the world average of the ranks'
models.

Its one setting, ``period``, is how often a rank gossips: every ``period`` iterations, the
``k``-th exchange taking offset ``2^(k mod ceil(log2 n))`` (local SGD between exchanges,
as in the local-update gossip methods; ``period=1`` is SGP's one exchange per iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dssync.averaging.flat import flatten_parameters, world_average
from dssync.patterns import gossip_peers
from dssync.strategies.base import PeriodicConfig, Strategy, StrategyContext

__all__ = ["GossipStrategy"]


class GossipStrategy(Strategy):
    name = "gossip"
    devices = ("cpu", "cuda")

    @dataclass(frozen=True, kw_only=True)
    class Config(PeriodicConfig):
        period: int = 1
        """Gossip every this many iterations (local steps in between)."""

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        self._flat = flatten_parameters(self.model)
        self._inbox = [torch.empty_like(f) for f in self._flat]

    @torch.no_grad()
    def _after_step(self, step: int) -> bool:
        if (step + 1) % self.config.period:
            return False
        peers = gossip_peers(self.comm.rank, self.comm.world_size, step // self.config.period)
        if peers is None:
            return False
        dst, src = peers
        for mine, theirs in zip(self._flat, self._inbox, strict=True):
            self.comm.sendrecv_(mine, dst, theirs, src)
            mine.add_(theirs).mul_(0.5)
        return True

    def final_model(self) -> nn.Module:
        return world_average(self.comm, self.model)
