"""``dssync bench tune``: each peer's setting, chosen from a recorded sweep by its own time to accuracy.

A comparison proves nothing against a peer run at a setting nobody would choose. The sweep
is an ordinary ``bench compare`` that holds several settings of each peer side by side
(``diloco:inner_steps=8:outer_lr=1.0``, ``local-sgd:period=4`` ...) beside the reference,
on seeds that the reported comparison does not use. This module reads its records and picks,
per peer, the setting with the shortest time to the reference's target:

- per scenario, the setting's time to accuracy (``summarize``: the median over the seeds, a
  seed that never reaches counting as never) divided by the reference's;
- its score is the geometric mean of those ratios over the scenarios, infinite when it
  misses in any scenario (a setting must reach the target everywhere to be chosen);
- the lowest score wins; where none reaches everywhere, or scores tie, the higher mean best
  accuracy over the scenarios decides.

``bench compare --tuned TUNED.json`` then runs each peer named plainly in ``--strategies`` at
its chosen setting.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from dssync.bench.compare import parse_variant, summarize

__all__ = ["RULE", "apply_tuned", "choose", "markdown_table"]

RULE = ("per peer, the setting with the lowest geometric mean over scenarios of its median time to "
        "the reference's target (a seed that never reaches counting as never) divided by the "
        "reference's; a setting that misses in any scenario scores infinity; ties and all-miss "
        "peers are decided by the mean best accuracy over the scenarios")


def choose(records: Sequence[dict[str, Any]], reference: str = "ddp") -> dict[str, Any]:
    """The tuning record of a sweep: ``chosen`` (peer -> its winning spec) and every
    candidate's per-scenario figures and score."""
    for r in records:
        if not isinstance(r.get("scenario"), str) or not isinstance(r.get("strategy"), str) or \
                not ("error" in r or isinstance(r.get("curve"), list)):
            raise ValueError("the sweep's records must be bench compare's (each with its scenario, strategy and "
                             f"curve); found one with keys {sorted(r)[:8]}")
    rows = summarize(records, reference=reference)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    ref = {r["scenario"]: r for r in rows if r["strategy"] == reference}
    missing = [s for s in scenarios if s not in ref or ref[s]["time_to_target_s"] is None]
    if missing:
        raise ValueError(f"the sweep has no time to target of the reference {reference} in {', '.join(missing)}")
    candidates = []
    for spec in dict.fromkeys(r["strategy"] for r in rows):
        base = parse_variant(spec)[0]
        if spec == reference:
            continue
        mine = {r["scenario"]: r for r in rows if r["strategy"] == spec}
        ratios = {s: (mine[s]["time_to_target_s"] / ref[s]["time_to_target_s"]
                      if s in mine and mine[s]["time_to_target_s"] is not None else math.inf) for s in scenarios}
        score = math.exp(statistics.fmean(math.log(v) for v in ratios.values()))
        candidates.append({
            "strategy": spec, "peer": base, "score": score,
            "tta_over_reference": ratios,
            "time_to_target_s": {s: mine[s]["time_to_target_s"] if s in mine else None for s in scenarios},
            "reached": {s: f"{mine[s]['reached']}/{mine[s]['repeats']}" if s in mine else "0/0" for s in scenarios},
            "best_accuracy": statistics.fmean(mine[s]["best_accuracy"] for s in mine) if mine else 0.0,
        })
    chosen: dict[str, str] = {}
    for peer in dict.fromkeys(c["peer"] for c in candidates):
        mine = [c for c in candidates if c["peer"] == peer]
        best = min(mine, key=lambda c: (c["score"], -c["best_accuracy"]))
        chosen[peer] = best["strategy"]
        for c in mine:
            c["chosen"] = c is best
    for c in candidates:  # JSON has no infinity: a miss is null
        c["score"] = None if math.isinf(c["score"]) else c["score"]
        c["tta_over_reference"] = {s: None if math.isinf(v) else v for s, v in c["tta_over_reference"].items()}
    return {"reference": reference, "rule": RULE, "scenarios": scenarios,
            "seeds": sorted({r["repeat"] for r in records if "repeat" in r}),
            "target_accuracy": {s: ref[s]["target_accuracy"] for s in scenarios},
            "chosen": chosen, "candidates": candidates}


def apply_tuned(strategies: Sequence[str], chosen: dict[str, str]) -> list[str]:
    """``strategies`` with every peer named plainly (no settings) replaced by its chosen spec."""
    return [chosen.get(s, s) if s == parse_variant(s)[0] else s for s in strategies]


def markdown_table(record: dict[str, Any]) -> str:
    """The sweep as markdown: one row per candidate, the chosen ones in bold."""
    scenarios = record["scenarios"]
    lines = ["| peer | setting | " + " | ".join(f"{s}: reached, TTA ÷ {record['reference']}" for s in scenarios)
             + " | score | mean best acc. |",
             "|---|---|" + "---|" * len(scenarios) + "---|---|"]
    def order(c: dict[str, Any]) -> tuple[str, float, float]:
        return c["peer"], math.inf if c["score"] is None else c["score"], -c["best_accuracy"]

    for c in sorted(record["candidates"], key=order):
        setting = c["strategy"][len(c["peer"]):].lstrip(":") or "(defaults)"
        if c.get("chosen"):
            setting = f"**{setting}**"
        cells = [f"{c['reached'][s]}, " + ("never" if c["tta_over_reference"][s] is None
                                           else f"{c['tta_over_reference'][s]:.2f}") for s in scenarios]
        score = "never" if c["score"] is None else f"{c['score']:.2f}"
        lines.append(f"| {c['peer']} | {setting} | " + " | ".join(cells) + f" | {score} | {c['best_accuracy']:.4f} |")
    return "\n".join(lines)
