"""``ds-sync``: divide-and-shuffle synchronization (the DS-Sync paper, section III).

Every iteration each rank takes its local optimizer step, then averages its *parameters*
with the members of its group for that iteration (``schedule.group_of(rank, step)``).
The groups of a round are disjoint, so they all run at once. Parameters live in one flat
buffer per dtype (``dssync.flat``), so the average is one in-place allreduce and one
scale, with nothing copied in or out.

``final_model()`` averages over the whole world once (paper section III-A.5) and hands that
back: by default the workers' current parameters; with ``ensemble="swa"`` or ``"ema"`` each
rank's local ensemble model (``torch.optim.swa_utils.AveragedModel``: an equal average of the
iterates from ``swa_start`` of the run on, or the paper's exponential moving average,
bias-corrected by ``debiased_ema``).

``overlap=True`` is the paper's layer-wise mode (section V-A.1): as soon as backward has
produced all of a layer's gradients, a hook applies that layer's local update (one
optimizer per parameter, with the loop's optimizer's settings) and starts the layer's
group allreduce without waiting; the layer's forward pre-hook in the next iteration waits
for it. Communication of the last layers then overlaps the backward pass of the first
ones and the forward pass of the next iteration. Consecutive layers share one allreduce
until it holds ``bucket_mb`` (filled in backward order, as DDP fills its buckets), so a
model of many small layers does not pay one allreduce's latency per layer; ``bucket_mb=0``
is the paper's one allreduce per layer. Every parameter must receive a gradient every
iteration in this mode.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from dssync.errors import DssyncError
from dssync.flat import flatten_parameters
from dssync.planning.schedule import Schedule
from dssync.strategies.base import StepsElsewhere, Strategy, StrategyContext, world_average
from dssync.strategies.shuffle import Shuffle

__all__ = ["ENSEMBLES", "DSSyncStrategy", "debiased_ema"]

ENSEMBLES = ("swa", "ema", "none")


def debiased_ema(decay: float):
    """``multi_avg_fn`` for ``AveragedModel``: the EMA ``decay * avg + (1 - decay) * x`` with
    Adam's bias correction, so after ``t`` updates the average is
    ``sum_i decay^(t-i) x_i / sum_i decay^(t-i)``. The plain EMA
    (``get_ema_multi_avg_fn``) keeps weight ``decay^(t-1)`` on its first value, the random
    initialisation, for the first few hundred iterations (0.67 after 20 at decay 0.98);
    the corrected one forgets it as fast as it forgets any other iterate."""

    @torch.no_grad()
    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: Any) -> None:
        weight = (1.0 - decay) / (1.0 - decay ** (int(num_averaged) + 1))
        torch._foreach_lerp_(averaged, current, weight)

    return update


class DSSyncStrategy(Strategy):
    name = "ds-sync"
    devices = ("cpu", "cuda")
    resumable = True

    @dataclass(frozen=True, kw_only=True)
    class Config(Strategy.Config):
        ensemble: str = "none"
        """The local model each rank keeps and the world averages once at the end (paper
        section III-A.5): ``none``, the current parameters, so the handed-back model is the
        plain world average of the workers; ``swa``, the equal-weight average of the rank's
        iterates from ``swa_start`` of the run on (``torch.optim.swa_utils.AveragedModel``;
        before that, the plain world average); ``ema``, an exponential moving average of every
        iterate (``ema_decay``, the paper's pseudo-code). ``none`` is the default because it
        is the only rule measured never to cost accuracy (``dssync bench ensemble``,
        bench/README.md): on a converged run the others moved the result by a few test images
        either way, and on short runs at a constant learning rate they lag the workers."""
        swa_start: float = 0.75
        """``ensemble="swa"``: the fraction of the run's iterations after which iterates are averaged."""
        ema_decay: float = 0.98
        """``ensemble="ema"``: ``avg = decay * avg + (1 - decay) * model``, bias-corrected
        (``debiased_ema``)."""

        adjust_every: int = 0
        """Regroup online every this many iterations from the group timings (0: never)."""
        max_pace: int = 4
        """Regrouping may let racks exchange as rarely as every this many rounds when the
        cross-rack group is the job's bottleneck (``regroup.cross_rack_pace``,
        ``planner.paced``; dssync's extension). 1: every round, as in the paper."""
        overlap: bool = False
        """Layer-wise overlapped averaging (paper section V-A.1) instead of after the step."""
        bucket_mb: float = 1.0
        """Overlapped mode: consecutive layers, in backward order, share one allreduce until
        it holds this many MB (0: one allreduce per layer, as in the paper)."""

        def __post_init__(self) -> None:
            if self.ensemble not in ENSEMBLES:
                raise ValueError(f"ensemble must be one of {', '.join(ENSEMBLES)}, got {self.ensemble!r}")
            if not 0.0 <= self.swa_start <= 1.0:
                raise ValueError(f"swa_start must be a fraction of the run in [0, 1], got {self.swa_start}")
            if not 0.0 <= self.ema_decay < 1.0:
                raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
            if self.bucket_mb < 0:
                raise ValueError(f"bucket_mb must be 0 (one allreduce per layer) or positive, got {self.bucket_mb}")
            if self.max_pace < 1:
                raise ValueError(f"max_pace must be 1 (racks exchange every round) or more, got {self.max_pace}")
            if self.adjust_every < 0:
                raise ValueError(f"adjust_every must be 0 (off) or positive, got {self.adjust_every}")
            if self.overlap and self.adjust_every:
                raise ValueError("overlap and adjust_every do not combine yet: regrouping times whole "
                                 "group allreduces, which overlapped mode splits by layer")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        self._flat = flatten_parameters(self.model)
        self._nbytes = sum(f.numel() * f.element_size() for f in self._flat)
        self.shuffle = Shuffle(self.comm, ctx.topology, ctx.schedule, adjust_every=self.config.adjust_every,
                               max_pace=self.config.max_pace, steps=ctx.steps, nbytes=self._nbytes)
        self._step = 0  # the iteration whose backward is running (overlapped mode)
        self._buckets: list[_Bucket] = []
        self._param_optimizers: dict[nn.Parameter, torch.optim.Optimizer] = {}
        # the loop's optimizer and each parameter's group index in it: by index, because
        # Optimizer.load_state_dict (a resume) replaces the group dicts a scheduler then sets
        self._loop_optimizer: torch.optim.Optimizer | None = None
        self._loop_groups: dict[nn.Parameter, int] = {}
        self._swa_due = False
        self._views = [(p, p.data_ptr()) for p in self.model.parameters()]
        self.swa_model: AveragedModel | None = None
        self._swa_from = 0  # the first iteration whose result the ensemble takes in
        if self.config.ensemble == "ema":
            self.swa_model = AveragedModel(self.model, multi_avg_fn=debiased_ema(self.config.ema_decay),
                                           use_buffers=True)
        elif self.config.ensemble == "swa":
            self.swa_model = AveragedModel(self.model, use_buffers=True)
            self._swa_from = math.ceil(self.config.swa_start * (ctx.steps or 0))

    @property
    def schedule(self) -> Schedule:
        """The schedule in force now (online regrouping replaces it)."""
        return self.shuffle.schedule

    def setup(self) -> None:
        # Ranks must never disagree on the schedule: compare digests before any group op.
        self.shuffle.setup()
        if not self._resumed:
            for flat in self._flat:
                self.comm.broadcast_(flat, src=0)
            if self.config.ensemble == "ema":
                self.swa_model.update_parameters(self.model)  # start the EMA at the common init
        if self.config.overlap:
            self._install_hooks()

    # -- overlapped mode ------------------------------------------------------------------
    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if not self.config.overlap:
            return optimizer
        self._loop_optimizer = optimizer
        for index, group in enumerate(optimizer.param_groups):
            settings = {k: v for k, v in group.items() if k not in ("params", "initial_lr")}
            for p in group["params"]:
                self._param_optimizers[p] = type(optimizer)([p], **settings)
                self._loop_groups[p] = index
        return StepsElsewhere(optimizer)

    def _install_hooks(self) -> None:
        if not self._param_optimizers:
            raise DssyncError("overlapped ds-sync steps inside backward: pass the optimizer through "
                              "strategy.wrap_optimizer() before setup()")
        layers = [(m, ps) for m in self.model.modules()
                  if (ps := [p for p in m.parameters(recurse=False) if p.requires_grad])]
        cap = self.config.bucket_mb * 1e6
        # Backward produces gradients roughly from the last layer to the first: fill buckets
        # in that order, as DDP does, so the first bucket is ready early. A bucket is one span
        # of the flat buffer, so its allreduce copies nothing.
        for module, params in reversed(layers):
            if _contiguous_view(params, self._flat) is None:
                raise DssyncError(f"overlapped ds-sync needs each layer's parameters side by side in one "
                                  f"dtype; {type(module).__name__} mixes dtypes")
            last = self._buckets[-1] if self._buckets else None
            joined = None if last is None or last.view.nbytes >= cap else \
                _contiguous_view(last.params + params, self._flat)
            if joined is None:
                self._buckets.append(_Bucket([module], params, _contiguous_view(params, self._flat)))
            else:
                last.modules.append(module)
                last.params.extend(params)
                last.view = joined
        for bucket in self._buckets:
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, bucket))
            for module in bucket.modules:
                module.register_forward_pre_hook(functools.partial(self._wait_bucket, bucket))
        self.model.register_forward_hook(self._after_forward)

    @torch.no_grad()
    def _on_grad(self, bucket: _Bucket, param: nn.Parameter) -> None:
        optimizer = self._param_optimizers[param]
        # follows the loop's scheduler
        optimizer.param_groups[0]["lr"] = self._loop_optimizer.param_groups[self._loop_groups[param]]["lr"]
        optimizer.step()
        param.grad = None
        bucket.ready += 1
        if bucket.ready < len(bucket.params):
            return
        bucket.ready = 0
        group = self.shuffle.group(self._step)
        if len(group) > 1:
            bucket.work = self.comm.allreduce_async_(bucket.view, group, average=True)

    def _wait_bucket(self, bucket: _Bucket, module: nn.Module | None = None, args: Any = None) -> None:
        if bucket.work is not None:
            t0 = time.perf_counter()
            bucket.work.wait()
            self._exposed_s += time.perf_counter() - t0
            bucket.work = None

    @torch.no_grad()
    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        # Every layer has waited for its average: the parameters are the previous
        # iteration's averaged ones, which is what after-step mode folds into the ensemble.
        if self._swa_due:
            self._fold(self._step - 1)
            self._swa_due = False

    def _fold(self, step: int) -> None:
        """Take the parameters after iteration ``step`` into the local ensemble model."""
        if self.swa_model is not None and step >= self._swa_from:
            self.swa_model.update_parameters(self.model)

    def flush(self) -> None:
        """Wait for every layer's allreduce and fold the result into the EMA (overlapped mode)."""
        for bucket in self._buckets:
            self._wait_bucket(bucket)
        self._after_forward(self.model, (), None)

    @torch.no_grad()
    def average(self, step: int) -> bool:
        """Average parameters within this rank's group of iteration ``step``."""
        if any(p.data_ptr() != ptr for p, ptr in self._views):
            raise DssyncError(
                f"rank {self.comm.rank}: model parameters were re-bound after ds-sync flattened "
                "them (vector_to_parameters, load_state_dict(assign=True), p.data = ...); "
                "copy into them in place (p.copy_(...)) instead"
            )
        group = self.shuffle.group(step)
        if len(group) == 1:
            return False
        t0 = time.perf_counter()
        if len(self._flat) == 1:
            self.comm.allreduce_(self._flat[0], group, average=True)
        else:  # one buffer per dtype: start all, then wait, so they overlap
            for work in [self.comm.allreduce_async_(f, group, average=True) for f in self._flat]:
                work.wait()
        self.shuffle.record(step, group, time.perf_counter() - t0)
        return True

    def _after_step(self, step: int) -> bool:
        if self.config.overlap:
            return False  # started layer by layer in backward
        return self.average(step)

    @torch.no_grad()
    def _after_comm(self, step: int) -> None:
        if self.config.overlap:
            partial = [bucket for bucket in self._buckets if bucket.ready]
            if partial:
                names = [type(m).__name__ for bucket in partial for m in bucket.modules]
                raise DssyncError(
                    f"rank {self.comm.rank}: overlapped ds-sync got gradients for only some parameters "
                    f"of {names} at iteration {step}; every parameter must get a gradient every "
                    "iteration in this mode (use the after-step mode)"
                )
            self._step = step + 1
            self._swa_due = True
            return
        self._fold(step)
        self.shuffle.after(step)

    def state_dict(self) -> dict[str, Any]:
        """The schedule's position and regrouping state, and the local ensemble model (after
        the in-flight averages of overlapped mode have landed)."""
        self.flush()
        return {"shuffle": self.shuffle.state_dict(), "step": self._step,
                "ensemble": None if self.swa_model is None else self.swa_model.state_dict(),
                "param_optimizers": [o.state_dict() for o in self._param_optimizers.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.shuffle.load_state_dict(state["shuffle"])
        self._step = int(state["step"])
        if (state["ensemble"] is None) != (self.swa_model is None):
            raise DssyncError(f"rank {self.comm.rank}: the checkpoint was written with another ensemble "
                              f"setting than this run's ({self.config.ensemble}); resume with the same one")
        if self.swa_model is not None:
            self.swa_model.load_state_dict(state["ensemble"])
        if len(state["param_optimizers"]) != len(self._param_optimizers):
            raise DssyncError(f"rank {self.comm.rank}: the checkpoint was written with overlap="
                              f"{bool(state['param_optimizers'])}; resume with the same setting")
        for optimizer, saved in zip(self._param_optimizers.values(), state["param_optimizers"], strict=True):
            optimizer.load_state_dict(saved)

    def regroup(self, next_step: int) -> bool:
        """Regroup now from the window's timings (``Shuffle.regroup``; collective)."""
        return self.shuffle.regroup(next_step)

    @torch.no_grad()
    def final_model(self) -> nn.Module:
        """One global average of every rank's ensemble model, or of the current parameters
        before the ensemble holds any iterate (collective)."""
        self.flush()
        ensembled = self.swa_model is not None and int(self.swa_model.n_averaged) > 0
        return world_average(self.comm, self.swa_model.module if ensembled else self.model)

    def schedule_changes(self) -> list[dict[str, Any]]:
        return list(self.shuffle.changes)


@dataclass(eq=False)
class _Bucket:
    """Consecutive modules whose parameters are averaged by one allreduce, and that
    allreduce while it is in flight (overlapped mode)."""

    modules: list[nn.Module]
    params: list[nn.Parameter]
    view: torch.Tensor
    ready: int = 0
    work: Any = None


def _contiguous_view(params: list[nn.Parameter], flats: list[torch.Tensor]) -> torch.Tensor | None:
    """The span of the flat buffer that holds exactly ``params``, if they sit side by side."""
    for flat in flats:
        base, size = flat.data_ptr(), flat.element_size()
        if all(p.dtype == flat.dtype and base <= p.data_ptr() < base + flat.numel() * size for p in params):
            starts = sorted((p.data_ptr() - base) // size for p in params)
            start, stop = starts[0], max((p.data_ptr() - base) // size + p.numel() for p in params)
            if stop - start == sum(p.numel() for p in params):
                return flat[start:stop]
    return None
