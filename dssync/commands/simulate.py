"""``dssync simulate``: communication time per iteration of each strategy at any scale."""

from __future__ import annotations

import argparse
import dataclasses
import time

from dssync._jsonfile import write_json
from dssync.bench.provenance import stamp
from dssync.commands._common import (
    non_negative_float,
    parse_rack_sizes,
    positive_float,
    positive_int,
    rack_sizes_from_args,
    unit_interval,
)
from dssync.launch.emulate import SCENARIOS
from dssync.patterns import MODELLED, read_spec

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate each strategy's communication on a topology",
                       description="Iteration-level simulation (alpha-beta, links shared by TCP stream) "
                       "of each strategy's communication on racks with contention, and the paper's "
                       "Table II closed forms.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--racks", type=positive_int, help="with --workers-per-rack")
    g.add_argument("--rack-sizes", type=parse_rack_sizes, metavar="A,B,...")
    p.add_argument("--workers-per-rack", type=positive_int, default=None)
    p.add_argument("--scenario", default="static", choices=sorted(SCENARIOS),
                   help="the contention of an emulated scenario (`dssync emulate up --scenario`) on these racks "
                   "and rates: its background flows (8 TCP streams each) and its rate-limited NICs and uplinks "
                   "(at their ratio to the scenario's rates), at the ranks and racks it names")
    p.add_argument("--contended-uplinks", type=unit_interval, default=0.0, metavar="F",
                   help="besides --scenario: this fraction of the racks (spread evenly) has 8 background TCP "
                   "streams out of its uplink")
    p.add_argument("--strategies", default=",".join(MODELLED), metavar="A,B,...",
                   help="strategies, each at its defaults or with the settings that shape its communication "
                   "(e.g. ds-sync:world_first=0.25, torch-hier:rack_period=2:world_period=8)")
    p.add_argument("--nic", default="1gbit")
    p.add_argument("--uplink", default="1gbit")
    p.add_argument("--alpha-us", type=non_negative_float, default=50.0, help="seconds per hop, in microseconds")
    p.add_argument("--efficiency", type=positive_float, default=1.0,
                   help="the fraction of a link's rate one flow moves (`dssync bench simcheck` fits it)")
    p.add_argument("--compute-ms", type=non_negative_float, default=0.0,
                   help="compute per iteration, for the wall-time column")
    p.add_argument("--size-mb", type=positive_float, default=1.0, help="model size exchanged per iteration")
    p.add_argument("--iterations", type=positive_int, default=1000)
    p.add_argument("--json", metavar="OUT")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dssync.bench.predict import STREAMS, contended_racks
    from dssync.bench.simulate import network_of, simulate
    from dssync.launch.emulate import parse_rate

    sizes = rack_sizes_from_args(args)
    if args.iterations < 1 or args.size_mb <= 0 or args.alpha_us < 0:
        raise ValueError("--iterations and --size-mb must be positive, --alpha-us 0 or more")
    net = network_of(args.scenario, rack_sizes=sizes, nic_bps=parse_rate(args.nic) / 8,
                     uplink_bps=parse_rate(args.uplink) / 8, alpha_s=args.alpha_us * 1e-6, efficiency=args.efficiency)
    uplink_bg = dict(net.uplink_out_streams)
    for r in contended_racks(len(sizes), args.contended_uplinks):
        uplink_bg[r] = uplink_bg.get(r, 0) + STREAMS
    net = dataclasses.replace(net, uplink_out_streams=uplink_bg)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise ValueError(f"--strategies names none; choose from {', '.join(MODELLED)}")
    for spec in strategies:
        read_spec(spec)  # a bad name or setting stops here, before any simulation
    t0 = time.perf_counter()
    result = simulate(net, strategies, size_bytes=args.size_mb * 1e6, iterations=args.iterations,
                      compute_ms=args.compute_ms)
    elapsed = time.perf_counter() - t0
    table = Table(title=f"simulated: {len(sizes)} racks, {sum(sizes)} workers, {args.scenario}"
                  f"{f' + {args.contended_uplinks:.0%} of uplinks contended' if args.contended_uplinks else ''}, NIC {args.nic}, "
                  f"uplink {args.uplink}, alpha {args.alpha_us:g} us, {args.size_mb:g} MB, "
                  f"{args.iterations} iterations ({elapsed:.1f} s)")
    for col in ("strategy", "median comm ms/iter", "mean comm ms/iter", "per-rank comm ms/iter",
                "wall ms/iter", "allreduce ÷ this (wall)"):
        table.add_column(col, justify="right")
    ar = result.get("allreduce", {}).get("wall_ms")
    for s, r in result.items():
        table.add_row(s, f"{r['median_ms']:.2f}", f"{r['mean_ms']:.2f}", f"{r['per_rank_ms']:.2f}",
                      f"{r['wall_ms']:.2f}", f"{ar / r['wall_ms']:.2f}" if ar and r["wall_ms"] > 0 else "n/a")
    Console().print(table)
    if args.json:
        write_json(args.json, stamp({"rack_sizes": sizes, "scenario": args.scenario, "nic": args.nic,
                               "uplink": args.uplink, "alpha_us": args.alpha_us, "efficiency": args.efficiency,
                               "contended_uplinks": args.contended_uplinks, "compute_ms": args.compute_ms, "size_mb": args.size_mb,
                               "iterations": args.iterations, "seconds": elapsed, "strategies": result}))
    return 0
