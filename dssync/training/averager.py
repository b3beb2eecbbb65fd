"""DS-Sync in torch's model-averaging interface: two lines in an existing DDP script.

``DSSyncAverager`` is a ``torch.distributed.algorithms.model_averaging.averagers.ModelAverager``:
``average_parameters(params)`` averages the parameters (a model's, or an optimizer's
parameter groups) with this rank's divide-and-shuffle group of the iteration ``step``, then
counts ``step`` up, as torch's ``PeriodicModelAverager`` does. It works inside
``torch.distributed.optim.PostLocalSGDOptimizer``, which calls it after every local step.

With ``DistributedDataParallel``, ``local_sgd_hook`` replaces DDP's global gradient
allreduce: DDP keeps its bucketing and hooks, communicates gradients over the world only
for ``warmup_steps`` iterations (torch's ``allreduce_hook``), and after that hands each rank
its own gradients, so the averager's group average is the only communication::

    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.register_comm_hook(LocalSGDState(), local_sgd_hook)             # dssync
    optimizer = PostLocalSGDOptimizer(optimizer, DSSyncAverager())         # dssync

That loop computes exactly what ``dssync train --strategy ds-sync`` computes on the same
data (tests/launchers/test_ddp_example.py checks it under torchrun, parameter for parameter).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager
from torch.distributed.algorithms.model_averaging.utils import get_params_to_average
from torch.optim.swa_utils import AveragedModel

from dssync._jsonfile import is_whole
from dssync.collectives.torch_dist import TorchCommunicator
from dssync.errors import DssyncError
from dssync.planning.schedule import Schedule
from dssync.strategies.base import world_average
from dssync.strategies.ds_sync import ENSEMBLES, debiased_ema
from dssync.strategies.shuffle import Shuffle
from dssync.topology import Topology

__all__ = ["DSSyncAverager", "LocalSGDState", "default_topology", "local_sgd_hook"]


def default_topology(comm: TorchCommunicator, *, num_racks: int = 2, timeout_s: float = 300.0) -> Topology:
    """The topology to plan for when none is given: probed (``dssync probe``'s measurement)
    when the ranks run on more than one host, else ``num_racks`` even logical racks, as
    ``dssync train`` assumes (on one host a probe would measure the CPU)."""
    from dssync.probing.probe import ProbeConfig, host_name, probe_rank

    if len(set(comm.allgather_object(host_name()))) < 2:
        return Topology.even(comm.world_size, min(num_racks, comm.world_size))
    result = probe_rank(comm, ProbeConfig(timeout_s=timeout_s))
    return result.to_topology({"backend": "builtin", "rounds": result.rounds})


class DSSyncAverager(ModelAverager):
    """Averages parameters within this iteration's divide-and-shuffle group.

    ``topology``: a ``Topology``, the path of a topology.json, or ``None`` (``default_topology``);
    ``schedule``: a ``Schedule`` or the path of one to follow instead of planning;
    ``warmup_steps``: iterations at the start with no averaging (DDP averages gradients over
    the world then, as in torch's post-local SGD; use the same number in ``LocalSGDState``);
    ``adjust_every`` / ``max_pace``: online regrouping from the group timings, as the
    ``ds-sync`` strategy's options; ``model`` with ``ensemble="swa"`` (from ``swa_start_step``
    on) or ``"ema"`` (``ema_decay``): the local ensemble that ``final_model`` averages.

    Needs an initialised default process group (gloo for CPU tensors, NCCL for CUDA ones).
    """

    def __init__(self, topology: Topology | str | os.PathLike[str] | None = None,
                 schedule: Schedule | str | os.PathLike[str] | None = None, *, warmup_steps: int = 0,
                 adjust_every: int = 0, max_pace: int = 4, steps: int | None = None,
                 model: nn.Module | None = None, ensemble: str = "none", swa_start_step: int = 0,
                 ema_decay: float = 0.98, timeout_s: float = 300.0) -> None:
        if not dist.is_initialized():
            raise DssyncError("DSSyncAverager averages over torch.distributed: call "
                              "torch.distributed.init_process_group first (torchrun sets the environment)")
        super().__init__(None)
        if warmup_steps < 0 or adjust_every < 0:
            raise ValueError(f"warmup_steps and adjust_every must be 0 or more, got {warmup_steps} and {adjust_every}")
        if ensemble not in ENSEMBLES:
            raise ValueError(f"ensemble must be one of {', '.join(ENSEMBLES)}, got {ensemble!r}")
        if ensemble != "none" and model is None:
            raise ValueError(f"ensemble={ensemble!r} keeps a copy of the model: pass model=")
        self.comm = TorchCommunicator(timeout_s=timeout_s)
        if isinstance(schedule, str | os.PathLike):
            schedule = Schedule.load(schedule)
        if isinstance(topology, str | os.PathLike):
            topology = Topology.load(topology)
        if topology is None:
            topology = default_topology(self.comm, timeout_s=timeout_s)
        self.warmup_steps = warmup_steps
        self.shuffle = Shuffle(self.comm, topology, schedule, adjust_every=adjust_every, max_pace=max_pace,
                               steps=steps)
        self.shuffle.setup()
        self.swa_model: AveragedModel | None = None
        self._swa_from = swa_start_step
        if ensemble == "ema":
            self.swa_model = AveragedModel(model, multi_avg_fn=debiased_ema(ema_decay), use_buffers=True)
            self.swa_model.update_parameters(model)
        elif ensemble == "swa":
            self.swa_model = AveragedModel(model, use_buffers=True)
        self._model = model

    @property
    def schedule(self) -> Schedule:
        """The schedule in force now (online regrouping replaces it)."""
        return self.shuffle.schedule

    @torch.no_grad()
    def average_parameters(self, params: Iterable[nn.Parameter] | Iterable[dict[str, Any]]) -> None:
        """Average ``params`` with this rank's group of iteration ``step`` (none during the
        warm-up), then count ``step`` up. One flat buffer per (device, dtype), in the order of
        ``params``: one allreduce each, all in flight at once."""
        step = self.step
        if step >= self.warmup_steps:
            group = self.shuffle.group(step)
            if len(group) > 1:
                t0 = time.perf_counter()
                self._average(list(get_params_to_average(params)), group)
                self.shuffle.record(step, group, time.perf_counter() - t0)
            if self.swa_model is not None and step >= self._swa_from:
                self.swa_model.update_parameters(self._model)
            self.shuffle.after(step)
        self.step += 1

    def _average(self, params: list[torch.Tensor], group: tuple[int, ...]) -> None:
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        for p in params:
            by_kind[(p.device, p.dtype)].append(p)
        flats = [torch.cat([p.detach().reshape(-1) for p in ps]) for ps in by_kind.values()]
        if not self.shuffle.nbytes:
            self.shuffle.nbytes = sum(f.numel() * f.element_size() for f in flats)
        for work in [self.comm.allreduce_async_(f, group, average=True) for f in flats]:
            work.wait()
        for flat, ps in zip(flats, by_kind.values(), strict=True):
            offset = 0
            for p in ps:
                p.detach().copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def final_model(self, model: nn.Module) -> nn.Module:
        """A copy of ``model`` (or of the local ensemble, once it holds an iterate) averaged over
        the world once: the model to evaluate and hand back (collective; ``model`` is untouched)."""
        module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        ensembled = self.swa_model is not None and int(self.swa_model.n_averaged) > 0
        return world_average(self.comm, self.swa_model.module if ensembled else module)

    def schedule_changes(self) -> list[dict[str, Any]]:
        """``[{step, reason, schedule}]``: the plan at the start and every online change."""
        return list(self.shuffle.changes)

    def state_dict(self) -> dict[str, Any]:
        """``step``, the schedule's position and regrouping state, and the ensemble: with the
        model's and optimizer's state, what a resumed run needs to average as if never stopped."""
        return {"step": self.step, "shuffle": self.shuffle.state_dict(),
                "ensemble": None if self.swa_model is None else self.swa_model.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` (collective when it re-plans or creates the groups of the
        saved schedule). ``state`` holds tensors and plain data only, so that a checkpoint that
        carries it loads with ``torch.load(weights_only=True)``, torch's default; a malformed
        one is a one-line ``DssyncError`` before anything changes."""
        if not isinstance(state, dict) or not {"step", "shuffle", "ensemble"} <= state.keys() \
                or not is_whole(state["step"]) \
                or not isinstance(state["shuffle"], dict) or not isinstance(state["ensemble"], dict | None):
            raise DssyncError(f"rank {self.comm.rank}: not a DSSyncAverager.state_dict() (it has step, shuffle and "
                              f"ensemble: a whole number, a dict, a dict or None); got {_shape(state)}")
        if (state["ensemble"] is None) != (self.swa_model is None):
            raise DssyncError("the checkpoint was written with another ensemble setting than this averager's")
        self.shuffle.load_state_dict(state["shuffle"])
        self.step = state["step"]
        self.shuffle.setup()
        if self.swa_model is not None:
            self.swa_model.load_state_dict(state["ensemble"])


