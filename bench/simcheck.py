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
is optimistic. The machine is in the model only as ``host_throughput()`` measures it with
iperf3 (veth-bytes per second); the simulator knows nothing of TCP's ramp-up, gloo's
per-step overhead or the CPU the ranks' own work takes from the two cores, which is what
the comparison is for.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dssync.bench.overlap import train_on_cluster
from dssync.bench.simulate import Network, iteration_times, with_contention
from dssync.launch import emulate

__all__ = ["network_of", "simcheck", "markdown_table"]


def host_throughput(*, name: str = "simhost", seconds: int = 3) -> dict[str, Any]:
    """Veth-bytes per second this machine moves when every worker of the ``static`` cluster
    sends at once (``Network.host_bps``): one iperf3 flow out of every worker to the next
    (``i -> i+1``, two of them between racks), their received rates weighted by the veths
    each crosses (two inside a rack, four between racks). If every flow still reached its
    NIC's rate, the machine was not the limit and the cap is ``inf``."""
    spec = emulate.SCENARIOS["static"]
    port = 5301
    with emulate.cluster(spec["rack_sizes"], nic=spec["nic"], uplink=spec["uplink"], name=name) as c:
        n = c.world_size
        servers = [subprocess.Popen(["ip", "netns", "exec", c.worker_ns(i), "iperf3", "-s", "-1", "-p", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(n)]
        clients: list[subprocess.Popen] = []
        try:
            time.sleep(0.5)
            clients = [subprocess.Popen(["ip", "netns", "exec", c.worker_ns(i), "iperf3", "-c",
                                         c.worker_addr((i + 1) % n), "-p", str(port), "-t", str(seconds),
                                         "-O", "1", "-J"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                       for i in range(n)]
            outputs = [p.communicate(timeout=seconds + 30)[0] for p in clients]
        finally:  # a client past its timeout is stopped too, not left sending
            for p in [*clients, *servers]:
                p.kill()
                p.wait()
        rates = []
        for i, out in enumerate(outputs):
            try:
                rates.append(json.loads(out)["end"]["sum_received"]["bits_per_second"] / 8)
            except (ValueError, KeyError) as exc:
                raise emulate.EmulationError(f"iperf3 w{i} -> w{(i + 1) % n} gave no result: {out[-300:]}") from exc
        racks = [c.rack_of(i) for i in range(n)]
    crossings = [4 if racks[i] != racks[(i + 1) % n] else 2 for i in range(n)]
    nic_bps = emulate.parse_rate(spec["nic"]) / 8
    limited = min(rates) < 0.95 * nic_bps
    return {"flow_bps": rates, "host_bps": sum(r * k for r, k in zip(rates, crossings, strict=True))
            if limited else float("inf"), "nic_bps": nic_bps}


def network_of(scenario: str, *, alpha_s: float, host_bps: float = float("inf"), rate_scale: float = 1.0) -> Network:
    """The simulator's model of an emulated scenario: rates (times ``rate_scale``), racks,
    background streams."""
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be positive, got {rate_scale}")
    spec = emulate.SCENARIOS[scenario]
    uplink_bg: dict[int, int] = {}
    nic_bg: dict[int, int] = {}
    for kind, index in spec["flows"]:
        if kind == "rack":
            uplink_bg[index] = uplink_bg.get(index, 0) + emulate.FLOW_STREAMS
        else:
            nic_bg[index] = nic_bg.get(index, 0) + emulate.FLOW_STREAMS
    return Network(tuple(spec["rack_sizes"]), nic_bps=emulate.parse_rate(spec["nic"]) * rate_scale / 8,
                   uplink_bps=emulate.parse_rate(spec["uplink"]) * rate_scale / 8, alpha_s=alpha_s,
                   uplink_out_streams=uplink_bg, nic_out_streams=nic_bg, host_bps=host_bps)


def _model_bytes(model_mb: float) -> int:
    from dssync.tasks import build_task

    model = build_task("synthetic", model_mb=model_mb).model
    return sum(p.numel() * p.element_size() for p in model.parameters())


def simcheck(scenarios: Sequence[str], strategies: Sequence[str], *, model_mb: float = 4.0, steps: int = 40,
             warmup: int = 5, alpha_s: float = 50e-6, host_bps: float | None = None, rate_scale: float = 1.0,
             name: str = "simchk", timeout_s: float = 900.0,
             progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One row per (scenario, strategy): measured and predicted comm ms/iter and their ratio.

    ``host_bps`` is the machine's veth-bytes per second (``Network.host_bps``); ``None``
    measures it first with ``host_throughput()``, on its own cluster, before any strategy runs.
    ``rate_scale`` multiplies every NIC and uplink rate of the scenarios, on the emulated
    cluster and in the model alike: below 1 the links, not the two cores, bound a step (DESIGN
    section 7 asks communication benchmarks for that regime)."""
    unknown = [s for s in scenarios if s not in emulate.SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; choose from {', '.join(emulate.SCENARIOS)}")
    if steps <= warmup or warmup < 0 or model_mb <= 0:
        raise ValueError(f"need steps > warmup >= 0 and model_mb > 0, got {steps}, {warmup}, {model_mb}")
    size = _model_bytes(model_mb)
    if host_bps is None:
        host_bps = host_throughput(name=f"{name}h")["host_bps"]
    rows = []
    for scenario in scenarios:
        spec = emulate.SCENARIOS[scenario]
        net = network_of(scenario, alpha_s=alpha_s, host_bps=host_bps, rate_scale=rate_scale)
        nic, uplink = (emulate.format_rate(round(8 * bps)) for bps in (net.nic_bps, net.uplink_bps))
        with emulate.cluster(spec["rack_sizes"], nic=nic, uplink=uplink, name=name), \
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
                       "host_bps": host_bps if math.isfinite(host_bps) else None, "rate_scale": rate_scale,
                       "nic": nic, "uplink": uplink,
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
