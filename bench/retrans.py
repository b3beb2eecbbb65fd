"""TCP's losses and timeouts under each strategy's traffic on the emulated cluster.

``python -m dssync.bench.retrans --json bench/results/retrans.json`` (root) builds the
``--scenario`` cluster (``static`` unless told) at ``--rate-scale`` of its rates, with its
background streams on, and runs ``bench simcheck``'s job (the
``synthetic`` task, 1 MB of parameters, 20 iterations) of each strategy ``--rounds`` times,
reading the kernel's TCP counters in every worker's namespace (``nstat``) before and after
each job: segments sent, segments sent again, retransmission timeouts (and the timeouts of
each rank apart). A flow that loses
its last segments waits a retransmission timeout (200 ms at least on Linux, against a
0.24 ms round trip here) before it resends them, and an operation that waits for its last
flow waits that too: how often it happens is what the simulator's rule for flows that start
together stands for (docs/simulator.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["COUNTERS", "main", "measure"]

#: The kernel's TCP counters read (``nstat`` names).
COUNTERS = ("TcpOutSegs", "TcpRetransSegs", "TcpExtTCPTimeouts")


def _counters(ns: str) -> dict[str, int]:
    """``COUNTERS`` of namespace ``ns`` (each has a kernel TCP stack of its own)."""
    total = dict.fromkeys(COUNTERS, 0)
    out = subprocess.run(["ip", "netns", "exec", ns, "nstat", "-az", *COUNTERS], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        m = re.match(r"(\w+)\s+(\d+)", line)
        if m and m[1] in total:
            total[m[1]] += int(m[2])
    return total


def measure(strategies: list[str], *, rounds: int, rate_scale: float, scenario: str = "static",
            name: str = "rtx") -> list[dict[str, Any]]:
    """Each strategy's job on the ``scenario`` cluster, ``rounds`` times in turn: its per-rank
    comm ms per iteration and what the counters rose by during it (summed over the ranks,
    and each rank's timeouts)."""
    from dssync.bench import simcheck
    from dssync.launch import emulate

    spec = emulate.SCENARIOS[scenario]
    nic, uplink = simcheck.scaled_rates(scenario, rate_scale)
    rows = []
    with emulate.cluster(spec["rack_sizes"], nic=nic, uplink=uplink, name=name) as cluster, \
            tempfile.TemporaryDirectory() as tmp:
        workers = [cluster.worker_ns(r) for r in range(cluster.world_size)]
        topo = simcheck._topology_file(Path(tmp), scenario)
        emulate.contend_scenario(spec, name=name, rate_scale=rate_scale)
        for seed in range(rounds):
            for strategy in strategies:
                before = [_counters(ns) for ns in workers]
                job = simcheck._job(name, Path(tmp), scenario, strategy, seed=seed, model_mb=1.0, steps=20,
                                    warmup=4, timeout_s=900.0, topo=topo)
                per_rank = [{k: a[k] - b[k] for k in COUNTERS} for a, b in zip([_counters(ns) for ns in workers],
                                                                                 before, strict=True)]
                rise = {k: sum(r[k] for r in per_rank) for k in COUNTERS}
                rows.append({"strategy": strategy, "seed": seed, "comm_ms": job["comm_ms"], **rise,
                             "retransmitted": rise["TcpRetransSegs"] / max(rise["TcpOutSegs"], 1),
                             "timeouts_per_iteration": rise["TcpExtTCPTimeouts"] / 20,
                             "rank_timeouts": [r["TcpExtTCPTimeouts"] for r in per_rank],
                             "background_ended": emulate.dead_flows(name)})
                print(f"{strategy:>12} seed {seed}: comm {job['comm_ms']:6.0f} ms/iter, "
                      f"{rise['TcpRetransSegs']:6d} of {rise['TcpOutSegs']:7d} segments sent again "
                      f"({100 * rows[-1]['retransmitted']:4.1f} %), {rise['TcpExtTCPTimeouts']:4d} timeouts "
                      f"({rows[-1]['timeouts_per_iteration']:.1f} an iteration; by rank "
                      f"{rows[-1]['rank_timeouts']})", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dssync.bench.retrans", description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="allreduce,ds-sync,gossip,asp,psp",
                   help="comma-separated (psp at its defaults is BSP on the servers, sync-switch's first phase)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rate-scale", type=float, default=0.05)
    p.add_argument("--scenario", default="static", help="an emulated scenario (dssync emulate scenarios)")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    rows = measure([s for s in args.strategies.split(",") if s], rounds=args.rounds, rate_scale=args.rate_scale,
                   scenario=args.scenario)
    if args.json:
        from dssync.bench.provenance import write_module_record

        write_module_record(args.json, {"rate_scale": args.rate_scale, "scenario": args.scenario, "rows": rows},
                            "dssync.bench.retrans", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
