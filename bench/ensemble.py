"""``dssync bench ensemble``: what ds-sync's local ensemble (paper section III-A.5) does to the
model it hands back, against the plain world average of the workers' current parameters.

The ensemble only watches the training: the workers' own parameters follow the same
trajectory whatever it is (data order, initialisation and gloo's reductions are all fixed
by the seed). So for each seed, ds-sync trains once per rule (``ensemble=none`` is the plain
world average) on local ranks, and the curves compare evaluation by evaluation. Before a rule
takes in its first iterate it hands back the plain average, so its accuracy there must be
identical to ``none``'s; a difference means the runs diverged, and the comparison stops.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from dssync.errors import DssyncError
from dssync.strategies import DSSyncStrategy
from dssync.training.loop import TrainConfig, train

__all__ = ["compare_ensembles", "parse_rule", "summarize_ensembles"]


def parse_rule(spec: str) -> dict[str, Any]:
    """``none``, ``swa[:START]`` (fraction of the run) or ``ema[:DECAY]`` as ds-sync settings."""
    kind, _, value = spec.strip().partition(":")
    try:
        if kind == "none" and not value:
            return {"ensemble": "none"}
        if kind == "swa":
            return {"ensemble": "swa", **({"swa_start": float(value)} if value else {})}
        if kind == "ema":
            return {"ensemble": "ema", **({"ema_decay": float(value)} if value else {})}
    except ValueError:
        pass
    raise ValueError(f"ensemble rule {spec!r}: write none, swa[:START] (e.g. swa:0.75) or ema[:DECAY] (e.g. ema:0.98)")


def compare_ensembles(base: TrainConfig, rules: Sequence[str], seeds: Sequence[int], *, nproc: int,
                      progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One ds-sync run per (seed, rule); each record is ``train``'s plus ``rule`` and ``seed``."""
    if "none" not in [r.strip() for r in rules]:
        rules = ["none", *rules]
    settings = {r: parse_rule(r) for r in rules}
    records = []
    for seed in seeds:
        for rule in rules:
            cfg = replace(base, strategy=DSSyncStrategy.name, seed=seed,
                          strategy_options={**base.strategy_options, **settings[rule]})
            rec = train(cfg, nproc=nproc)
            rec.update(rule=rule, seed=seed)
            records.append(rec)
            if progress is not None:
                progress(rec)
        _check_same_trajectory([r for r in records if r["seed"] == seed], settings)
    return records


def _check_same_trajectory(runs: list[dict[str, Any]], settings: dict[str, dict[str, Any]]) -> None:
    plain = next(r for r in runs if r["rule"] == "none")
    for run in runs:
        opts = settings[run["rule"]]
        if opts["ensemble"] != "swa":
            continue  # an EMA takes in the first iterate at once: nothing to check against
        start = run["steps"] * opts.get("swa_start", 0.75)
        for a, b in zip(plain["curve"], run["curve"], strict=True):
            if a["step"] <= start and a["accuracy"] != b["accuracy"]:
                raise DssyncError(f"seed {run['seed']}: {run['rule']} and none differ at step {a['step']}, before "
                                  "the ensemble holds an iterate; the runs did not follow the same trajectory")


def summarize_ensembles(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rule, over every evaluation of every seed: the handed-back model's accuracy minus the
    plain world average's (percentage points), the evaluations where it was lower, the worst and
    mean difference, the difference at the end, and the final and best accuracy (medians)."""
    rows = []
    for rule in dict.fromkeys(r["rule"] for r in records):
        diffs, final_diffs, loss_diffs = [], [], []
        mine = [r for r in records if r["rule"] == rule]
        for run in mine:
            plain = next(r for r in records if r["seed"] == run["seed"] and r["rule"] == "none")
            pairs = list(zip(plain["curve"], run["curve"], strict=True))
            diffs += [100 * (b["accuracy"] - a["accuracy"]) for a, b in pairs]
            loss_diffs += [b["loss"] - a["loss"] for a, b in pairs]
            final_diffs.append(100 * (run["final_accuracy"] - plain["final_accuracy"]))
        rows.append({
            "rule": rule, "seeds": len(mine), "evaluations": len(diffs),
            "lower": sum(d < 0 for d in diffs), "higher": sum(d > 0 for d in diffs),
            "worst_pp": min(diffs), "mean_pp": statistics.fmean(diffs), "mean_loss_diff": statistics.fmean(loss_diffs),
            "final_pp": final_diffs,
            "final_accuracy": statistics.median(r["final_accuracy"] for r in mine),
            "best_accuracy": statistics.median(r["best_accuracy"] for r in mine),
        })
    return rows
