"""Sync-Switch's offline timing policy: a binary search for the switch point (the Sync-Switch paper, App. B).

The search rests on two observations of the paper: BSP is slower than ASP, and the
converged accuracy grows monotonically with the share of the workload trained with BSP.
So the earliest switch point whose accuracy is within ``beta`` of pure BSP's is found by
bisection: try the middle of ``[lower, upper]``; if its mean accuracy over ``repeats`` runs
is within ``beta`` of the target, switch earlier (``upper = s``), else later
(``lower = s``); stop after ``settings`` points. The policy is the final ``upper``.

Choices made here, where the Sync-Switch paper's search leaves them open: the running sum of accuracies is reset for every
setting (as printed, Algorithm 1 sets it once, outside the loop, which would average a
setting with all earlier ones); the returned policy is the last ``upper``, which is a
setting that met the target (or pure BSP when none did). A recurring job passes the target
it measured before and runs no BSP trials.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

__all__ = ["search_switch_point"]


def search_switch_point(run: Callable[[float, int], float], *, beta: float = 0.01, settings: int = 4,
                        repeats: int = 1, target: float | None = None,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Binary-search the switch point; ``run(s, r)`` trains once (repeat ``r``, a seed) with
    ``s`` of the workload on BSP and returns the converged accuracy. Returns the policy (``switch_at``), the target and
    every trial."""
    if beta < 0 or settings < 1 or repeats < 1:
        raise ValueError(f"need beta >= 0 and settings, repeats >= 1; got {beta}, {settings}, {repeats}")
    trials: list[dict[str, float]] = []

    def trial(s: float) -> float:
        accuracies = []
        for r in range(repeats):
            accuracies.append(run(s, r))
            trials.append({"switch_at": s, "repeat": r, "accuracy": accuracies[-1]})
            if progress is not None:
                progress(f"switch at {s:.4g}: run {r + 1}/{repeats}, accuracy {accuracies[-1]:.4f}")
        return statistics.fmean(accuracies)

    if target is None:
        target = trial(1.0)  # pure BSP: the accuracy to hold
    lower, upper = 0.0, 1.0
    for _ in range(settings):
        s = (lower + upper) / 2
        if abs(trial(s) - target) <= beta:
            upper = s
        else:
            lower = s
    return {"switch_at": upper, "target_accuracy": target, "beta": beta, "settings": settings,
            "repeats": repeats, "trials": trials}
