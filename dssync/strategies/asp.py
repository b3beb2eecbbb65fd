"""``asp``: data parallelism through the sharded parameter server (``dssync.ps.server``).

Every iteration a worker pushes its gradient to every shard, where it is applied at once
by ``torch.optim.SGD`` with the loop's settings (momentum, dampening, Nesterov, weight decay,
and the learning rate divided by the number of workers: see ``Config.scale_lr``), and pulls the shards' parameters
back into its model. ``asp`` never waits for other workers: its gradients can be
computed on parameters many updates old (``ssp`` bounds that). The optimizer runs on the
servers, so the loop's optimizer must be passed through ``wrap_optimizer`` (its ``step``
becomes a no-op). The model handed back is the servers' parameters after every push has
been applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from dssync.averaging.flat import flatten_parameters, hookless_copy
from dssync.errors import DssyncError
from dssync.ps.server import ParameterServer, ShardServer
from dssync.strategies.allreduce import GradientBuffer
from dssync.strategies.base import StepsElsewhere, Strategy, StrategyContext

__all__ = ["ASPStrategy"]

#: The loop's ``torch.optim.SGD`` settings the shards step with. The learning rate is set per
#: server (``_server_lr``); weight decay is the worker's (``ASPStrategy._before_step``).
SGD_SETTINGS = ("momentum", "dampening", "nesterov", "maximize")


class ASPStrategy(Strategy):
    name = "asp"
    staleness: int | None = None
    settled_snapshots: ClassVar[bool] = False
    """Evaluate mid-run on the settled model (collective) rather than on a pull by rank 0."""

    @dataclass(frozen=True, kw_only=True)
    class Config(Strategy.Config):
        scale_lr: bool = True
        """Apply each push with the loop's learning rate divided by the number of workers, so
        that n pushes of batch B move the model as far as one BSP step of the same learning
        rate on batch nB (Sync-Switch's configuration policy: BSP runs n*eta on n*B, ASP eta on
        B). Without it, n workers step n times as often at the full rate."""

    config: Config

    def __init__(self, ctx: StrategyContext, config: Strategy.Config | None = None) -> None:
        super().__init__(ctx, config)
        flats = flatten_parameters(self.model)
        if len(flats) != 1 or flats[0].dtype != torch.float32:
            raise DssyncError(f"{self.name} serves one float32 parameter buffer; this model has "
                              f"{[str(f.dtype) for f in flats]}")
        self._flat = flats[0]
        self._grads = GradientBuffer(self.model)
        self._settings: dict[str, float] | None = None
        self.server: ShardServer | None = None

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if not isinstance(optimizer, torch.optim.SGD) or len(optimizer.param_groups) != 1:
            raise DssyncError(f"{self.name} applies updates on the servers with SGD: pass one torch.optim.SGD "
                              "with a single parameter group")
        group = optimizer.param_groups[0]
        self._group = group
        self._set_lr = group["lr"]
        self._weight_decay = float(group.get("weight_decay", 0.0))
        self._settings = {"lr": self._server_lr(group["lr"]),
                          **{k: group[k] for k in SGD_SETTINGS if k in group}}
        return StepsElsewhere(optimizer)

    def _server_lr(self, lr: float) -> float:
        """The learning rate the shards apply each push with."""
        return lr / (self.comm.world_size if self.config.scale_lr else 1)

    def _make_server(self, settings: dict[str, float]) -> ShardServer:
        return ParameterServer(self.comm, self._flat, staleness=self.staleness, **settings)

    def setup(self) -> None:
        if self._settings is None:
            raise DssyncError(f"{self.name} steps on the parameter servers: pass the optimizer through "
                              "strategy.wrap_optimizer() before setup()")
        super().setup()  # every shard starts from rank 0's parameters
        self.server = self._make_server(self._settings)

    @torch.no_grad()
    def _before_step(self, step: int) -> bool:
        assert self.server is not None, "setup() first"
        grad = self._grads.gather()
        # Weight decay is a term of the worker's gradient, on the parameters it was computed on
        # (an L2 term of the loss, as parameter-server deployments compute it): it then scales
        # with the rate below, as torch's SGD decays at the current rate. In a synchronous round
        # those parameters are the shard's, and the step is torch's SGD with weight decay.
        if self._weight_decay:
            grad.add_(self._flat, alpha=self._weight_decay)
        # A learning-rate schedule on the loop's optimizer (warm-up, decay) reaches the shards,
        # which apply the rate set at wrap time, as the gradient scaled by the rate's change:
        # the momentum buffer then sums rate-weighted gradients (Sutskever's form of momentum),
        # the same update as torch's SGD while the rate holds still.
        scale = self._group["lr"] / self._set_lr
        if scale != 1.0:
            grad.mul_(scale)
        self.server.push_pull(grad, clock=step)
        return True

    def snapshot_is_collective(self) -> bool:
        return self.settled_snapshots

    def snapshot(self) -> nn.Module:
        """Mid-run, rank 0 reads the servers' current parameters, as a monitor would, and no
        worker waits for another (an evaluation barrier would make the run partly synchronous)."""
        if self.settled_snapshots:
            return self.final_model()
        assert self.server is not None, "setup() first"
        if self.comm.rank == 0:
            self.server.pull()
        return self.model

    def global_updates(self) -> int | None:
        return None if self.server is None else max(self.server.versions)

    def final_model(self) -> nn.Module:
        assert self.server is not None, "setup() first"
        self.server.pull_settled()  # every push of every worker has been answered, so applied
        return self._handed_back()

    def _handed_back(self) -> nn.Module:
        return hookless_copy(self.model)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

