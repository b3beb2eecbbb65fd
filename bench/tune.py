"""``dssync bench tune``: each peer's setting, chosen from a recorded sweep by its own time to accuracy.

A comparison proves nothing against a peer run at a setting nobody would choose. The sweep
is an ordinary ``bench compare`` that holds several settings of each peer side by side
(``diloco:inner_steps=8:outer_lr=1.0``, ``local-sgd:period=4`` ...) beside the reference,
on seeds that the reported comparison does not use. This module reads its records and picks,
per peer, the setting with the shortest time to accuracy:

- per scenario, the setting's time to the reference's target (the median over the seeds, a
  seed that never reaches counting as never) divided by the reference's own;
- its score is the geometric mean of those ratios over the scenarios, infinite when it
  misses in any scenario (a setting must reach the target everywhere to be chosen); the
  lowest score wins;
- where no setting of a peer reaches the target in every seed and scenario (two sweep seeds
  put the reference's lowest best high), accuracy differences smaller than the reference's
  own spread between seeds are taken as ties: the peer's target is lowered to the highest
  accuracy one of its settings reaches in every run, less that spread, and among the
  settings that reach it in every run the one that gets there soonest (the same score,
  against the reference's time to the lowered target) wins;
- remaining ties go to the higher mean best accuracy.

``bench compare --tuned TUNED.json`` then runs each peer named plainly in ``--strategies`` at
its chosen setting.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from dssync._text import parse_variant
from dssync.bench.compare import median_with_misses, summarize, time_to
from dssync.bench.tables import markdown

__all__ = ["RULE", "apply_tuned", "choose", "markdown_table"]

RULE = ("per peer, the setting with the lowest geometric mean over scenarios of its median time to the "
        "reference's target (a seed that never reaches counting as never) divided by the reference's; where no "
        "setting of the peer reaches it in every run, the peer's target is the highest accuracy one of its settings "
        "reaches in every run less the reference's spread between seeds, and the same score decides among the "
        "settings that reach that; ties go to the higher mean best accuracy")


def _time(runs: Sequence[dict[str, Any]], target: float) -> float | None:
    """The median over ``runs`` of the time to ``target``, a run that never gets there (or failed)
    counting as never."""
    return median_with_misses([None if "error" in r else time_to(r["curve"], target)[0] for r in runs])


def _score(mine: dict[str, list[dict[str, Any]]], ref: dict[str, list[dict[str, Any]]],
           targets: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The geometric mean over scenarios of time to each scenario's target over the reference's
    (infinite if any is missing), and the ratios."""
    ratios = {}
    for s, target in targets.items():
        t, t_ref = _time(mine.get(s, []), target), _time(ref[s], target)
        ratios[s] = t / t_ref if t is not None and t_ref else math.inf
    return math.exp(statistics.fmean(math.log(v) for v in ratios.values())), ratios