def _shape(value: Any) -> str:
    """A short description of ``value`` for an error message: its type, and a dict's keys."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!s:.20}: {type(v).__name__}" for k, v in list(value.items())[:6]) + "}"
    return type(value).__name__


@dataclass
class LocalSGDState:
    """``local_sgd_hook``'s state: the iterations DDP still averages gradients over the world
    (``warmup_steps``, the averager's), and the iteration count so far."""

    warmup_steps: int = 0
    process_group: Any = None
    iteration: int = 0


def local_sgd_hook(state, bucket):  # noqa: ANN001, ANN201 - DDP checks the hook's annotations
    """DDP communication hook: torch's ``allreduce_hook`` over the world during the warm-up,
    then none at all, each rank keeping its own gradients (the averager averages parameters
    after the step instead). Register with ``model.register_comm_hook(LocalSGDState(), local_sgd_hook)``.

    Unannotated: DDP accepts only its own annotation objects, which postponed annotations
    turn into strings. With ``broadcast_buffers=True`` (DDP's default) a model with buffers
    still broadcasts them over the world every forward; pass ``broadcast_buffers=False``."""
    warm = state.iteration < state.warmup_steps
    if bucket.is_last():
        state.iteration += 1
    if warm:
        return allreduce_hook(state.process_group, bucket)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
