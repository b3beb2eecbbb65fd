"""``allreduce``: bulk-synchronous data parallelism (BSP), the baseline every paper uses.

After backward, every rank's gradients are flattened into one buffer, summed over the
world with one allreduce and divided by the world size, so every rank takes the same
optimizer step: numerically what ``DistributedDataParallel`` does.
"""

from __future__ import annotations

import torch

from dssync.strategies.base import Strategy, StrategyContext

__all__ = ["AllreduceStrategy", "GradientBuffer"]


class GradientBuffer:
    """A model's gradients gathered into one flat buffer and scattered back.

    One buffer means one collective per iteration whatever the number of layers (what DDP's
    buckets do, in one bucket). Parameters without a gradient contribute zeros.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.flat: torch.Tensor | None = None

    @torch.no_grad()
    def gather(self) -> torch.Tensor:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.flat is None:
            self.flat = torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype, device=grads[0].device)
        torch.cat([g.reshape(-1) for g in grads], out=self.flat)
        return self.flat

    @torch.no_grad()
    def scatter(self) -> None:
        assert self.flat is not None, "gather() first"
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(self.flat[offset : offset + n].view_as(p))
            offset += n


class AllreduceStrategy(Strategy):
    name = "allreduce"
    devices = ("cpu", "cuda")
    resumable = True  # nothing carried between iterations beyond the model and optimizer

    def __init__(self, ctx: StrategyContext, config: Strategy.Config | None = None) -> None:
        super().__init__(ctx, config)
        self._grads = GradientBuffer(self.model)

    @torch.no_grad()
    def _before_step(self, step: int) -> bool:
        self.comm.allreduce_(self._grads.gather(), average=True)
        self._grads.scatter()
        return True
