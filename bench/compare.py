"""``dssync bench compare``: every strategy on the same task, on the same emulated network.

For each scenario (DESIGN section 6) one cluster is built and its background flows started;
then every strategy trains the task ``repeats`` times (seeds 0, 1, ...), strategies
interleaved within a repeat so that slow drift of the machine falls on all of them alike,
each run a real ``dssync emulate run -- dssync train`` job. Every strategy gets the racks
(``--rack-sizes``), nothing more; ds-sync finds the contention itself (``--adjust-every``).
A strategy may carry settings, ``NAME:KEY=VALUE:...`` (``dssync train --set``), so
settings of one strategy compare side by side.

Per strategy and scenario the summary holds the medians over repeats of communication
ms/iter (DESIGN section 7) and wall time, the best accuracy, and the time and iterations to
the target accuracy: the lowest best accuracy allreduce reached over its repeats (paper
section V-A.2). A strategy that never reaches it has ``None``.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dssync.bench.overlap import train_on_cluster
from dssync.errors import DssyncError
from dssync.launch import emulate
from dssync.train import comm_warmup

__all__ = ["compare", "loss_rows", "loss_table", "markdown_table", "parse_variant", "plot", "summarize"]


def compare(scenarios: Sequence[str], strategies: Sequence[str], *, task: str = "digits", steps: int = 300,
            repeats: int = 1, eval_every: int = 10, adjust_every: int = 25, model_mb: float = 1.0,
            name: str = "cmp", timeout_s: float = 1800.0, cpu: dict[int, float] | None = None,
            episodes: Sequence[emulate.Episode] = (), lr: float | None = None,
            progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Train every strategy on every scenario; one ``train --json`` record per run, plus
    ``scenario`` and ``repeat``. ``cpu`` caps workers' CPU (rank -> cores): stragglers on
    top of the scenario's network; ``episodes`` are transient stragglers, the same in every
    run (``emulate.run``)."""
    unknown = [s for s in scenarios if s not in emulate.SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; choose from {', '.join(emulate.SCENARIOS)}")
    if repeats < 1 or steps < 1 or eval_every < 1:
        raise ValueError(f"repeats, steps and eval_every must be positive, got {repeats}, {steps}, {eval_every}")
    for scenario in scenarios:  # before any network is built
        workers = sum(emulate.SCENARIOS[scenario]["rack_sizes"])
        for e in episodes:
            if e.rank >= workers:
                raise ValueError(f"episode {e}: scenario {scenario!r} has workers 0..{workers - 1}")
    if any(e.delay is not None for e in episodes):
        emulate.check_netem()
    records = []
    for scenario in scenarios:
        spec = emulate.SCENARIOS[scenario]
        sizes = ",".join(map(str, spec["rack_sizes"]))
        with emulate.cluster(spec["rack_sizes"], nic=spec["nic"], uplink=spec["uplink"], name=name), \
                tempfile.TemporaryDirectory() as tmp:
            if spec["flows"] or cpu:
                emulate.contend(name=name, flows=spec["flows"], cpu=cpu)
            for rep in range(repeats):
                for k, strategy in enumerate(strategies):
                    base, settings = parse_variant(strategy)
                    args = ["--strategy", base, "--task", task, "--steps", str(steps), "--seed", str(rep),
                            "--eval-every", str(eval_every), "--rack-sizes", sizes, "--model-mb", str(model_mb)]
                    args += [a for kv in settings for a in ("--set", kv)]
                    if lr is not None:
                        args += ["--lr", str(lr)]
                    if base == "ds-sync" and adjust_every:
                        args += ["--adjust-every", str(adjust_every)]
                    try:
                        rec = train_on_cluster(name, Path(tmp) / f"{k}-{rep}.json", args, timeout_s=timeout_s,
                                               episodes=episodes)
                    except DssyncError as exc:  # one failed job loses neither the others nor itself
                        rec = {"error": str(exc)}
                    rec.update({"strategy": strategy, "scenario": scenario, "repeat": rep})
                    records.append(rec)
                    if progress is not None:
                        progress(rec)
    return records


def parse_variant(spec: str) -> tuple[str, list[str]]:
    """``"psp:push_quorum=3:pull_fraction=0.75"`` -> ``("psp", ["push_quorum=3", "pull_fraction=0.75"])``:
    a strategy and ``dssync train --set`` settings, so one comparison can hold several
    settings of one strategy side by side (its records keep the whole spec as ``strategy``)."""
    name, *settings = [part.strip() for part in spec.split(":")]
    return name, [kv for kv in settings if kv]


def _time_to(curve: list[dict[str, float]], target: float) -> tuple[float | None, int | None]:
    for point in curve:
        if point["accuracy"] >= target - 1e-12:
            return point["wall_s"], int(point["step"])
    return None, None


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _first_below(curve: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation whose test loss is at most ``target``."""
    return next((p for p in curve if p.get("loss") is not None and p["loss"] <= target), None)


def loss_rows(records: Sequence[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    """Per (scenario, strategy): the medians over repeats of the iterations (rank 0's steps, and
    the shared model's updates where there are parameter servers), wall seconds and seconds to
    the first evaluation with test loss at most ``target`` (``None`` unless every repeat got
    there), with the strategy's counters summed over ranks (aborts, re-syncs ...)."""
    rows = []
    records = [r for r in records if "error" not in r]
    for scenario, strategy in dict.fromkeys((r["scenario"], r["strategy"]) for r in records):
        mine = [r for r in records if (r["scenario"], r["strategy"]) == (scenario, strategy)]
        hits = [_first_below(r["curve"], target) for r in mine]
        reached = all(h is not None for h in hits)
        updates = [h.get("updates") for h in hits if h is not None]
        counters: dict[str, float] = {}
        for r in mine:
            for stats in r.get("strategy_stats", []):
                for key in ("aborts", "resyncs_sent", "notifies"):
                    if isinstance(stats.get(key), int):
                        counters[key] = counters.get(key, 0) + stats[key] / len(mine)
        rows.append({
            "scenario": scenario, "strategy": strategy, "repeats": len(mine), "target_loss": target,
            "final_loss": statistics.median(r["curve"][-1]["loss"] for r in mine),
            "iterations_to_loss": statistics.median(h["step"] for h in hits) if reached else None,
            "updates_to_loss": statistics.median(updates) if reached and None not in updates else None,
            "time_to_loss_s": statistics.median(h["wall_s"] for h in hits) if reached else None,
            "reached": sum(h is not None for h in hits),
            **{f"{k}_per_run": v for k, v in counters.items()},
        })
    return rows


def loss_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| scenario | strategy | target loss | reached | iters to target | updates to target | "
             "time to target s | final loss | aborts/run | re-syncs/run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['strategy']} | {r['target_loss']:.3f} | {r['reached']}/{r['repeats']} | "
                     f"{_fmt(r['iterations_to_loss'], '.0f')} | {_fmt(r['updates_to_loss'], '.0f')} | "
                     f"{_fmt(r['time_to_loss_s'], '.1f')} | {r['final_loss']:.3f} | "
                     f"{_fmt(r.get('aborts_per_run'), '.0f')} | {_fmt(r.get('resyncs_sent_per_run'), '.0f')} |")
    return "\n".join(lines)


def rank_comm_ms(record: dict[str, Any]) -> float | None:
    """Each rank's own comm ms/iter (its mean after the warm-up), averaged over the ranks.

    DESIGN section 7's figure takes, per iteration, the slowest rank. When groups run out of
    step (ds-sync, gossip), a rank waiting in iteration ``t`` for a group-mate still busy
    with ``t - 1`` is that maximum, and the maxima add up to more than the run's wall time;
    this figure is what a rank actually spends in communication, comparable with wall time
    per iteration. ``None`` for records without per-rank samples."""
    by_rank = record.get("comm_ms_by_rank")
    if not by_rank:
        return None
    warmup = comm_warmup(record["steps"])
    return statistics.fmean(statistics.fmean(mine[warmup:] or mine) for mine in by_rank)


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (scenario, strategy): medians over the repeats that finished (runs that
    failed are counted in ``failed``) and time to allreduce's target."""
    rows = []
    failed = [r for r in records if "error" in r]
    records = [r for r in records if "error" not in r]
    for scenario in dict.fromkeys(r["scenario"] for r in records):
        runs = [r for r in records if r["scenario"] == scenario]
        baseline = [r["best_accuracy"] for r in runs if r["strategy"] == "allreduce"]
        target = min(baseline) if baseline else None
        for strategy in dict.fromkeys(r["strategy"] for r in runs):
            mine = [r for r in runs if r["strategy"] == strategy]
            reached = [_time_to(r["curve"], target) for r in mine] if target is not None else []
            per_rank = [rank_comm_ms(r) for r in mine]
            times = [t for t, _ in reached if t is not None]
            iters = [i for _, i in reached if i is not None]
            rows.append({
                "scenario": scenario, "strategy": strategy, "repeats": len(mine),
                "comm_ms_per_iter": statistics.median(r["comm_ms_per_iter"] for r in mine),
                "rank_comm_ms_per_iter": statistics.median(per_rank) if None not in per_rank else None,
                "wall_s": statistics.median(r["wall_s"] for r in mine),
                "best_accuracy": statistics.median(r["best_accuracy"] for r in mine),
                "target_accuracy": target,
                "time_to_target_s": statistics.median(times) if len(times) == len(mine) and times else None,
                "iterations_to_target": statistics.median(iters) if len(iters) == len(mine) and iters else None,
                "steps": mine[0]["steps"],
                "failed": sum(1 for f in failed if (f["scenario"], f["strategy"]) == (scenario, strategy)),
            })
        ar = next((r for r in rows if r["scenario"] == scenario and r["strategy"] == "allreduce"), None)
        for row in rows:
            if row["scenario"] == scenario:
                row["allreduce_over_this_comm"] = (ar["comm_ms_per_iter"] / row["comm_ms_per_iter"]
                                                   if ar and row["comm_ms_per_iter"] > 0 else None)
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| scenario | strategy | comm ms/iter | allreduce ÷ this | per-rank comm ms/iter | wall s | "
             "best acc. | target | time to target s | iters to target |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['strategy']} | {r['comm_ms_per_iter']:.1f} | "
                     f"{_fmt(r['allreduce_over_this_comm'], '.2f')} | {_fmt(r.get('rank_comm_ms_per_iter'), '.1f')} | "
                     f"{r['wall_s']:.1f} | "
                     f"{r['best_accuracy']:.4f} | {_fmt(r['target_accuracy'], '.4f')} | "
                     f"{_fmt(r['time_to_target_s'], '.1f')} | {_fmt(r['iterations_to_target'], '.0f')} |")
    failures = [f"{r['scenario']} {r['strategy']}: {r['failed']} of {r['repeats'] + r['failed']} runs failed"
                for r in rows if r.get("failed")]
    if failures:
        lines += ["", "Left out: " + "; ".join(failures) + " (the error of each is in the JSON records)."]
    return "\n".join(lines)


def plot(records: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], out: str | Path) -> None:
    """Comm ms/iter per strategy per scenario (bars) and accuracy against wall time (curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, axes = plt.subplots(1, 1 + len(scenarios), figsize=(5 * (1 + len(scenarios)), 4), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / max(1, len(strategies))
    for k, strategy in enumerate(strategies):
        values = [next((r["comm_ms_per_iter"] for r in rows if r["scenario"] == s and r["strategy"] == strategy), 0)
                  for s in scenarios]
        ax.bar([i + k * width for i in range(len(scenarios))], values, width, label=strategy)
    ax.set_xticks([i + width * (len(strategies) - 1) / 2 for i in range(len(scenarios))], scenarios)
    ax.set_ylabel("communication ms / iteration")
    ax.legend(fontsize="small")
    for j, scenario in enumerate(scenarios):
        ax = axes[0][1 + j]
        for strategy in strategies:
            run = next((r for r in records if r["scenario"] == scenario and r["strategy"] == strategy
                        and "error" not in r), None)
            if run is not None:
                ax.plot([p["wall_s"] for p in run["curve"]], [p["accuracy"] for p in run["curve"]], label=strategy)
        ax.set_title(scenario)
        ax.set_xlabel("wall time s (evaluation excluded)")
        ax.set_ylabel("test accuracy")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
