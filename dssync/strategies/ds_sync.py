"""``ds-sync``: divide-and-shuffle synchronization (paper seed 003, section III).

Every iteration each rank takes its local optimizer step, then averages its *parameters*
with the members of its group for that iteration (``schedule.group_of(rank, step)``).
The groups of a round are disjoint, so they all run at once. Parameters live in one flat
buffer per dtype (``dssync.flat``), so the average is one in-place allreduce and one
scale, with nothing copied in or out.

Each rank also keeps an exponential moving average of its parameters
(``torch.optim.swa_utils.AveragedModel`` with ``get_ema_multi_avg_fn``), the paper's local
SWA model (section III-A.5). ``final_model()`` averages those EMA models over the whole
world once; that ensemble is the model ds-sync hands back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from dssync.errors import DssyncError, ScheduleError
from dssync.flat import flatten_parameters
from dssync.planner import plan
from dssync.schedule import Schedule
from dssync.strategy import Strategy, StrategyContext

__all__ = ["DSSyncStrategy"]


class DSSyncStrategy(Strategy):
    name = "ds-sync"

    @dataclass(frozen=True, kw_only=True)
    class Config(Strategy.Config):
        ema_decay: float = 0.98
        """Decay of the local EMA (SWA) model: ``swa = decay * swa + (1 - decay) * model``."""

        def __post_init__(self) -> None:
            if not 0.0 <= self.ema_decay < 1.0:
                raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        schedule = ctx.schedule or plan(ctx.topology)
        if schedule.world_size != self.comm.world_size:
            raise ScheduleError(
                f"the schedule is for {schedule.world_size} ranks but this job has "
                f"{self.comm.world_size}; plan it for the job's topology"
            )
        self.schedule: Schedule = schedule
        self._flat = flatten_parameters(self.model)
        self._views = [(p, p.data_ptr()) for p in self.model.parameters()]
        self.swa_model = AveragedModel(
            self.model, multi_avg_fn=get_ema_multi_avg_fn(self.config.ema_decay), use_buffers=True
        )

    def setup(self) -> None:
        # Ranks must never disagree on the schedule: compare digests before any group op.
        digests = self.comm.allgather_object(self.schedule.digest())
        if len(set(digests)) != 1:
            by_rank = {r: d for r, d in enumerate(digests)}
            raise ScheduleError(
                f"rank {self.comm.rank}: ranks hold different schedules (digest by rank: "
                f"{by_rank}); give every rank the same schedule file"
            )
        self.comm.register_groups(self.schedule.distinct_groups())
        for flat in self._flat:
            self.comm.broadcast_(flat, src=0)
        self.swa_model.update_parameters(self.model)  # start the EMA at the common init

    @torch.no_grad()
    def average(self, step: int) -> bool:
        """Average parameters within this rank's group of iteration ``step``."""
        if any(p.data_ptr() != ptr for p, ptr in self._views):
            raise DssyncError(
                f"rank {self.comm.rank}: model parameters were re-bound after ds-sync flattened "
                "them (vector_to_parameters, load_state_dict(assign=True), p.data = ...); "
                "copy into them in place (p.copy_(...)) instead"
            )
        group = self.schedule.group_of(self.comm.rank, step)
        if len(group) == 1:
            return False
        if len(self._flat) == 1:
            self.comm.allreduce_(self._flat[0], group, average=True)
        else:  # one buffer per dtype: start all, then wait, so they overlap
            for work in [self.comm.allreduce_async_(f, group, average=True) for f in self._flat]:
                work.wait()
        return True

    def _after_step(self, step: int) -> bool:
        return self.average(step)

    @torch.no_grad()
    def _after_comm(self, step: int) -> None:
        self.swa_model.update_parameters(self.model)

    @torch.no_grad()
    def final_model(self) -> nn.Module:
        """One global average of every rank's EMA model (collective)."""
        ensemble = copy.deepcopy(self.swa_model.module)
        tensors = [p.data for p in ensemble.parameters()]
        tensors += [b for b in ensemble.buffers() if b.is_floating_point()]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self.comm.allreduce_(flat, average=True)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
        return ensemble

    def schedule_changes(self) -> list[dict[str, Any]]:
        return [{"step": 0, "reason": "initial", "schedule": self.schedule.to_dict()}]
