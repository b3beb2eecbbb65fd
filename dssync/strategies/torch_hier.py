"""``torch-hier``: torch's hierarchical model averaging, laid on the racks.

torch's own ``HierarchicalModelAverager`` (``torch.distributed.algorithms.model_averaging``,
hierarchical SGD, arXiv 2010.12998) driven by torch's ``PostLocalSGDOptimizer``: every rank
takes its local optimizer step, then the averager averages parameters within the group of
the largest period that divides the step counter. Here the hierarchy has two levels:

- every ``rack_period`` (1) iterations, within each rack;
- every ``world_period`` (4) iterations, over the world (that iteration's rack average is
  then not needed, and torch skips it).

Both the averaging and the step counter are torch's code. torch builds the lower levels with
``dist.new_subgroups(group_size)``, which cuts the world into equal runs of consecutive ranks;
to lay them on racks of any sizes (5 and 3, say) the rack groups are made with
``dist.new_subgroups_by_enumeration`` and put in the averager's ``period_process_group_dict``
in place of torch's, the one thing set from outside. No warm-up (torch's ``warmup_steps``
with a post-local SGD hook on DDP) is used: averaging starts at iteration 0.

The model handed back is the world average of the ranks' parameters.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
    HierarchicalModelAverager,
)

from dssync.averaging.flat import world_average
from dssync.errors import DssyncError
from dssync.strategies.base import Strategy, StrategyContext
from dssync.strategies.ddp import require_torch_distributed

if TYPE_CHECKING:  # torch.distributed.optim imports FSDP and DTensor: a third of a rank's start-up
    from torch.distributed.optim import PostLocalSGDOptimizer

__all__ = ["TorchHierStrategy", "rack_averager"]


def rack_averager(racks: list[list[int]], *, rack_period: int, world_period: int) -> HierarchicalModelAverager:
    """torch's ``HierarchicalModelAverager`` whose lower level is this rank's rack (collective:
    every rank creates every rack's group, in the same order)."""
    world_size = dist.get_world_size()
    averager = HierarchicalModelAverager(OrderedDict([(world_period, world_size)]), warmup_steps=0)
    mine, _ = dist.new_subgroups_by_enumeration([list(r) for r in racks])
    if rack_period < world_period:
        averager.period_process_group_dict = OrderedDict(
            [(rack_period, mine), (world_period, averager.period_process_group_dict[world_period])])
        averager._periods = list(averager.period_process_group_dict)
    return averager


class TorchHierStrategy(Strategy):
    name = "torch-hier"
    devices = ("cpu", "cuda")

    @dataclass(frozen=True, kw_only=True)
    class Config(Strategy.Config):
        rack_period: int = 1
        """Average within the rack every this many iterations."""
        world_period: int = 4
        """Average over the world every this many iterations."""

        def __post_init__(self) -> None:
            if self.rack_period < 1 or self.world_period < 1:
                raise ValueError(f"periods must be at least 1, got rack_period {self.rack_period}, "
                                 f"world_period {self.world_period}")
            if self.world_period % self.rack_period:
                raise ValueError(f"world_period ({self.world_period}) must be a multiple of rack_period "
                                 f"({self.rack_period}): torch's averager takes the largest period that "
                                 "divides the step")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        require_torch_distributed(self.name, self.comm)
        self.optimizer: PostLocalSGDOptimizer | None = None

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        from torch.distributed.optim import PostLocalSGDOptimizer

        # The averager needs process groups, which setup() makes; it is put in then.
        self.optimizer = PostLocalSGDOptimizer(optimizer, averager=None)  # type: ignore[arg-type]
        return self.optimizer

    def setup(self) -> None:
        super().setup()
        if self.optimizer is None:
            raise DssyncError("torch-hier averages inside the optimizer's step: pass the optimizer through "
                              "strategy.wrap_optimizer() before setup()")
        averager = rack_averager(self.ctx.topology.racks(), rack_period=self.config.rack_period,
                                 world_period=self.config.world_period)
        average = averager.average_parameters

        def timed(params: Any) -> None:  # the iteration's communication, inside optimizer.step()
            t0 = time.perf_counter()
            average(params)
            self._exposed_s += time.perf_counter() - t0

        averager.average_parameters = timed  # type: ignore[method-assign]
        self.optimizer.averager = averager

    def final_model(self) -> nn.Module:
        return world_average(self.comm, self.model)
