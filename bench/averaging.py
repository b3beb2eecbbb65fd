"""Overhead of DS-Sync's group averaging against a bare ``dist.all_reduce``.

Both sides run in the same job, on the same process groups, interleaved (the order
alternates every trial), with a barrier before every op: side A is
``DSSyncStrategy.average(step)`` on a model of the chosen size (its parameters live in one
flat buffer); side B is ``torch.distributed.all_reduce`` of one pre-flattened buffer of the
same size on the same group. A round's time is the maximum over ranks (a round takes as
long as its slowest group); the figure is the ratio of the medians over rounds.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from dssync.collectives import Communicator
from dssync.strategies.base import StrategyContext
from dssync.strategies.ds_sync import DSSyncStrategy
from dssync.topology import Topology
from dssync.training.tasks import build_task

__all__ = ["averaging_rank", "summarize"]

DS = DSSyncStrategy.name  # the side that averages through the strategy; "bare" is the plain allreduce


def averaging_rank(comm: Communicator, rack_sizes: list[int], size_mb: float,
                   trials: int, warmup: int) -> dict[str, Any] | None:
    topology = Topology.from_rack_sizes(rack_sizes)
    model = build_task("synthetic", seed=0, model_mb=size_mb).model
    strategy = DSSyncStrategy(StrategyContext(comm=comm, model=model, topology=topology))
    strategy.setup()
    numel = sum(p.numel() for p in model.parameters())
    bare = torch.randn(numel)
    period = len(strategy.schedule.period)
    samples: list[tuple[int, int, str, float]] = []
    for trial in range(warmup + trials):
        for step in range(period):
            group = strategy.schedule.group_of(comm.rank, step)
            pg = comm.process_group(group) if len(group) > 1 else None  # type: ignore[attr-defined]
            order = (DS, "bare") if trial % 2 == 0 else ("bare", DS)
            for side in order:
                comm.barrier()
                t0 = time.perf_counter()
                if side == DS:
                    strategy.average(step)
                elif len(group) > 1:
                    dist.all_reduce(bare, group=pg)
                samples.append((trial, step, side, time.perf_counter() - t0))
    gathered = comm.allgather_object(samples)
    if comm.rank != 0:
        return None
    return summarize(gathered, warmup=warmup, numel=numel, rack_sizes=rack_sizes,
                     period=[[list(g) for g in p] for p in strategy.schedule.period])


def summarize(gathered: list[list[tuple[int, int, str, float]]], *, warmup: int, numel: int,
              rack_sizes: list[int], period: list[list[list[int]]]) -> dict[str, Any]:
    rounds: dict[tuple[int, int, str], float] = {}
    for samples in gathered:
        for trial, step, side, seconds in samples:
            key = (trial, step, side)
            rounds[key] = max(rounds.get(key, 0.0), seconds)
    ms = {side: [v * 1e3 for (trial, _, s), v in sorted(rounds.items()) if s == side and trial >= warmup]
          for side in (DS, "bare")}
    med = {side: statistics.median(v) for side, v in ms.items()}
    return {
        "bytes": numel * 4, "world_size": sum(rack_sizes), "rack_sizes": rack_sizes,
        "period": period, "ds_sync_ms": med[DS], "bare_allreduce_ms": med["bare"],
        "ratio": med[DS] / med["bare"],
        "samples_ms": ms,
    }
