"""``dssync bench compare``: time to accuracy of every strategy on one emulated network.

For each scenario (``dssync emulate``'s named layouts) one cluster is built and its background flows started;
then every strategy trains the task on every seed (``seeds``, or ``0 .. repeats - 1``), each run a real
``dssync emulate run -- dssync train`` job. Every strategy gets the racks (``--rack-sizes``),
nothing more; ds-sync finds the contention itself (``--adjust-every``). A strategy may carry
settings, ``NAME:KEY=VALUE:...`` (``dssync train --set``, or ``--OPTION=VALUE`` for the run's
own train options), so settings of one strategy compare side by side.

The headline is time to accuracy (the DS-Sync paper's measure): training wall
seconds, evaluations excluded, until the model a strategy hands back first reaches the
target, the lowest best accuracy of the ``reference`` strategy (``ddp``, torch's
DistributedDataParallel) over the seeds. The reference therefore runs first, on every seed,
for the whole ``steps``; the others then run seed by seed, interleaved so that slow drift of
the machine falls on all of them alike, each stopped at its first evaluation that reaches the
target (``steps`` is the cap; strategies whose snapshots stop no worker run to the cap and are
timed from their curve). With an explicit ``target`` every strategy runs interleaved. A
strategy's figure is the median over the seeds, a seed that never reaches the target counting
as never (``summarize``).
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dssync._text import parse_variant
from dssync.bench.jobs import train_on_cluster
from dssync.bench.tables import markdown
from dssync.errors import DssyncError
from dssync.launch import emulate
from dssync.topology import Topology
from dssync.training.loop import TrainConfig, comm_warmup, first_at_target, per_rank_comm_ms

__all__ = ["compare", "loss_rows", "loss_table", "markdown_table", "median_with_misses", "plan_rows", "plan_table", "plot",
           "seed_rows", "seed_table", "split_settings", "summarize", "time_to", "variant_config"]


def compare(scenarios: Sequence[str], strategies: Sequence[str], *, task: str = "digits", steps: int = 300,
            repeats: int = 1, seeds: Sequence[int] | None = None, eval_every: int = 10, adjust_every: int = 25,
            model_mb: float = 1.0,
            name: str = "cmp", timeout_s: float = 1800.0, cpu: dict[int, float] | None = None,
            episodes: Sequence[emulate.Episode] = (), settings: Mapping[str, Any] | None = None,
            reference: str | None = "ddp", target: float | None = None, stop: bool = True,
            rate_scale: float = 1.0, previous: Sequence[dict[str, Any]] = (),
            progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Train every strategy on every scenario; one ``train --json`` record per run, plus
    ``scenario`` and ``repeat`` (the run's seed). ``seeds`` are the seeds every strategy runs
    (default ``0 .. repeats - 1``): a tuning sweep runs on seeds that a reported comparison does
    not use. ``settings`` are ``TrainConfig`` settings of every run (``lr``, ``lr_schedule``
    ...). ``cpu`` caps workers' CPU (rank -> cores): stragglers on top of the
    scenario's network; ``episodes`` are transient stragglers, the same in every run
    (``emulate.run``). ``stop=False`` runs everything to ``steps`` (no target). ``rate_scale``
    multiplies the scenario's NIC and uplink rates (a small model on few cores needs slower
    links for communication, not the cores, to bound a step; the background flows take
    their share of whatever the links carry). ``previous``: records of an earlier, interrupted
    comparison with the same settings; a run found there (same scenario, strategy and seed,
    without an error) is taken from it instead of run again."""
    unknown = [s for s in scenarios if s not in emulate.SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; choose from {', '.join(emulate.SCENARIOS)}")
    seeds = list(range(repeats)) if seeds is None else list(seeds)
    if not seeds or steps < 1 or eval_every < 1:
        raise ValueError(f"seeds, steps and eval_every must be given and positive, got {seeds}, {steps}, {eval_every}")
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds must be distinct and non-negative, got {seeds}")
    if reference is not None and reference not in strategies:
        raise ValueError(f"the reference strategy {reference!r} is not among --strategies {', '.join(strategies)}")
    for scenario in scenarios:  # before any network is built
        workers = sum(emulate.SCENARIOS[scenario]["rack_sizes"])
        for e in episodes:
            if e.rank >= workers:
                raise ValueError(f"episode {e}: scenario {scenario!r} has workers 0..{workers - 1}")
    if not 0 < rate_scale < 1e6:
        raise ValueError(f"rate_scale must be positive, got {rate_scale}")
    if any(e.delay is not None for e in episodes):
        emulate.check_netem()
    records: list[dict[str, Any]] = []
    done = {(r.get("scenario"), r.get("strategy"), r.get("repeat")): r for r in previous if "error" not in r}
    for scenario in scenarios:
        spec = emulate.SCENARIOS[scenario]
        common = {"task": task, "steps": steps, "eval_every": eval_every, "model_mb": model_mb, **(settings or {}),
                  "topology": Topology.from_rack_sizes(spec["rack_sizes"]), "probe_first": True}
        nic, uplink = (emulate.format_rate(round(emulate.parse_rate(spec[k]) * rate_scale)) for k in ("nic", "uplink"))
        with emulate.cluster(spec["rack_sizes"], nic=nic, uplink=uplink, name=name), \
                tempfile.TemporaryDirectory() as tmp:
            emulate.contend_scenario(spec, name=name, rate_scale=rate_scale)
            if cpu:
                emulate.contend(name=name, cpu=cpu)

            def run(strategy: str, rep: int, goal: float | None, scenario: str = scenario,
                    common: dict[str, Any] = common, tmp: str = tmp) -> None:
                kept = done.get((scenario, strategy, rep))
                if kept is not None and (goal is None or kept.get("target_accuracy") in (None, goal)):
                    records.append(kept)
                    if progress is not None:
                        progress(kept)
                    return
                rec = _train(name, Path(tmp) / f"{strategies.index(strategy)}-{rep}.json", strategy, rep, goal,
                             common, adjust_every=adjust_every, timeout_s=timeout_s, episodes=episodes)
                rec.pop("provenance", None)  # the job's own (its train command); the comparison's is stamped
                rec.update({"strategy": strategy, "scenario": scenario, "repeat": rep})
                records.append(rec)
                if progress is not None:
                    progress(rec)

            goal, first = target, []
            if stop and goal is None and reference is not None:  # the reference sets the target
                first = [reference]
                for rep in seeds:
                    run(reference, rep, None)
                bests = [r["best_accuracy"] for r in records if (r["scenario"], r["strategy"]) == (scenario, reference)
                         and "error" not in r]
                if not bests:
                    raise DssyncError(f"{scenario}: every run of the reference {reference} failed; no target")
                goal = min(bests)
            for rep in seeds:
                for strategy in strategies:
                    if strategy not in first:
                        run(strategy, rep, goal if stop else None)
    return records


def _train(cluster: str, out: Path, strategy: str, rep: int, goal: float | None, common: Mapping[str, Any], *,
           adjust_every: int, timeout_s: float, episodes: Sequence[emulate.Episode]) -> dict[str, Any]:
    """One ``dssync train`` job of ``strategy`` on the cluster, seed ``rep``, stopped at ``goal``
    if given; its record, or ``{"error": ...}`` (one failed job loses neither the others nor itself)."""
    try:
        config = variant_config(strategy, common, seed=rep, target_accuracy=goal, adjust_every=adjust_every)
        return train_on_cluster(cluster, config, out, timeout_s=timeout_s, episodes=episodes)
    except DssyncError as exc:
        return {"error": str(exc)}


def variant_config(spec: str, common: Mapping[str, Any], *, adjust_every: int = 0, **run: Any) -> TrainConfig:
    """The job config of one run of the variant ``spec`` (``parse_variant``): the comparison's
    ``common`` settings, the variant's own run settings over them (``--OPTION=VALUE``, each a
    ``TrainConfig`` setting read as its type), the strategy's settings (``KEY=VALUE``, its
    ``Config``'s), ``adjust_every`` where the strategy regroups online, and ``run`` (the seed,
    the target). A bad name or value is a ``ValueError`` naming it."""
    from dssync.strategies import get_strategy, having

    base, settings = parse_variant(spec)
    sets, own = split_settings(settings)
    options = get_strategy(base).Config.read(sets, base)
    if adjust_every and base in having("adjust_every"):
        options.setdefault("adjust_every", adjust_every)
    overrides = TrainConfig.read(own, "a run")
    return TrainConfig(**{**common, **overrides, **run, "strategy": base, "strategy_options": options})


def split_settings(settings: Sequence[str]) -> tuple[list[str], list[str]]:
    """A variant's settings split into the strategy's (``KEY=VALUE``, for its ``Config``) and
    the run's own ``TrainConfig`` settings, written as ``dssync train``'s options
    (``--OPTION=VALUE``, e.g. ``--optimizer=adamw`` or ``--lr=0.001``), which override the
    comparison's common ones."""
    sets = [kv for kv in settings if not kv.startswith("--")]
    own = [kv for kv in settings if kv.startswith("--")]
    return sets, own


def time_to(curve: list[dict[str, Any]], target: float) -> tuple[float | None, int | None]:
    """Wall seconds and iteration of the first evaluation of ``curve`` that reaches ``target``,
    or ``(None, None)``."""
    point = first_at_target(curve, target)
    return (None, None) if point is None else (point["wall_s"], int(point["step"]))


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
    return markdown(
        ["scenario", "strategy", "target loss", "reached", "iters to target", "updates to target", "time to target s",
         "final loss", "aborts/run", "re-syncs/run"],
        [[r["scenario"], r["strategy"], f"{r['target_loss']:.3f}", f"{r['reached']}/{r['repeats']}",
          _fmt(r["iterations_to_loss"], ".0f"), _fmt(r["updates_to_loss"], ".0f"), _fmt(r["time_to_loss_s"], ".1f"),
          f"{r['final_loss']:.3f}", _fmt(r.get("aborts_per_run"), ".0f"), _fmt(r.get("resyncs_sent_per_run"), ".0f")]
         for r in rows])


def plan_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run of a strategy that regroups online, how still its plan held: its schedule
    changes after the initial plan (step, slow uplinks, slow NICs, pace), how many came after
    the first one (the first contention event), and every link it ever flagged that the
    scenario's background does not load (``emulate.scenario_contention``, the ground truth).
    Runs whose records carry no flags (before the record kept them) count ``None``."""
    rows = []
    for r in records:
        changes = r.get("schedule_changes") or []
        regroups = (r.get("config") or {}).get("strategy_options", {}).get("adjust_every")
        if "error" in r or not regroups or r.get("scenario") not in emulate.SCENARIOS:
            continue  # a failed run, or one whose plan never changes online
        truth_uplinks, truth_nics = emulate.scenario_contention(emulate.SCENARIOS[r["scenario"]])
        later = [c for c in changes if c.get("step", 0) > 0]
        known = all("uplinks" in c for c in changes)
        clear = None
        if known:
            clear = sorted({f"uplink {u}" for c in changes for u in c["uplinks"] if u not in truth_uplinks}
                           | {f"NIC {i}" for c in changes for i in c["nics"] if i not in truth_nics})
        rows.append({"scenario": r["scenario"], "strategy": r["strategy"], "seed": r.get("repeat"),
                     "changes": [{k: c.get(k) for k in ("step", "uplinks", "nics", "pace")} for c in later],
                     "after_first": max(0, len(later) - 1), "clear_links_flagged": clear})
    return rows


def plan_table(rows: Sequence[dict[str, Any]]) -> str:
    """``plan_rows`` as markdown: one row per run."""
    def change(c: dict[str, Any]) -> str:
        if c.get("uplinks") is None:
            return f"{c['step']}"
        return f"{c['step']}: up {c['uplinks']}, NIC {c['nics']}, pace {c['pace']}"

    return markdown(["scenario", "strategy", "seed", "schedule changes (step: flags, pace)", "after the first",
                     "clear links flagged"],
                    [[r["scenario"], r["strategy"], r["seed"], "; ".join(map(change, r["changes"])) or "none",
                      r["after_first"], "n/a" if r["clear_links_flagged"] is None
                      else ", ".join(r["clear_links_flagged"]) or "none"] for r in rows])


def rank_comm_ms(record: dict[str, Any]) -> float | None:
    """Each rank's own comm ms/iter, averaged over the ranks (the headline communication figure),
    from the record's raw samples; ``None`` for records without them."""
    by_rank = record.get("comm_ms_by_rank")
    if not by_rank:
        return None
    steps = record.get("steps_run", record["steps"])
    return per_rank_comm_ms([[x / 1e3 for x in mine] for mine in by_rank], warmup=comm_warmup(steps))


def median_with_misses(values: Sequence[float | None]) -> float | None:
    """The median of ``values`` where ``None`` is a run that never got there (infinitely late):
    ``None`` unless more than half of them got there (of 5: at least 3); of an even count, the
    mean of the two middle ones, so ``None`` unless both got there."""
    if not values:
        return None
    m = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(m) else m


def summarize(records: Sequence[dict[str, Any]], reference: str | None = "ddp") -> list[dict[str, Any]]:
    """One row per (scenario, strategy) over its seeds: time to the scenario's target as the
    median over the seeds, a seed that never reached it (or whose run failed) counting as
    never, so that it exists when more than half reached it (``median_with_misses``), and its
    ratio to the reference's; iterations to target, the same way; ``reached`` counts the seeds
    that got there of ``repeats`` (failed runs included, and named in ``failed``); wall and comm
    ms per iteration and best accuracy, medians over the runs that finished. The target is the
    one the runs were stopped at, else the reference's lowest best accuracy over its seeds
    (the DS-Sync paper's rule: the lowest of BSP's best accuracies over five runs)."""
    rows = []
    failed = [r for r in records if "error" in r]
    records = [r for r in records if "error" not in r]
    for scenario in dict.fromkeys(r["scenario"] for r in records):
        runs = [r for r in records if r["scenario"] == scenario]
        given = [r["target_accuracy"] for r in runs if r.get("target_accuracy") is not None]
        ref_bests = [r["best_accuracy"] for r in runs if r["strategy"] == reference]
        target = min(given) if given else (min(ref_bests) if ref_bests else None)
        for strategy in dict.fromkeys(r["strategy"] for r in runs):
            mine = [r for r in runs if r["strategy"] == strategy]
            lost = sum(1 for f in failed if (f["scenario"], f["strategy"]) == (scenario, strategy))
            reached = [time_to(r["curve"], target) if target is not None else (None, None) for r in mine]
            reached += [(None, None)] * lost
            rows.append({
                "scenario": scenario, "strategy": strategy, "repeats": len(reached),
                "target_accuracy": target,
                "reached": sum(t is not None for t, _ in reached),
                "time_to_target_s": median_with_misses([t for t, _ in reached]),
                "iterations_to_target": median_with_misses([i for _, i in reached]),
                "seed_times_to_target_s": {r["repeat"]: t for r, (t, _) in zip(mine, reached, strict=False)},
                "wall_ms_per_iter": statistics.median(1e3 * r["wall_s"] / r.get("steps_run", r["steps"]) for r in mine),
                "rank_comm_ms_per_iter": _median([rank_comm_ms(r) for r in mine]),
                "comm_ms_per_iter": statistics.median(r["comm_ms_per_iter"] for r in mine),
                "best_accuracy": statistics.median(r["best_accuracy"] for r in mine),
                "best_accuracy_min": min(r["best_accuracy"] for r in mine),
                "wall_s": statistics.median(r["wall_s"] for r in mine),
                "steps": mine[0]["steps"],
                "failed": lost,
            })
        ref = next((r for r in rows if r["scenario"] == scenario and r["strategy"] == reference), None)
        for row in rows:
            if row["scenario"] == scenario:
                ok = ref is not None and ref["time_to_target_s"] and row["time_to_target_s"]
                row["tta_ratio"] = ref["time_to_target_s"] / row["time_to_target_s"] if ok else None
    return rows


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept and len(kept) == len(values) else None


def markdown_table(rows: Sequence[dict[str, Any]], reference: str = "ddp") -> str:
    lines = [markdown(
        ["scenario", "strategy", "reached", "time to target s", f"{reference} ÷ this", "iters to target",
         "wall ms/iter", "per-rank comm ms/iter", "max-rank comm ms/iter", "best acc. (min)", "target"],
        [[r["scenario"], r["strategy"], f"{r['reached']}/{r['repeats']}", _fmt(r["time_to_target_s"], ".1f"),
          _fmt(r["tta_ratio"], ".2f"), _fmt(r["iterations_to_target"], ".0f"), f"{r['wall_ms_per_iter']:.1f}",
          _fmt(r.get("rank_comm_ms_per_iter"), ".1f"), f"{r['comm_ms_per_iter']:.1f}",
          f"{r['best_accuracy']:.4f} ({r['best_accuracy_min']:.4f})", _fmt(r["target_accuracy"], ".4f")]
         for r in rows])]
    failures = [f"{r['scenario']} {r['strategy']}: {r['failed']} of {r['repeats']} runs failed"
                for r in rows if r.get("failed")]
    if failures:
        lines += ["", "Left out: " + "; ".join(failures) + " (the error of each is in the JSON records)."]
    return "\n".join(lines)


def seed_rows(records: Sequence[dict[str, Any]], reference: str = "ddp") -> list[dict[str, Any]]:
    """Per (scenario, strategy): the best accuracy of every seed and its difference to the
    reference's best on the same seed (same initial model, same batches), paired seed by
    seed: the mean difference, its 95 % t-interval (``scipy.stats.ttest_1samp``; ``None``
    below 2 pairs) and how many seeds got at least the reference's own best. ``stopped``
    lists the seeds whose run ended early at a target, so that its best is where it stopped,
    not where it would have got (``bench compare --no-stop`` runs every seed to the end).
    Compare a strategy's interval with that of one that takes the reference's very steps
    (``allreduce`` beside ``ddp``): that one's spread is what floating-point summation order
    alone does to a best accuracy."""
    from scipy import stats

    runs: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in records:
        if "error" not in r:
            runs.setdefault((r["scenario"], r["strategy"]), {})[r["repeat"]] = r
    rows = []
    for (scenario, strategy), mine in runs.items():
        ref = runs.get((scenario, reference), {})
        diffs = [mine[k]["best_accuracy"] - ref[k]["best_accuracy"] for k in sorted(mine) if k in ref]
        mean = statistics.fmean(diffs) if diffs else None
        ci = None
        if len(diffs) >= 2:  # a t-interval needs a spread; equal differences have none
            ci = (mean, mean) if len(set(diffs)) == 1 else tuple(stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95))
        rows.append({"scenario": scenario, "strategy": strategy,
                     "bests": {k: mine[k]["best_accuracy"] for k in sorted(mine)},
                     "stopped": [k for k in sorted(mine) if mine[k].get("steps_run", mine[k]["steps"]) < mine[k]["steps"]],
                     "pairs": len(diffs), "mean_diff": mean, "ci95": ci,
                     "at_least_reference": sum(d >= 0 for d in diffs)})
    return rows


