"""``ds-sync``: divide-and-shuffle synchronization (the DS-Sync paper, section III).

Every iteration each rank takes its local optimizer step, then averages its *parameters*
with the members of its group for that iteration (``schedule.group_of(rank, step)``).
The groups of a round are disjoint, so they all run at once.

The strategy is a thin adapter over the DS-Sync engine, ``dssync.averaging.DSSyncAverager``
(the same object a DDP script uses through torch's ``PostLocalSGDOptimizer``): the engine
holds the groups over time, the group average, the local ensemble and the world average at
the end. What the strategy adds is storage: the model's parameters live in one flat buffer
per dtype (``flatten_parameters``), so the group average is one in-place allreduce with
nothing copied in or out; and ``overlap=True``, the paper's layer-wise mode
(``dssync.averaging.overlap``). docs/averaging.md describes both faces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dssync.averaging.averager import DSSyncAverager
from dssync.averaging.ensemble import ENSEMBLES
from dssync.averaging.flat import flatten_parameters
from dssync.averaging.overlap import OverlapReducer
from dssync.errors import DssyncError
from dssync.planning.planner import PLAN_KINDS
from dssync.planning.regroup import DEFAULT_MAX_PACE
from dssync.planning.schedule import Schedule
from dssync.strategies.base import StepsElsewhere, Strategy, StrategyContext

__all__ = ["DSSyncStrategy"]


class DSSyncStrategy(Strategy):
    name = "ds-sync"
    devices = ("cpu", "cuda")
    probes = True
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
        max_pace: int = DEFAULT_MAX_PACE
        """Regrouping may let racks exchange as rarely as every this many rounds when the
        cross-rack group is the job's bottleneck (``regroup.cross_rack_pace``,
        ``planner.paced``; dssync's extension). 1: every round, as in the paper."""
        plan: str = "auto"
        """Around slow links: ``auto`` plans the adjusted or the static plan, whichever mixes
        sooner (``planner.base_plan``); ``adjusted`` always the paper's adjusted plan."""
        world_every: int = 0
        """Every this many iterations the whole world averages in place of the group: a bound
        on how far the ranks drift apart, at one world allreduce's price (0: never, as in the
        paper; dssync's extension, the periodic global averaging of gossip methods)."""
        world_first: float = 0.0
        """The first this fraction of the run's iterations average over the whole world, every
        one, before the plan takes over (0: none, as in the paper; post-local SGD's warm-up,
        which torch's model averagers call ``warmup_steps``)."""
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
            if self.plan not in PLAN_KINDS:
                raise ValueError(f"plan must be one of {', '.join(PLAN_KINDS)}, got {self.plan!r}")
            if self.max_pace < 1:
                raise ValueError(f"max_pace must be 1 (racks exchange every round) or more, got {self.max_pace}")
            if self.adjust_every < 0:
                raise ValueError(f"adjust_every must be 0 (off) or positive, got {self.adjust_every}")
            if self.world_every < 0:
                raise ValueError(f"world_every must be 0 (never) or positive, got {self.world_every}")
            if not 0.0 <= self.world_first < 1.0:
                raise ValueError(f"world_first must be a fraction of the run in [0, 1), got {self.world_first}")
            if self.overlap and self.adjust_every:
                raise ValueError("overlap and adjust_every do not combine yet: regrouping times whole "
                                 "group allreduces, which overlapped mode splits by layer")

    config: Config

    def __init__(self, ctx: StrategyContext, config: Config | None = None) -> None:
        super().__init__(ctx, config)
        self._flat = flatten_parameters(self.model)
        self._views = [(p, p.data_ptr()) for p in self.model.parameters()]
        cfg = self.config
        self.averager = DSSyncAverager(
            ctx.topology, ctx.schedule, comm=self.comm, adjust_every=cfg.adjust_every, max_pace=cfg.max_pace,
            steps=ctx.steps, model=self.model, ensemble=cfg.ensemble, ema_decay=cfg.ema_decay,
            swa_start_step=math.ceil(cfg.swa_start * (ctx.steps or 0)) if cfg.ensemble == "swa" else 0,
            nbytes=sum(f.numel() * f.element_size() for f in self._flat), plan=cfg.plan,
            world_every=cfg.world_every, world_first=math.ceil(cfg.world_first * (ctx.steps or 0)), start=False)
        self.shuffle = self.averager.shuffle
        self.reducer = OverlapReducer(self.model, self._flat, self.comm, self.shuffle, bucket_mb=cfg.bucket_mb,
                                      on_wait=self._waited, landed=self.averager.ensemble.fold) if cfg.overlap else None

    @property
    def schedule(self) -> Schedule:
        """The schedule in force now (online regrouping replaces it)."""
        return self.averager.schedule

    @property
    def swa_model(self) -> nn.Module | None:
        """The local ensemble model, if one is kept."""
        return self.averager.swa_model

    def setup(self) -> None:
        # Ranks must never disagree on the schedule: the engine compares digests before any group op.
        self.averager.start(ensemble=False)
        if not self._resumed:
            for flat in self._flat:
                self.comm.broadcast_(flat, src=0)
            self.averager.ensemble.start()  # the EMA starts at the common init
        if self.reducer is not None:
            self.reducer.install()

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if self.reducer is None:
            return optimizer
        self.reducer.wrap(optimizer)
        return StepsElsewhere(optimizer)

    def _waited(self, seconds: float) -> None:
        self._exposed_s += seconds

    def flush(self) -> None:
        """Wait for every layer's allreduce and fold the result into the ensemble (overlapped mode)."""
        if self.reducer is not None:
            self.reducer.flush()

    @torch.no_grad()
    def average(self, step: int) -> bool:
        """Average parameters within this rank's group of iteration ``step``."""
        if any(p.data_ptr() != ptr for p, ptr in self._views):
            raise DssyncError(
                f"rank {self.comm.rank}: model parameters were re-bound after ds-sync flattened "
                "them (vector_to_parameters, load_state_dict(assign=True), p.data = ...); "
                "copy into them in place (p.copy_(...)) instead"
            )
        return self.averager.average(self._flat, step)

    def _after_step(self, step: int) -> bool:
        if self.reducer is not None:
            return False  # started layer by layer in backward
        return self.average(step)

    @torch.no_grad()
    def _after_comm(self, step: int) -> None:
        if self.reducer is not None:
            self.reducer.finish(step)
            return
        self.averager.after(step)

    def state_dict(self) -> dict[str, Any]:
        """The schedule's position and regrouping state, and the local ensemble model (after
        the in-flight averages of overlapped mode have landed)."""
        self.flush()
        optimizers = [] if self.reducer is None else self.reducer.param_optimizers.values()
        return {"shuffle": self.shuffle.state_dict(), "step": 0 if self.reducer is None else self.reducer.step,
                "ensemble": self.averager.ensemble.state_dict(),
                "param_optimizers": [o.state_dict() for o in optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        optimizers = [] if self.reducer is None else list(self.reducer.param_optimizers.values())
        self.averager.restore(state)
        if self.reducer is not None:
            self.reducer.step = int(state["step"])
        if len(state["param_optimizers"]) != len(optimizers):
            raise DssyncError(f"rank {self.comm.rank}: the checkpoint was written with overlap="
                              f"{bool(state['param_optimizers'])}; resume with the same setting")
        for optimizer, saved in zip(optimizers, state["param_optimizers"], strict=True):
            optimizer.load_state_dict(saved)

    def regroup(self, next_step: int) -> bool:
        """Regroup now from the window's timings (``Shuffle.regroup``; collective)."""
        return self.averager.regroup(next_step)

    @torch.no_grad()
    def final_model(self) -> nn.Module:
        """One global average of every rank's ensemble model, or of the current parameters
        before the ensemble holds any iterate (collective)."""
        self.flush()
        return self.averager.final_model()

    def schedule_changes(self) -> list[dict[str, Any]]:
        return self.averager.schedule_changes()
