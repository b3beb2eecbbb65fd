"""``dssync bench predict``: time to accuracy at cluster scale, predicted from what was measured.

Two measured inputs, one model:

- ``dssync bench simcheck``'s record gives the simulator's calibration (per-message cost,
  per-flow efficiency, and against background streams their weight, the head a flow moves
  alone and the standing queue), fitted to the emulated cluster;
- ``dssync bench compare``'s record gives each strategy's iterations to the target accuracy
  against ddp's, on the same seeds (issue 8's convergence measurements, 8 workers);
- ``dssync simulate``'s model (``bench.simulate``) gives wall ms/iteration of each strategy on
  ``racks x workers_per_rack`` workers, with background streams on a fraction of the uplinks.

The predicted time to accuracy of a strategy is its iterations-to-target factor times its
wall time per iteration; the figure reported is ddp's over the strategy's (above 1: sooner
than ddp), as in ``dssync bench compare``. The factor is measured at 8 workers and carried
to every scale unchanged: what the prediction extrapolates is the network, not convergence.
A strategy is simulated at the settings it was trained at that shape its communication
(``dssync.patterns.communication_spec``).

The band around each prediction is the model's own validation: over the validation
scenarios of ``bench simcheck`` records (``validation_spread``), the simulated ÷ measured
wall time of the strategy and of ddp ranged over ``[lo, hi]``; were the model as far off at
scale, the measured figure would lie between the prediction times ``lo_s / hi_ddp`` and
``hi_s / lo_ddp``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from dssync._text import parse_variant
from dssync.bench.simulate import Network, simulate
from dssync.bench.tables import markdown
from dssync.patterns import communication_spec

__all__ = ["contended_racks", "iterations_factors", "plot", "predict_tta", "markdown_table", "validation_spread"]

#: Scenarios whose measurements do not hold still, which validate nothing (docs/simulator.md).
NOT_STATIONARY = ("inter-rack+nic",)

#: Background TCP streams on a contended uplink, as on the emulated cluster.
STREAMS = 8


def iterations_factors(records: Sequence[dict[str, Any]], *, reference: str = "ddp") -> dict[str, dict[str, Any]]:
    """Per strategy: the median iterations to the target over its runs, a run that never
    reached it counting as infinitely many, ÷ the reference's; ``None`` where most runs
    never reached it; and how many runs reached it. The target of a scenario is the
    reference's lowest best accuracy over its seeds (``dssync bench compare``'s rule), so
    every reference run reaches it."""
    from dssync.training.loop import first_at_target  # the training loop's rule; it imports torch

    targets: dict[str, float] = {}
    for r in records:
        if r["strategy"] == reference:
            targets[r["scenario"]] = min(targets.get(r["scenario"], math.inf), r["best_accuracy"])
    if not targets:
        raise ValueError(f"the compare record has no {reference} runs to take the target from")
    iters: dict[str, list[int | None]] = {}
    for r in records:
        hit = first_at_target(r["curve"], targets[r["scenario"]])
        iters.setdefault(r["strategy"], []).append(None if hit is None else hit["step"])
    def median(runs: list[int | None]) -> float | None:
        m = statistics.median(math.inf if i is None else i for i in runs)
        return None if math.isinf(m) else m
    ref = median(iters[reference])
    out = {}
    for strategy, runs in iters.items():
        m = median(runs)
        out[strategy] = {"reached": sum(i is not None for i in runs), "runs": len(runs), "iterations": m,
                         "factor": None if m is None else m / ref}
    return out


def validation_spread(records: Sequence[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per strategy (its name, without settings): the least and greatest simulated ÷ measured
    wall time over every job of the ``bench simcheck`` records on a scenario that holds still."""
    from dssync.bench.simcheck import predict

    out: dict[str, tuple[float, float]] = {}
    for record in records:
        for row in predict(record):
            if row["scenario"] in NOT_STATIONARY:
                continue
            lo, hi = out.get(row["strategy"], (math.inf, -math.inf))
            out[row["strategy"]] = (min(lo, row["wall_ratio"]), max(hi, row["wall_ratio"]))
    return out


def contended_racks(racks: int, fraction: float) -> list[int]:
    """``round(fraction * racks)`` racks, spread evenly, whose uplinks carry background streams."""
    k = round(fraction * racks)
    return sorted({int(i * racks / k) for i in range(k)}) if k else []


