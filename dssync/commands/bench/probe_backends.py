"""``dssync bench probe-backends``: the built-in prober vs iperf3, path by path."""

from __future__ import annotations

import argparse

from dssync._jsonfile import write_json
from dssync.bench.provenance import stamp
from dssync.commands._common import parse_rack_sizes, positive_int
from dssync.commands.bench._shared import outputs_checked

__all__ = ["add_parser", "run_probe_backends"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench probe-backends`` on ``dssync bench``'s subparsers."""
    b = bsub.add_parser("probe-backends", help="built-in prober vs iperf3, path by path (needs root)",
                        description="Build an emulated network with unequal paths, probe it one pair "
                        "at a time with the built-in backend and with iperf3, and print every directed "
                        "pair's figures side by side.")
    b.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    b.add_argument("--nic", default="1gbit")
    b.add_argument("--uplink", default="400mbit")
    b.add_argument("--slow-nic", action="append", default=None, metavar="RANK:RATE",
                   help="give a worker a slower NIC (repeatable; default 1:600mbit)")
    b.add_argument("--seconds", type=positive_int, default=1,
                   help="stream length per direction, both backends (whole seconds: iperf3 -t)")
    b.add_argument("--concurrent", action="store_true",
                   help="measure in the normal concurrent rounds instead of one pair at a time")
    b.add_argument("--json", metavar="OUT")
    b.set_defaults(run=outputs_checked(run_probe_backends))


def run_probe_backends(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dssync.bench.probe_backends import compare_backends

    slow = {}
    for spec in args.slow_nic if args.slow_nic is not None else ["1:600mbit"]:
        rank, _, rate = spec.partition(":")
        if not rank.isdigit() or not rate:
            raise ValueError(f"--slow-nic wants RANK:RATE such as 1:600mbit, got {spec!r}")
        slow[int(rank)] = rate
    record = compare_backends(args.rack_sizes, nic=args.nic, uplink=args.uplink, slow_nics=slow,
                              seconds=args.seconds, isolated=not args.concurrent)
    table = Table(title=f"probe backends, racks {args.rack_sizes}, NIC {args.nic}, uplink {args.uplink}, "
                  f"slow NICs {slow or 'none'}, {'concurrent rounds' if args.concurrent else 'one pair at a time'}")
    for col in ("src", "dst", "builtin (Gbit/s)", "iperf3 (Gbit/s)", "builtin/iperf3 - 1"):
        table.add_column(col, justify="right")
    for row in record["rows"]:
        diff = "n/a" if row["diff"] is None else f"{row['diff']:+.1%}"
        table.add_row(str(row["src"]), str(row["dst"]), f"{row['builtin_gbps']:.3f}",
                      f"{row['iperf3_gbps']:.3f}", diff)
    console = Console()
    console.print(table)
    console.print(f"max |diff| {record['max_abs_diff']:.1%}, median {record['median_abs_diff']:.1%} over "
                  f"{len(record['rows'])} directed pairs; probe time builtin "
                  f"{record['probe_seconds']['builtin']:.1f} s, iperf3 {record['probe_seconds']['iperf3']:.1f} s")
    if args.json:
        write_json(args.json, stamp(record, args.provenance))
    return 0
