"""``dssync bench averaging``: ds-sync group averaging vs a bare allreduce, same groups."""

from __future__ import annotations

import argparse

from dssync._jsonfile import write_json
from dssync.bench.provenance import stamp
from dssync.commands._common import non_negative_int, parse_rack_sizes, positive_float, positive_int
from dssync.commands.bench._shared import outputs_checked
from dssync.launch import run_ranks

__all__ = ["add_parser", "run_averaging"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench averaging`` on ``dssync bench``'s subparsers."""
    a = bsub.add_parser("averaging", help="ds-sync group averaging vs a bare allreduce, same groups",
                        description="DS-Sync's parameter averaging of a model of --size-mb vs a bare "
                        "dist.all_reduce of one pre-flattened buffer on the same groups, interleaved "
                        "in one run.")
    a.add_argument("--size-mb", type=positive_float, default=25.0)
    a.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    a.add_argument("--trials", type=positive_int, default=10, help="timed passes over the period")
    a.add_argument("--warmup", type=non_negative_int, default=2, help="untimed passes first")
    a.add_argument("--timeout", type=positive_float, default=300.0)
    a.add_argument("--json", metavar="OUT")
    a.set_defaults(run=outputs_checked(run_averaging))


def run_averaging(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dssync.bench.averaging import averaging_rank

    if args.trials < 1 or args.warmup < 0:
        raise ValueError("--trials must be at least 1 and --warmup at least 0")
    nproc = sum(args.rack_sizes)
    record = run_ranks(averaging_rank, args.rack_sizes, args.size_mb, args.trials, args.warmup,
                       nproc=nproc, timeout_s=args.timeout)[0]
    if record is None:
        return 0
    table = Table(title=f"group averaging, {nproc} ranks in racks {args.rack_sizes}, "
                  f"{len(record['samples_ms']['bare'])} rounds")
    for col in ("size (B)", "ds-sync avg (ms)", "bare all_reduce (ms)", "ratio"):
        table.add_column(col, justify="right")
    table.add_row(str(record["bytes"]), f"{record['ds_sync_ms']:.2f}",
                  f"{record['bare_allreduce_ms']:.2f}", f"{record['ratio']:.3f}")
    Console().print(table)
    if args.json:
        write_json(args.json, stamp(record, args.provenance))
    return 0
