"""The local ensemble each DS-Sync rank may keep and the world averages once at the end.

``none``: the current parameters, so the model handed back is the plain world average of
the workers; ``swa``: the equal-weight average of the rank's iterates from a given iteration
on (``torch.optim.swa_utils.AveragedModel``); ``ema``: an exponential moving average of every
iterate, bias-corrected (``debiased_ema``). docs/averaging.md says which to choose and why
``none`` is the default.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from dssync.averaging.flat import world_average
from dssync.collectives import Communicator
from dssync.errors import DssyncError

__all__ = ["ENSEMBLES", "Ensemble", "debiased_ema"]

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


class Ensemble:
    """One rank's ensemble of ``model`` (``kind`` one of ``ENSEMBLES``): ``start()`` at the
    common initial parameters (the EMA takes them in), ``fold(step)`` after each iteration's
    average (the SWA from ``swa_from`` on), ``final(comm)`` the world average of the ensemble,
    or of the model's current parameters before the ensemble holds any iterate."""

    def __init__(self, model: nn.Module | None, kind: str = "none", *, swa_from: int = 0,
                 ema_decay: float = 0.98) -> None:
        if kind not in ENSEMBLES:
            raise ValueError(f"ensemble must be one of {', '.join(ENSEMBLES)}, got {kind!r}")
        if kind != "none" and model is None:
            raise ValueError(f"ensemble={kind!r} keeps a copy of the model: pass model=")
        self.kind = kind
        self.model = model
        self.swa_from = swa_from
        self.averaged: AveragedModel | None = None
        if kind == "ema":
            self.averaged = AveragedModel(model, multi_avg_fn=debiased_ema(ema_decay), use_buffers=True)
        elif kind == "swa":
            self.averaged = AveragedModel(model, use_buffers=True)

    def start(self) -> None:
        """Take the common initial parameters in (the EMA starts there; SWA waits for ``swa_from``)."""
        if self.kind == "ema":
            self.averaged.update_parameters(self.model)

    def fold(self, step: int) -> None:
        """Take the parameters after iteration ``step`` in."""
        if self.averaged is not None and step >= self.swa_from:
            self.averaged.update_parameters(self.model)

    def final(self, comm: Communicator, model: nn.Module | None = None) -> nn.Module:
        """A world-averaged copy of the ensemble, or of ``model`` (default: the ensemble's own)
        before it holds any iterate (collective; nothing is changed)."""
        if self.averaged is not None and int(self.averaged.n_averaged) > 0:
            return world_average(comm, self.averaged.module)
        return world_average(comm, model if model is not None else self.model)

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.averaged is None else self.averaged.state_dict()

    def check(self, state: dict[str, Any] | None, *, rank: int) -> None:
        """A ``DssyncError`` naming ``rank`` where ``state`` was saved with another ensemble setting."""
        if (state is None) != (self.averaged is None):
            raise DssyncError(f"rank {rank}: the checkpoint was written with another ensemble setting than "
                              f"this run's ({self.kind}); resume with the same one")

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore ``state_dict()`` (``check`` it first)."""
        if self.averaged is not None:
            self.averaged.load_state_dict(state)
