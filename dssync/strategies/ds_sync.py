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
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from dssync.errors import DssyncError, ScheduleError
from dssync.flat import flatten_parameters
from dssync.planner import contended, plan
from dssync.regroup import Record, sense_contention
from dssync.schedule import Schedule
from dssync.strategy import Strategy, StrategyContext
from dssync.topology import Topology

__all__ = ["DSSyncStrategy"]


class DSSyncStrategy(Strategy):
    name = "ds-sync"

    @dataclass(frozen=True, kw_only=True)
    class Config(Strategy.Config):
        ema_decay: float = 0.98
        """Decay of the local EMA (SWA) model: ``swa = decay * swa + (1 - decay) * model``."""

        adjust_every: int = 0
        """Regroup online every this many iterations from the group timings (0: never)."""

        def __post_init__(self) -> None:
            if not 0.0 <= self.ema_decay < 1.0:
                raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
            if self.adjust_every < 0:
                raise ValueError(f"adjust_every must be 0 (off) or positive, got {self.adjust_every}")

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
        self._schedule_start = 0  # the iteration at which self.schedule's round 0 ran
        self._contention = contended(ctx.topology)
        self._records: list[Record] = []
        self._changes: list[dict[str, Any]] = [{"step": 0, "reason": "initial", "schedule": schedule.to_dict()}]
        self._flat = flatten_parameters(self.model)
        self._nbytes = sum(f.numel() * f.element_size() for f in self._flat)
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
        group = self.schedule.group_of(self.comm.rank, step - self._schedule_start)
        if len(group) == 1:
            return False
        t0 = time.perf_counter()
        if len(self._flat) == 1:
            self.comm.allreduce_(self._flat[0], group, average=True)
        else:  # one buffer per dtype: start all, then wait, so they overlap
            for work in [self.comm.allreduce_async_(f, group, average=True) for f in self._flat]:
                work.wait()
        if self.config.adjust_every:
            self._records.append((step, group, time.perf_counter() - t0))
        return True

    def _after_step(self, step: int) -> bool:
        return self.average(step)

    @torch.no_grad()
    def _after_comm(self, step: int) -> None:
        self.swa_model.update_parameters(self.model)
        every = self.config.adjust_every
        if every and (step + 1) % every == 0:
            self.regroup(step + 1)

    def _plan(self, topology: Topology) -> Schedule:
        return plan(topology)

    def regroup(self, next_step: int) -> bool:
        """Sense contention from the window's group timings; switch plans at ``next_step``.

        Collective. Every rank gathers every rank's records, so all compute the same answer
        and the same plan; the plan's digest is still compared across ranks, and a mismatch
        is an error, never a hang in mismatched groups. Returns whether the plan changed.
        """
        window = [rec for part in self.comm.allgather_object(self._records) for rec in part]
        self._records = []
        racks = [self.ctx.topology.rack_of(r) for r in range(self.comm.world_size)]
        sensed = sense_contention(window, racks, self._nbytes, current=self._contention)
        if sensed == self._contention:
            return False
        uplinks, nics = sensed
        topology = dataclasses.replace(self.ctx.topology, contention={
            "uplinks": [{"rack": r} for r in uplinks], "nics": [{"rank": i} for i in nics]})
        try:
            schedule = self._plan(topology)
        except ScheduleError:
            return False  # no plan keeps these apart and still mixes: stay on the current one
        self._contention = sensed
        digests = self.comm.allgather_object(schedule.digest())
        if len(set(digests)) != 1:
            raise ScheduleError(
                f"rank {self.comm.rank}: ranks planned different schedules at iteration {next_step} "
                f"(digest by rank: {dict(enumerate(digests))}); their timing records disagree"
            )
        if schedule.digest() == self.schedule.digest():
            return False
        self.comm.register_groups(schedule.distinct_groups())
        self.schedule, self._schedule_start = schedule, next_step
        reason = (f"slow uplinks {uplinks}, slow NICs {nics}" if uplinks or nics else "contention cleared")
        self._changes.append({"step": next_step, "reason": reason, "schedule": schedule.to_dict()})
        return True

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
        return list(self._changes)