def predict_tta(*, racks: Sequence[int], workers_per_rack: int, fractions: Sequence[float],
                strategies: Sequence[str], calibration: dict[str, Any], factors: dict[str, dict[str, Any]],
                size_bytes: float, compute_ms: float, nic_bps: float, uplink_bps: float, iterations: int = 200,
                spread: dict[str, tuple[float, float]] | None = None,
                progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One row per (racks, contended fraction, strategy); ``strategies`` as the compare
    record names them (with settings), ``"ddp"`` among them; ``spread``: the validation's
    ratios per strategy name (``validation_spread``), for the band."""
    specs = {s: communication_spec(s) for s in strategies}
    spread = spread or {}
    rows = []
    for fraction in fractions:
        for r in racks:
            net = Network(tuple([workers_per_rack] * r), nic_bps=nic_bps, uplink_bps=uplink_bps, **calibration,
                          uplink_out_streams={k: STREAMS for k in contended_racks(r, fraction)})
            sim = simulate(net, list(dict.fromkeys(specs.values())), size_bytes=size_bytes, iterations=iterations,
                           compute_ms=compute_ms)
            ref = sim["ddp"]["wall_ms"] * factors["ddp"]["factor"]
            for s in strategies:
                f = factors.get(s, {}).get("factor")
                wall = sim[specs[s]]["wall_ms"]
                tta = None if f is None else ref / (wall * f)
                mine, ddp = spread.get(parse_variant(s)[0]), spread.get("ddp")
                band = None if tta is None or mine is None or ddp is None else \
                    [tta * mine[0] / ddp[1], tta * mine[1] / ddp[0]] if s != "ddp" else [1.0, 1.0]
                row = {"workers": r * workers_per_rack, "racks": r, "contended_fraction": fraction, "strategy": s,
                       "simulated_as": specs[s], "wall_ms": wall, "per_rank_comm_ms": sim[specs[s]]["per_rank_ms"],
                       "iterations_factor": f, "reached": f"{factors.get(s, {}).get('reached', 0)}/"
                       f"{factors.get(s, {}).get('runs', 0)}", "tta_ratio": tta, "tta_band": band}
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    def factor(r: dict[str, Any]) -> str:
        return "most runs never reached it" if r["iterations_factor"] is None else f"{r['iterations_factor']:.2f}"

    def band(r: dict[str, Any]) -> str:
        return "n/a" if r.get("tta_band") is None else f"{r['tta_band'][0]:.2f}–{r['tta_band'][1]:.2f}"

    return markdown(
        ["workers", "contended uplinks", "strategy", "wall ms/iter", "per-rank comm ms/iter",
         "iterations ÷ ddp's (runs reached)", "predicted ddp TTA ÷ this", "within the validation's spread"],
        [[r["workers"], f"{100 * r['contended_fraction']:.0f}%", r["strategy"], f"{r['wall_ms']:.1f}",
          f"{r['per_rank_comm_ms']:.1f}", f"{factor(r)} ({r['reached']})",
          "n/a" if r["tta_ratio"] is None else f"{r['tta_ratio']:.2f}", band(r)] for r in rows])


def plot(rows: Sequence[dict[str, Any]], path: str) -> None:
    """Predicted ddp TTA ÷ each strategy's against the number of workers, one panel per
    contended fraction, each line with the validation's spread as a shaded band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = list(dict.fromkeys(r["contended_fraction"] for r in rows))
    fig, axes = plt.subplots(1, len(fractions), figsize=(5.5 * len(fractions), 4.2), sharey=True, squeeze=False)
    for ax, fraction in zip(axes[0], fractions, strict=True):
        mine = [r for r in rows if r["contended_fraction"] == fraction and r["tta_ratio"] is not None]
        for s in dict.fromkeys(r["strategy"] for r in mine):
            pts = sorted((r["workers"], r["tta_ratio"], r.get("tta_band")) for r in mine if r["strategy"] == s)
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
            banded = [p for p in pts if p[2] is not None]
            if banded and s != "ddp":
                ax.fill_between([p[0] for p in banded], [p[2][0] for p in banded], [p[2][1] for p in banded],
                                color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("workers")
        ax.set_title(f"{100 * fraction:.0f}% of uplinks with {STREAMS} background streams")
    axes[0][0].set_ylabel("predicted time to accuracy: ddp ÷ strategy")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