def choose(records: Sequence[dict[str, Any]], reference: str = "ddp") -> dict[str, Any]:
    """The tuning record of a sweep: ``chosen`` (peer -> its winning spec), per peer the target
    that decided, and every candidate's per-scenario figures and scores."""
    for r in records:
        if not isinstance(r.get("scenario"), str) or not isinstance(r.get("strategy"), str) or \
                not ("error" in r or isinstance(r.get("curve"), list)):
            raise ValueError("the sweep's records must be bench compare's (each with its scenario, strategy and "
                             f"curve); found one with keys {sorted(r)[:8]}")
    rows = summarize(records, reference=reference)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    ref_rows = {r["scenario"]: r for r in rows if r["strategy"] == reference}
    missing = [s for s in scenarios if s not in ref_rows or ref_rows[s]["time_to_target_s"] is None]
    if missing:
        raise ValueError(f"the sweep has no time to target of the reference {reference} in {', '.join(missing)}")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in records:
        runs.setdefault(r["strategy"], {}).setdefault(r["scenario"], []).append(r)
    ref = runs[reference]
    targets = {s: ref_rows[s]["target_accuracy"] for s in scenarios}
    spread = max(max(x["best_accuracy"] for x in ref[s]) - min(x["best_accuracy"] for x in ref[s]) for s in scenarios)
    candidates = []
    for spec, mine in runs.items():
        if spec == reference:
            continue
        score, ratios = _score(mine, ref, targets)
        done = [r for s in scenarios for r in mine.get(s, [])]
        rows_of = {r["scenario"]: r for r in rows if r["strategy"] == spec}
        candidates.append({
            "strategy": spec, "peer": parse_variant(spec)[0], "score": score, "tta_over_reference": ratios,
            "reached": {s: f"{rows_of[s]['reached']}/{rows_of[s]['repeats']}" if s in rows_of else "0/0"
                        for s in scenarios},
            "worst_best_accuracy": min((0.0 if "error" in r else r["best_accuracy"]) for r in done) if done else 0.0,
            "everywhere": all(s in mine for s in scenarios),
            "best_accuracy": statistics.fmean(rows_of[s]["best_accuracy"] for s in rows_of) if rows_of else 0.0,
        })
    chosen: dict[str, str] = {}
    decided_by: dict[str, dict[str, Any]] = {}
    for peer in dict.fromkeys(c["peer"] for c in candidates):
        mine = [c for c in candidates if c["peer"] == peer]
        key = "score"
        if all(math.isinf(c["score"]) for c in mine):  # none reaches everywhere: ties within the spread
            lowered = max(c["worst_best_accuracy"] for c in mine if c["everywhere"]) - spread \
                if any(c["everywhere"] for c in mine) else -math.inf
            peer_targets = {s: min(lowered, targets[s]) for s in scenarios}
            for c in mine:
                c["lowered_score"] = math.inf
                if c["everywhere"] and c["worst_best_accuracy"] >= lowered:
                    c["lowered_score"], c["lowered_tta_over_reference"] = _score(runs[c["strategy"]], ref, peer_targets)
            key = "lowered_score"
            decided_by[peer] = {"target": "lowered", "target_accuracy": peer_targets, "spread": spread}
        else:
            decided_by[peer] = {"target": "reference's", "target_accuracy": targets}
        best = min(mine, key=lambda c: (c[key], -c["best_accuracy"]))
        chosen[peer] = best["strategy"]
        for c in mine:
            c["chosen"] = c is best
    for c in candidates:  # JSON has no infinity: a miss is null
        for key in ("score", "lowered_score"):
            if key in c and math.isinf(c[key]):
                c[key] = None
        for key in ("tta_over_reference", "lowered_tta_over_reference"):
            if key in c:
                c[key] = {s: None if math.isinf(v) else v for s, v in c[key].items()}
    return {"reference": reference, "rule": RULE, "scenarios": scenarios,
            "seeds": sorted({r["repeat"] for r in records if "repeat" in r}),
            "target_accuracy": targets, "reference_spread": spread,
            "chosen": chosen, "decided_by": decided_by, "candidates": candidates}


def apply_tuned(strategies: Sequence[str], chosen: dict[str, str]) -> list[str]:
    """``strategies`` with every peer named plainly (no settings) replaced by its chosen spec."""
    return [chosen.get(s, s) if s == parse_variant(s)[0] else s for s in strategies]


def markdown_table(record: dict[str, Any]) -> str:
    """The sweep as markdown: one row per candidate, the chosen ones in bold, and per peer the
    target that decided."""
    scenarios = record["scenarios"]
    ref = record["reference"]
    rows = []

    def num(value: float | None) -> float:
        return math.inf if value is None else value

    def order(c: dict[str, Any]) -> tuple[str, float, float, float]:
        return c["peer"], num(c["score"]), num(c.get("lowered_score")), -c["best_accuracy"]

    for c in sorted(record["candidates"], key=order):
        setting = c["strategy"][len(c["peer"]):].lstrip(":") or "(defaults)"
        if c.get("chosen"):
            setting = f"**{setting}**"
        cells = [f"{c['reached'][s]}, " + ("never" if c["tta_over_reference"][s] is None
                                           else f"{c['tta_over_reference'][s]:.2f}") for s in scenarios]
        score = "never" if c["score"] is None else f"{c['score']:.2f}"
        lowered = "" if "lowered_score" not in c else "never" if c["lowered_score"] is None \
            else f"{c['lowered_score']:.2f}"
        rows.append([c["peer"], setting, *cells, score, lowered, f"{c['worst_best_accuracy']:.4f}",
                     f"{c['best_accuracy']:.4f}"])
    lines = [markdown(["peer", "setting", *(f"{s}: reached, TTA ÷ {ref}" for s in scenarios), "score",
                       "score at the lowered target", "worst best acc.", "mean best acc."], rows)]
    notes = []
    for peer, how in record["decided_by"].items():
        if how["target"] == "lowered":
            at = ", ".join(f"{s} {t:.4f}" for s, t in how["target_accuracy"].items())
            notes.append(f"- {peer}: no setting reached {ref}'s target in every run; decided at {at} "
                         f"({ref}'s spread between seeds {how['spread']:.4f})")
    targets = ", ".join(f"{s} {t:.4f}" for s, t in record["target_accuracy"].items())
    return "\n".join([f"{ref}'s target (its lowest best over the sweep's seeds): {targets}.", "", *lines,
                      *([""] + notes if notes else [])])
