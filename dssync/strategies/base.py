"""The ``Strategy`` interface and the registry of synchronization strategies.

A strategy wraps one rank's model and decides what is communicated around the local
optimizer step. The training loop calls, per iteration::

    strategy.compute(step, forward_backward)  # forward, zero_grad, backward
    strategy.before_step(step); optimizer.step(); strategy.after_step(step)

``compute`` runs the loop's forward and backward once, through ``training_module()``; a
strategy that may abandon and restart a computation (``specsync``) overrides it.

``before_step`` and ``after_step`` are the public template methods: they time the
strategy's communication (``comm_s``, one sample per iteration, seconds on this rank) and
call the ``_before_step`` / ``_after_step`` hooks that subclasses implement.
``final_model()`` is collective and returns the model the strategy hands back.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from dssync._text import read_settings
from dssync.collectives import Communicator
from dssync.planning.schedule import Schedule
from dssync.topology import Topology

__all__ = ["PeriodicConfig", "StepsElsewhere", "Strategy", "StrategyContext"]


@dataclass(frozen=True, kw_only=True)
class StrategyContext:
    """What every strategy is built with."""

    comm: Communicator
    model: nn.Module
    topology: Topology
    schedule: Schedule | None = None
    """A schedule to follow; strategies that plan their own ignore it if ``None``."""
    steps: int | None = None
    """The iterations the run will take, for strategies that act at a point of the workload."""


class Strategy(ABC):  # noqa: B024 - every hook has a no-op default
    name: ClassVar[str]
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    """Where its models may live: ``cuda`` where every tensor it communicates stays on the
    model's device (torch collectives: NCCL for CUDA tensors, gloo for CPU ones)."""
    probes: ClassVar[bool] = False
    """Whether it plans its groups around the measured network: ``dssync train`` then probes
    before training when the ranks span several hosts and no topology is given."""
    compared: ClassVar[bool] = True
    """Whether ``dssync bench compare`` runs it when no ``--strategies`` are given (the
    parameter-server protocols built on ASP run in records of their own)."""
    resumable: ClassVar[bool] = False
    """Whether ``state_dict``/``load_state_dict`` hold everything the strategy carries from one
    iteration to the next, so that ``dssync train --checkpoint`` can stop and resume it."""

    @dataclass(frozen=True, kw_only=True)
    class Config:
        """Per-strategy settings; subclasses extend it (fields of type bool, int, float or str)."""

        @classmethod
        def settings(cls) -> frozenset[str]:
            """The names of this Config's settings."""
            return frozenset(f.name for f in dataclasses.fields(cls))

        @classmethod
        def read(cls, pairs: Sequence[str], owner: str = "this strategy") -> dict[str, Any]:
            """``["key=value", ...]`` (``dssync train --set``) as settings of this Config
            (``read_settings``)."""
            return read_settings(cls, pairs, owner)

    def __init__(self, ctx: StrategyContext, config: Strategy.Config | None = None) -> None:
        self.ctx = ctx
        self.comm = ctx.comm
        self.model = ctx.model
        self.config = config if config is not None else type(self).Config()
        self.comm_s: list[float] = []
        self._pending_s = 0.0
        self._exposed_s = 0.0  # waits outside before/after_step (overlapped modes), this iteration
        self._resumed = False  # parameters come from a checkpoint: setup() keeps each rank's own

    # -- lifecycle (collective) ----------------------------------------------------------
    def setup(self) -> None:
        """Create groups and make every rank start from rank 0's parameters (unless resumed)."""
        if self._resumed:
            return
        for p in self.model.parameters():
            self.comm.broadcast_(p.data, src=0)

    # -- checkpoints (before setup(); the loop saves the model and optimizer itself) ---------
    def state_dict(self) -> dict[str, Any]:
        """What this rank's strategy carries between iterations, beyond the model and optimizer."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``; call before ``setup()``, after loading the model's parameters."""
        self._resumed = True

    def final_model(self) -> nn.Module:
        """The model this strategy hands back at the end (collective; non-destructive)."""
        return self.model

    def close(self) -> None:
        """Release what ``setup()`` started (servers, sockets); called once after training."""
        return None

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer the loop should call; strategies that step inside backward replace it."""
        return optimizer

    def training_module(self) -> nn.Module:
        """The module the loop runs forward and backward through, after ``setup()``: the model
        itself, or a wrapper that communicates in backward (``ddp``'s
        ``DistributedDataParallel``). Evaluation always uses the model handed back."""
        return self.model

    def schedule_changes(self) -> list[dict[str, Any]]:
        """``[{step, reason, schedule}]`` for strategies that follow a schedule."""
        return []

    def stats(self) -> dict[str, Any]:
        """What the strategy counted on this rank (rounds, dropped pushes, ...); ``train``
        gathers every rank's into the record's ``strategy_stats``."""
        return {}

    def global_updates(self) -> int | None:
        """Updates applied to the shared model so far, where there is one (parameter servers),
        as of this rank's last pull; ``None`` elsewhere."""
        return None

    def snapshot(self) -> nn.Module:
        """The model to evaluate in the middle of a run (collective like ``final_model``,
        which it is unless a strategy can read its model without stopping the workers)."""
        return self.final_model()

    def snapshot_is_collective(self) -> bool:
        """Whether ``snapshot()`` is called by every rank at the same iteration, so that the
        loop may also agree on stopping there (False where rank 0 reads it alone)."""
        return True

    # -- per iteration (template methods) ------------------------------------------------------
    def compute(self, step: int, forward_backward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run the iteration's forward and backward (``forward_backward`` returns the loss)."""
        return forward_backward()

    def before_step(self, step: int) -> None:
        t0 = time.perf_counter()
        communicated = self._before_step(step)
        self._pending_s = time.perf_counter() - t0 if communicated else 0.0

    def after_step(self, step: int) -> None:
        t0 = time.perf_counter()
        communicated = self._after_step(step)
        elapsed = time.perf_counter() - t0 if communicated else 0.0
        self.comm_s.append(self._pending_s + elapsed + self._exposed_s)
        self._pending_s = self._exposed_s = 0.0
        self._after_comm(step)

    def _before_step(self, step: int) -> bool:
        """Work between backward and the optimizer step; return True if it communicated."""
        return False

    def _after_step(self, step: int) -> bool:
        """Work after the optimizer step; return True if it communicated."""
        return False

    def _after_comm(self, step: int) -> None:
        """Local bookkeeping after the iteration's communication (not timed)."""
        return None


@dataclass(frozen=True, kw_only=True)
class PeriodicConfig(Strategy.Config):
    """The Config of a strategy that exchanges every ``period`` iterations (at least 1); a
    subclass sets its own default."""

    period: int = 1

    def __post_init__(self) -> None:
        if self.period < 1:
            raise ValueError(f"period must be at least 1, got {self.period}")


class StepsElsewhere(torch.optim.Optimizer):
    """Stands in for the loop's optimizer when a strategy steps elsewhere (inside backward
    hooks, or on parameter servers): ``step()`` does nothing, ``zero_grad()`` still clears."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:  # noqa: D107 - no super(): no state of its own
        self.inner = inner
        self.param_groups = inner.param_groups
        self.state = inner.state
        self.defaults = inner.defaults

    def step(self, closure: Any = None) -> None:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)
