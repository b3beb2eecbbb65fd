"""``diloco``: DiLoCo (Douillard et al., arXiv 2311.08105, Algorithm 1).

Every rank trains alone for ``inner_steps`` (H) iterations with the loop's optimizer (the
inner optimizer, whose state each rank keeps across rounds), then the world averages the
*pseudo-gradient*, the outer parameters minus the rank's current ones, and one outer
optimizer step, Nesterov momentum SGD, moves the outer parameters along it; every rank then
continues from the new outer parameters. With ``outer_lr=1`` and no momentum this is local
SGD with period H.

Outer settings are the paper's: learning rate 0.7, Nesterov momentum 0.9. The paper trains
language models with H = 500 inner steps; runs here are about a thousand iterations, so the
default H is 20 (50 outer steps a run; the paper's ablation, Fig. 3, keeps the same quality
from H = 50 to 500 at 88,000 steps, about 180 to 1,800 outer steps). The outer optimizer is
``torch.optim.SGD(nesterov=True)`` on a flat copy of the outer parameters, identical on
every rank, so only the average of the pseudo-gradient travels: one allreduce every H steps.

The model handed back is the outer model: the world's last agreed parameters (between outer
steps the ranks' own models have drifted apart, and no rank holds the average).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dssync.averaging.flat import average_tensors, flatten_parameters, hookless_copy
from dssync.errors import DssyncError
from dssync.strategies.base import Strategy, StrategyContext

__all__ = ["DiLoCoStrategy"]


class DiLoCoStrategy(Strategy):
    name = "diloco"
    devices = ("cpu", "cuda")

    @dataclass(frozen=True, kw_only=True)
    class Config(Strategy.Config):
        inner_steps: int = 20
        """H: inner (local) iterations between outer steps."""
        outer_lr: float = 0.7
        """The outer optimizer's learning rate (paper: 0.7)."""
        outer_momentum: float = 0.9
        """The outer optimizer's Nesterov momentum (paper: 0.9)."""

        def __post_init__(self) -> None:
            if self.inner_steps < 1:
                raise ValueError(f"inner_steps must be at least 1, got {self.inner_steps}")
            if not self.outer_lr > 0:
                raise ValueError(f"outer_lr must be positive, got {self.outer_lr}")
            if not 0 <= self.outer_momentum < 1:
                raise ValueError(f"outer_momentum must be in [0, 1), got {self.outer_momentum}")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        self._flat = flatten_parameters(self.model)
        self._outer: list[torch.Tensor] = []
        self._outer_optimizer: torch.optim.Optimizer | None = None

    def setup(self) -> None:
        for flat in self._flat:
            self.comm.broadcast_(flat, src=0)
        for b in self.model.buffers():
            self.comm.broadcast_(b, src=0)
        self._outer = [f.detach().clone() for f in self._flat]
        self._outer_optimizer = torch.optim.SGD(self._outer, lr=self.config.outer_lr,
                                                momentum=self.config.outer_momentum,
                                                nesterov=self.config.outer_momentum > 0)

    @torch.no_grad()
    def outer_step(self) -> None:
        """Average the pseudo-gradients over the world and take the outer Nesterov step; every
        rank continues from the new outer parameters (collective)."""
        if self._outer_optimizer is None:
            raise DssyncError("diloco: call strategy.setup() before training")
        pseudo = [outer - local for outer, local in zip(self._outer, self._flat, strict=True)]
        average_tensors(self.comm, pseudo)
        for outer, delta in zip(self._outer, pseudo, strict=True):
            outer.grad = delta
        self._outer_optimizer.step()
        for local, outer in zip(self._flat, self._outer, strict=True):
            local.copy_(outer)

    def _after_step(self, step: int) -> bool:
        if (step + 1) % self.config.inner_steps:
            return False
        self.outer_step()
        return True

    @torch.no_grad()
    def final_model(self) -> nn.Module:
        own = [f.clone() for f in self._flat]
        for local, outer in zip(self._flat, self._outer, strict=True):
            local.copy_(outer)
        handed_back = hookless_copy(self.model)
        for local, mine in zip(self._flat, own, strict=True):
            local.copy_(mine)
        return handed_back
