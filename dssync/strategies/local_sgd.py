"""``local-sgd``: every rank trains alone and the world averages parameters every ``period``
iterations (periodic model averaging; ``period=1`` is parameter averaging every step).

Parameters live in one flat buffer per dtype (``dssync.flat``), so an average is one
allreduce. The model handed back is the world average, so ranks that trained apart since
the last average are brought together once more at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dssync.flat import flatten_parameters
from dssync.strategies.base import Strategy, StrategyContext, world_average

__all__ = ["LocalSGDStrategy"]


class LocalSGDStrategy(Strategy):
    name = "local-sgd"
    devices = ("cpu", "cuda")

    @dataclass(frozen=True, kw_only=True)
    class Config(Strategy.Config):
        period: int = 8
        """Average over the world every this many iterations."""

        def __post_init__(self) -> None:
            if self.period < 1:
                raise ValueError(f"period must be at least 1, got {self.period}")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        self._flat = flatten_parameters(self.model)

    @torch.no_grad()
    def _average(self) -> None:
        for work in [self.comm.allreduce_async_(f, average=True) for f in self._flat]:
            work.wait()

    def _after_step(self, step: int) -> bool:
        if (step + 1) % self.config.period:
            return False
        self._average()
        return True

    def final_model(self) -> nn.Module:
        return world_average(self.comm, self.model)
