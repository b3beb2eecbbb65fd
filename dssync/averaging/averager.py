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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager
from torch.distributed.algorithms.model_averaging.utils import get_params_to_average

from dssync._jsonfile import is_whole
from dssync.averaging.ensemble import Ensemble
from dssync.averaging.flat import average_tensors
from dssync.averaging.shuffle import Shuffle
from dssync.collectives import Communicator
from dssync.errors import DssyncError
from dssync.planning.regroup import DEFAULT_MAX_PACE
from dssync.planning.schedule import Schedule
from dssync.topology import Topology

__all__ = ["DSSyncAverager", "LocalSGDState", "default_topology", "local_sgd_hook"]


def default_topology(comm: Communicator, *, num_racks: int = 2, timeout_s: float = 300.0) -> Topology:
    """The topology to plan for when none is given: probed (``dssync probe``'s measurement)
    when the ranks run on more than one host, else ``num_racks`` even logical racks, as
    ``dssync train`` assumes (on one host a probe would measure the CPU)."""
    from dssync.probing.probe import probe_across_hosts

    return (probe_across_hosts(comm, timeout_s=timeout_s)
            or Topology.even(comm.world_size, min(num_racks, comm.world_size)))


class DSSyncAverager(ModelAverager):
    """Averages parameters within this iteration's divide-and-shuffle group: the DS-Sync
    engine, which the ``ds-sync`` strategy of ``dssync train`` drives too.

    ``topology``: a ``Topology``, the path of a topology.json, or ``None`` (``default_topology``);
    ``schedule``: a ``Schedule`` or the path of one to follow instead of planning;
    ``warmup_steps``: iterations at the start with no averaging (DDP averages gradients over
    the world then, as in torch's post-local SGD; use the same number in ``LocalSGDState``);
    ``adjust_every`` / ``max_pace``: online regrouping from the group timings, as the
    ``ds-sync`` strategy's options; ``model`` with ``ensemble="swa"`` (from ``swa_start_step``
    on) or ``"ema"`` (``ema_decay``): the local ensemble that ``final_model`` averages;
    ``comm``: the ``Communicator`` to average over (default: torch.distributed's default
    process group, which must be initialised: gloo for CPU tensors, NCCL for CUDA ones);
    ``nbytes``: what one group average moves, if known (else measured at the first);
    ``plan``: ``auto`` (around slow links, the adjusted or the static plan, whichever mixes
    sooner: ``planner.base_plan``) or ``adjusted`` (the paper's plan); ``world_every``: a
    world average in place of every this many iterations' group average (0: never);
    ``world_first``: world averages at each of the first this many iterations (post-local
    SGD's warm-up, by parameters instead of gradients); ``start=False`` leaves ``start()``
    (collective: plans and creates the groups, and starts the EMA at the model's parameters)
    to the caller.
    """

    def __init__(self, topology: Topology | str | os.PathLike[str] | None = None,
                 schedule: Schedule | str | os.PathLike[str] | None = None, *, warmup_steps: int = 0,
                 adjust_every: int = 0, max_pace: int = DEFAULT_MAX_PACE, steps: int | None = None,
                 model: nn.Module | None = None, ensemble: str = "none", swa_start_step: int = 0,
                 ema_decay: float = 0.98, timeout_s: float = 300.0, comm: Communicator | None = None,
                 nbytes: int = 0, plan: str = "auto", world_every: int = 0, world_first: int = 0,
                 start: bool = True) -> None:
        if comm is None and not dist.is_initialized():
            raise DssyncError("DSSyncAverager averages over torch.distributed: call "
                              "torch.distributed.init_process_group first (torchrun sets the environment)")
        # torch's base sets process_group (the world's, which a Communicator of another backend
        # has not) and step; this averager averages over ``comm``'s groups instead
        self.process_group = dist.group.WORLD if dist.is_initialized() else None
        self.step = 0
        if warmup_steps < 0 or adjust_every < 0:
            raise ValueError(f"warmup_steps and adjust_every must be 0 or more, got {warmup_steps} and {adjust_every}")
        self.ensemble = Ensemble(model, ensemble, swa_from=swa_start_step, ema_decay=ema_decay)
        if comm is None:
            from dssync.collectives.torch_dist import TorchCommunicator

            comm = TorchCommunicator(timeout_s=timeout_s)
        self.comm = comm
        if isinstance(schedule, str | os.PathLike):
            schedule = Schedule.load(schedule)
        if isinstance(topology, str | os.PathLike):
            topology = Topology.load(topology)
        if topology is None:
            topology = default_topology(self.comm, timeout_s=timeout_s)
        self.warmup_steps = warmup_steps
        self.shuffle = Shuffle(self.comm, topology, schedule, adjust_every=adjust_every, max_pace=max_pace,
                               steps=steps, nbytes=nbytes, plan=plan, world_every=world_every,
                               world_first=world_first)
        if start:
            self.start()

    @property
    def swa_model(self) -> nn.Module | None:
        """The local ensemble model (``torch.optim.swa_utils.AveragedModel``), if one is kept."""
        return self.ensemble.averaged

    @property
    def schedule(self) -> Schedule:
        """The schedule in force now (online regrouping replaces it)."""
        return self.shuffle.schedule

    def start(self, *, ensemble: bool = True) -> None:
        """Plan (or check the given schedule), compare it across ranks and create its groups
        (collective), and, with ``ensemble``, start the EMA at the model's parameters."""
        self.shuffle.setup()
        if ensemble:
            self.ensemble.start()

    @torch.no_grad()
    def average_parameters(self, params: Iterable[nn.Parameter] | Iterable[dict[str, Any]]) -> None:
        """Average ``params`` with this rank's group of iteration ``step`` (none during the
        warm-up), then count ``step`` up. One flat buffer per (device, dtype), in the order of
        ``params``: one allreduce each, all in flight at once."""
        step = self.step
        if step >= self.warmup_steps:
            self.average(list(get_params_to_average(params)), step)
            self.after(step)
        self.step += 1

    @torch.no_grad()
    def average(self, tensors: Sequence[torch.Tensor], step: int) -> bool:
        """Average ``tensors`` in place within this rank's group of iteration ``step`` and time
        it for regrouping; False where the group is this rank alone (nothing sent)."""
        group = self.shuffle.group(step)
        if len(group) == 1:
            return False
        t0 = time.perf_counter()
        nbytes = average_tensors(self.comm, tensors, group)
        if not self.shuffle.nbytes:
            self.shuffle.nbytes = nbytes
        self.shuffle.record(step, group, time.perf_counter() - t0)
        return True

    def after(self, step: int) -> None:
        """Iteration ``step``'s average is in: fold it into the ensemble, and regroup when due."""
        self.ensemble.fold(step)
        self.shuffle.after(step)

    def final_model(self, model: nn.Module | None = None) -> nn.Module:
        """A copy of ``model`` (default: the ensemble's model), or of the local ensemble once it
        holds an iterate, averaged over the world once: the model to evaluate and hand back
        (collective; ``model`` is untouched)."""
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        return self.ensemble.final(self.comm, model)

    def regroup(self, next_step: int) -> bool:
        """Regroup now from the window's timings (``Shuffle.regroup``; collective)."""
        return self.shuffle.regroup(next_step)

    def schedule_changes(self) -> list[dict[str, Any]]:
        """``[{step, reason, schedule}]``: the plan at the start and every online change."""
        return list(self.shuffle.changes)

    def state_dict(self) -> dict[str, Any]:
        """``step``, the schedule's position and regrouping state, and the ensemble: with the
        model's and optimizer's state, what a resumed run needs to average as if never stopped."""
        return {"step": self.step, "shuffle": self.shuffle.state_dict(), "ensemble": self.ensemble.state_dict()}

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
        self.restore(state)
        self.step = state["step"]
        self.shuffle.setup()

    def restore(self, state: dict[str, Any]) -> None:
        """The schedule's position and the ensemble from ``state_dict()``, before ``start()``."""
        self.ensemble.check(state["ensemble"], rank=self.comm.rank)
        self.shuffle.load_state_dict(state["shuffle"])
        self.ensemble.load_state_dict(state["ensemble"])


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
