"""``local-sgd``: every rank trains alone and the world averages parameters every ``period``
iterations (periodic model averaging; ``period=1`` is parameter averaging every step).

Parameters live in one flat buffer per dtype (``dssync.averaging.flat``), so an average is one
allreduce. The model handed back is the world average, so ranks that trained apart since
the last average are brought together once more at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from dssync.averaging.flat import average_tensors, flatten_parameters, world_average
from dssync.strategies.base import PeriodicConfig, Strategy, StrategyContext

__all__ = ["LocalSGDStrategy"]


class LocalSGDStrategy(Strategy):
    name = "local-sgd"
    devices = ("cpu", "cuda")

    @dataclass(frozen=True, kw_only=True)
    class Config(PeriodicConfig):
        period: int = 8
        """Average over the world every this many iterations."""

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        self._flat = flatten_parameters(self.model)

    def _after_step(self, step: int) -> bool:
        if (step + 1) % self.config.period:
            return False
        average_tensors(self.comm, self._flat)
        return True

    def final_model(self) -> nn.Module:
        return world_average(self.comm, self.model)
