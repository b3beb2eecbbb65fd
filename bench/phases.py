"""sync-switch's phases, measured and simulated: its BSP iterations and its ASP ones.

A ``dssync bench simcheck`` record's mean per iteration hides which phase a model gets wrong.
``python -m dssync.bench.phases --record R`` splits each sync-switch job's per-rank
communication (ms per iteration, averaged over the ranks and the seeds) into the BSP
iterations after the warm-up and the ASP iterations after the switch, beside the same split
of the iteration model (``bench.simulate``) and the flow model (``bench.flows``), each at the
record's calibration.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main", "phases"]


def _split(per_iteration: np.ndarray, warmup: int, switch: int) -> list[float]:
    return [float(per_iteration[warmup:switch].mean()), float(per_iteration[switch:].mean())]


def phases(record: dict[str, Any], *, queue_s: float, rtt_s: float) -> list[dict[str, Any]]:
    """Per scenario: ``[BSP, ASP]`` ms per iteration, measured and in both models."""
    from dssync.bench import flows, simcheck
    from dssync.bench.simulate import network_of, rank_times
    from dssync.patterns import pattern, read_spec

    steps, warmup, size, scale = record["steps"], record["warmup"], record["model_bytes"], record["rate_scale"]
    cal, fitted = flows.fit_record(record, queue_s=queue_s)
    weight = fitted["background_weight"]
    compute_s = {r["strategy"]: r["compute_ms"] / 1e3 for r in record["cpu"]}["sync-switch"]
    out = []
    for scenario in dict.fromkeys(j["scenario"] for j in record["jobs"] if j["strategy"] == "sync-switch"):
        jobs = [j for j in record["jobs"] if j["scenario"] == scenario and j["strategy"] == "sync-switch"]
        switch = round(read_spec("sync-switch")[1]["switch_at"] * steps)
        measured = np.mean([np.asarray(j["comm_ms_by_rank"]).mean(axis=0) for j in jobs], axis=0)
        net = network_of(scenario, rate_scale=scale, **simcheck._fitted(cal))
        iteration = 1e3 * rank_times(net, "sync-switch", size, steps).mean(axis=1)
        net = flows.scenario_network(scenario, scale, cal, weight, queue_s=queue_s, rtt_s=rtt_s)
        pat = pattern("sync-switch", [list(r) for r in net.topology().racks()], size, steps=steps)
        flow = 1e3 * flows.rank_times(net, pat, steps, compute_s=compute_s).mean(axis=1)
        out.append({"scenario": scenario, "seeds": len(jobs), "measured": _split(measured, warmup, switch),
                    "iteration_model": _split(iteration, warmup, switch), "flow_model": _split(flow, warmup, switch)})
    return out


def main(argv: list[str] | None = None) -> int:
    from dssync.bench.flows import measured_queue

    p = argparse.ArgumentParser(prog="python -m dssync.bench.phases", description=__doc__.splitlines()[0])
    p.add_argument("--record", required=True, help="a dssync bench simcheck record with sync-switch jobs")
    p.add_argument("--queue-rtt", default="bench/results/queue-rtt.json", help="for the flow model")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    record = json.loads(Path(args.record).read_text())
    queue_s, rtt_s = measured_queue(args.queue_rtt, record["rate_scale"])
    rows = phases(record, queue_s=queue_s, rtt_s=rtt_s)
    print(f"{'per-rank comm ms/iter':>22} {'BSP':>23} {'ASP':>23}")
    print(f"{'':>22}" + "".join(f"{'measured':>10}{'iter.':>7}{'flows':>7}" for _ in range(2)))
    for r in rows:
        cells = "".join(f"{m:10.0f}{i:7.0f}{f:7.0f}" for m, i, f in
                        zip(r["measured"], r["iteration_model"], r["flow_model"], strict=True))
        print(f"{r['scenario']:>22}{cells}")
    if args.json:
        from dssync.bench.provenance import write_module_record

        write_module_record(args.json, {"record": args.record, "queue_rtt": args.queue_rtt, "rows": rows},
                            "dssync.bench.phases", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
