"""``dssync bench overlap``: ds-sync overlapped vs after-step, side by side."""

from __future__ import annotations

import argparse

from dssync._jsonfile import write_json
from dssync.bench.provenance import stamp
from dssync.commands._common import non_negative_float, parse_rack_sizes, positive_int
from dssync.commands.bench._shared import outputs_checked

__all__ = ["add_parser", "run_overlap"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench overlap`` on ``dssync bench``'s subparsers."""
    o = bsub.add_parser("overlap", help="ds-sync overlapped vs after-step, side by side (needs root)",
                        description="Build an emulated network and train the same task with ds-sync "
                        "after the step and overlapped layer by layer, alternating, --reps times "
                        "each; print wall time per iteration and accuracy and their ratio.")
    o.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    o.add_argument("--nic", default="1gbit")
    o.add_argument("--uplink", default="1gbit")
    o.add_argument("--flows", nargs="*", default=[], metavar="FLOW", help="background flows, as in emulate contend")
    o.add_argument("--task", default="mnist-cnn")
    o.add_argument("--steps", type=positive_int, default=40)
    o.add_argument("--batch-size", type=positive_int, default=128)
    o.add_argument("--bucket-mb", type=non_negative_float, default=1.0)
    o.add_argument("--reps", type=positive_int, default=3)
    o.add_argument("--json", metavar="OUT")
    o.set_defaults(run=outputs_checked(run_overlap))


def run_overlap(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dssync.bench.overlap import compare_overlap
    from dssync.launch import emulate

    console = Console(stderr=True)
    flows = [emulate.parse_flow(f) for f in args.flows]
    record = compare_overlap(
        args.rack_sizes, nic=args.nic, uplink=args.uplink, flows=flows, task=args.task, steps=args.steps,
        batch_size=args.batch_size, bucket_mb=args.bucket_mb, reps=args.reps,
        progress=lambda r: console.print(f"{r['mode']:>10} rep {r['rep']}: {r['ms_per_iter']:.1f} ms/iter, "
                                         f"accuracy {r['final_accuracy']:.4f}"))
    table = Table(title=f"ds-sync overlapped vs after-step: {args.task}, batch {args.batch_size}, "
                  f"{args.steps} steps, racks {args.rack_sizes}, NIC {args.nic}, uplink {args.uplink}, "
                  f"flows {record['network']['flows'] or 'none'}; median of {args.reps}")
    for col in ("mode", "ms/iter", "final accuracy"):
        table.add_column(col, justify="right")
    for mode in ("after-step", "overlap"):
        table.add_row(mode, f"{record['median_ms_per_iter'][mode]:.1f}",
                      f"{record['median_final_accuracy'][mode]:.4f}")
    Console().print(table)
    Console().print(f"overlap / after-step wall time per iteration: {record['ratio']:.3f}; "
                    f"accuracy difference {record['accuracy_diff_pp']:+.2f} pp")
    if args.json:
        write_json(args.json, stamp(record, args.provenance))
    return 0
