"""``dssync bench``: measurements, each printed as a table and written as JSON."""

from __future__ import annotations

import argparse

from dssync._jsonfile import write_json
from dssync.commands._common import parse_rack_sizes
from dssync.launch import run_ranks

__all__ = ["add_parser", "run_averaging", "run_overlap", "run_probe_backends"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    a = bsub.add_parser("averaging", help="ds-sync group averaging vs a bare allreduce, same groups",
                        description="DS-Sync's parameter averaging of a model of --size-mb vs a bare "
                        "dist.all_reduce of one pre-flattened buffer on the same groups, interleaved "
                        "in one run.")
    a.add_argument("--size-mb", type=float, default=25.0)
    a.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    a.add_argument("--trials", type=int, default=10, help="timed passes over the period")
    a.add_argument("--warmup", type=int, default=2, help="untimed passes first")
    a.add_argument("--timeout", type=float, default=300.0)
    a.add_argument("--json", metavar="OUT")
    a.set_defaults(run=run_averaging)

    b = bsub.add_parser("probe-backends", help="built-in prober vs iperf3, path by path (needs root)",
                        description="Build an emulated network with unequal paths, probe it one pair "
                        "at a time with the built-in backend and with iperf3, and print every directed "
                        "pair's figures side by side.")
    b.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    b.add_argument("--nic", default="1gbit")
    b.add_argument("--uplink", default="400mbit")
    b.add_argument("--slow-nic", action="append", default=None, metavar="RANK:RATE",
                   help="give a worker a slower NIC (repeatable; default 1:600mbit)")
    b.add_argument("--seconds", type=int, default=1, help="stream length per direction, both backends")
    b.add_argument("--concurrent", action="store_true",
                   help="measure in the normal concurrent rounds instead of one pair at a time")
    b.add_argument("--json", metavar="OUT")
    b.set_defaults(run=run_probe_backends)

    o = bsub.add_parser("overlap", help="ds-sync overlapped vs after-step, side by side (needs root)",
                        description="Build an emulated network and train the same task with ds-sync "
                        "after the step and overlapped layer by layer, alternating, --reps times "
                        "each; print wall time per iteration and accuracy and their ratio.")
    o.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    o.add_argument("--nic", default="1gbit")
    o.add_argument("--uplink", default="1gbit")
    o.add_argument("--flows", nargs="*", default=[], metavar="FLOW", help="background flows, as in emulate contend")
    o.add_argument("--task", default="mnist-cnn")
    o.add_argument("--steps", type=int, default=40)
    o.add_argument("--batch-size", type=int, default=128)
    o.add_argument("--bucket-mb", type=float, default=1.0)
    o.add_argument("--reps", type=int, default=3)
    o.add_argument("--json", metavar="OUT")
    o.set_defaults(run=run_overlap)


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
        write_json(args.json, record)
    return 0


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
    if args.seconds < 1:
        raise ValueError(f"--seconds must be at least 1 (iperf3 -t counts whole seconds), got {args.seconds}")
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
        write_json(args.json, record)
    return 0


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
        write_json(args.json, record)
    return 0
