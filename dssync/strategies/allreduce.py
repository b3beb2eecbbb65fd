"""``allreduce``: bulk-synchronous data parallelism (BSP), the baseline every paper uses.

After backward, every rank's gradients are flattened into one buffer, summed over the
world with one allreduce and divided by the world size, so every rank takes the same
optimizer step: numerically what ``DistributedDataParallel`` does.
"""

from __future__ import annotations

import torch

from dssync.strategy import Strategy, StrategyContext

__all__ = ["AllreduceStrategy"]


class AllreduceStrategy(Strategy):
    name = "allreduce"

    def __init__(self, ctx: StrategyContext, config: Strategy.Config | None = None) -> None:
        super().__init__(ctx, config)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._flat: torch.Tensor | None = None

    @torch.no_grad()
    def _before_step(self, step: int) -> bool:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        if self._flat is None:
            self._flat = torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype,
                                     device=grads[0].device)
        torch.cat([g.reshape(-1) for g in grads], out=self._flat)
        self.comm.allreduce_(self._flat, average=True)
        offset = 0
        for p, g in zip(self._params, grads, strict=True):
            n = g.numel()
            if p.grad is None:
                p.grad = g
            p.grad.copy_(self._flat[offset : offset + n].view_as(g))
            offset += n
        return True