def seed_table(rows: Sequence[dict[str, Any]], reference: str = "ddp") -> str:
    """``seed_rows`` as markdown: differences in percentage points; † marks a run stopped at
    the target."""
    seeds = sorted({k for r in rows for k in r["bests"]})
    cells = []
    for r in rows:
        ci = "n/a" if r["ci95"] is None else f"{100 * r['ci95'][0]:+.3f} … {100 * r['ci95'][1]:+.3f}"
        mean = "n/a" if r["mean_diff"] is None else f"{100 * r['mean_diff']:+.3f}"
        cells.append([r["scenario"], r["strategy"],
                      *(_fmt(r["bests"].get(k), ".4f") + ("†" if k in r["stopped"] else "") for k in seeds),
                      mean, ci, f"{r['at_least_reference']}/{r['pairs']}"])
    return markdown(["scenario", "strategy", *(f"seed {k}" for k in seeds), f"− {reference}, mean pp",
                     "95 % interval pp", f"seeds ≥ {reference}"], cells)


def plot(records: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], out: str | Path,
         reference: str = "ddp") -> None:
    """Time to accuracy relative to the reference per strategy and scenario (bars; none where a
    strategy missed the target in some seed) and, per scenario, the first seed's accuracy against wall
    time near the target (curves, the target dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    first_seed = min((r.get("repeat", 0) for r in records), default=0)
    fig, axes = plt.subplots(1, 1 + len(scenarios), figsize=(5 * (1 + len(scenarios)), 4.5), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / max(1, len(strategies))
    colors = {s: f"C{k % 10}" for k, s in enumerate(strategies)}
    for k, strategy in enumerate(strategies):
        values = [next((r["tta_ratio"] or 0.0 for r in rows if r["scenario"] == s and r["strategy"] == strategy), 0.0)
                  for s in scenarios]
        ax.bar([i + k * width for i in range(len(scenarios))], values, width, label=strategy, color=colors[strategy])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width * (len(strategies) - 1) / 2 for i in range(len(scenarios))], scenarios)
    ax.set_ylabel(f"time to accuracy: {reference} ÷ strategy (higher is faster)")
    ax.legend(fontsize="small")
    for j, scenario in enumerate(scenarios):
        ax = axes[0][1 + j]
        target = next((r["target_accuracy"] for r in rows if r["scenario"] == scenario), None)
        for strategy in strategies:
            run = next((r for r in records if r["scenario"] == scenario and r["strategy"] == strategy
                        and r.get("repeat", 0) == first_seed and "error" not in r), None)
            if run is not None:
                ax.plot([p["wall_s"] for p in run["curve"]], [p["accuracy"] for p in run["curve"]],
                        label=strategy, color=colors[strategy])
        if target is not None:
            ax.axhline(target, color="black", linestyle="--", linewidth=0.8)
            ax.set_ylim(target - 0.01, target + 0.004)
        ax.set_title(f"{scenario} (seed {first_seed})")
        ax.set_xlabel("wall time s (evaluations excluded)")
        ax.set_ylabel("test accuracy of the handed-back model")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
