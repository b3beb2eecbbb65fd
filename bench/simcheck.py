"""``dssync bench simcheck``: the simulator's prediction against the emulated cluster.

For each scenario (DESIGN section 6) one cluster is built and its background flows started,
and every strategy runs a real ``dssync train`` job whose time goes to communication: the
``synthetic`` task at ``model_mb`` megabytes with one sample per rank per iteration, so a
step computes for about a millisecond and moves megabytes. The measured figure is the
DESIGN section 7 metric (per iteration the maximum over ranks, median over iterations).

The prediction is ``dssync simulate`` on the same racks, link rates and background streams
(``bench.simulate.Network``), for the same model bytes and iterations. ds-sync runs with
the topology the simulator assumes it has probed (racks plus the contended links), so both
follow the same schedule.

``ratio`` is prediction ÷ measurement: 1.0 is a perfect prediction, below 1 the simulator
is optimistic. The simulator knows nothing of TCP's ramp-up, gloo's per-step overhead or
the two cores the ranks share, which is what the comparison is for.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dssync.bench.overlap import train_on_cluster
from dssync.bench.simulate import Network, iteration_times, with_contention
from dssync.launch import emulate

__all__ = ["network_of", "simcheck", "markdown_table"]


def network_of(scenario: str, *, alpha_s: float) -> Network:
    """The simulator's model of an emulated scenario: rates, racks, background streams."""
    spec = emulate.SCENARIOS[scenario]
    uplink_bg: dict[int, int] = {}
    nic_bg: dict[int, int] = {}
    for kind, index in spec["flows"]:
        if kind == "rack":
            uplink_bg[index] = uplink_bg.get(index, 0) + emulate.FLOW_STREAMS
        else:
            nic_bg[index] = nic_bg.get(index, 0) + emulate.FLOW_STREAMS
    return Network(tuple(spec["rack_sizes"]), nic_bps=emulate.parse_rate(spec["nic"]) / 8,
                   uplink_bps=emulate.parse_rate(spec["uplink"]) / 8, alpha_s=alpha_s,
                   uplink_out_streams=uplink_bg, nic_out_streams=nic_bg)


def _model_bytes(model_mb: float) -> int:
    from dssync.tasks import build_task

    model = build_task("synthetic", model_mb=model_mb).model
    return sum(p.numel() * p.element_size() for p in model.parameters())


def simcheck(scenarios: Sequence[str], strategies: Sequence[str], *, model_mb: float = 4.0, steps: int = 40,
             warmup: int = 5, alpha_s: float = 50e-6, name: str = "simchk", timeout_s: float = 900.0,
             progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One row per (scenario, strategy): measured and predicted comm ms/iter and their ratio."""
    unknown = [s for s in scenarios if s not in emulate.SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; choose from {', '.join(emulate.SCENARIOS)}")
    if steps <= warmup or warmup < 0 or model_mb <= 0:
        raise ValueError(f"need steps > warmup >= 0 and model_mb > 0, got {steps}, {warmup}, {model_mb}")
    size = _model_bytes(model_mb)
    rows = []
    for scenario in scenarios:
        spec = emulate.SCENARIOS[scenario]
        net = network_of(scenario, alpha_s=alpha_s)
        with emulate.cluster(spec["rack_sizes"], nic=spec["nic"], uplink=spec["uplink"], name=name), \
                tempfile.TemporaryDirectory() as tmp:
            topo = Path(tmp) / "topology.json"
            topo.write_text(json.dumps(with_contention(net).to_dict()))
            if spec["flows"]:
                emulate.contend(name=name, flows=spec["flows"])
            for strategy in strategies:
                where = ["--topology", str(topo)] if strategy == "ds-sync" else \
                    ["--rack-sizes", ",".join(map(str, spec["rack_sizes"]))]
                rec = train_on_cluster(name, Path(tmp) / f"{strategy}.json", [
                    "--strategy", strategy, "--task", "synthetic", "--model-mb", str(model_mb),
                    "--batch-size", "1", "--steps", str(steps), "--eval-every", str(steps), *where,
                ], timeout_s=timeout_s)
                measured = statistics.median(rec["comm_ms_samples"][warmup:])
                predicted = 1e3 * float(statistics.median(iteration_times(net, strategy, size, steps)[warmup:]))
                row = {"scenario": scenario, "strategy": strategy, "model_bytes": size, "steps": steps,
                       "measured_ms": measured, "predicted_ms": predicted, "ratio": predicted / measured,
                       "comm_ms_samples": rec["comm_ms_samples"]}
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| scenario | strategy | measured ms/iter | simulated ms/iter | simulated ÷ measured |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['strategy']} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} "
                     f"| {r['ratio']:.2f} |")
    return "\n".join(lines)
