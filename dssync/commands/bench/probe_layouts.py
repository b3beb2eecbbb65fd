"""``dssync bench probe-layouts``: the prober on seeded random emulated networks."""

from __future__ import annotations

import argparse
from pathlib import Path

from dssync._jsonfile import write_json
from dssync.bench.provenance import stamp
from dssync.commands._common import positive_int
from dssync.commands.bench._shared import outputs_checked

__all__ = ["add_parser", "run_probe_layouts"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench probe-layouts`` on ``dssync bench``'s subparsers."""
    g = bsub.add_parser("probe-layouts", help="the prober on seeded random emulated networks (needs root)",
                        description="Draw COUNT random layouts (2-4 racks of 1-5 workers, slower uplinks and "
                        "NICs, background flows across uplinks and through NICs, busy CPUs) from SEED, build "
                        "each one, run `dssync probe` on it and score its answer against what was built: "
                        "exact (racks and flags), or the same network (every pattern of the job's flows "
                        "gets the same max-min fair rates within 5%).")
    g.add_argument("--count", type=positive_int, default=20,
                   help="layouts to probe, or runs of --layout (default %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed of the layout generator (default %(default)s)")
    g.add_argument("--max-workers", type=positive_int, default=9, help="largest world drawn (default %(default)s)")
    g.add_argument("--min-workers", type=positive_int, default=4, help="smallest world drawn (default %(default)s)")
    g.add_argument("--layout", type=_layout, metavar="TEXT",
                   help="probe this one layout COUNT times instead of drawing, written as the table writes "
                   "layouts (e.g. '2,2 rack:0 cpu:1': racks of two, another job's flows leaving rack 0, "
                   "worker 1's host busy): how often the probe is right on one network")
    g.add_argument("--built-once", action="store_true",
                   help="with --layout: build it once and probe it COUNT times, its contention running "
                   "throughout, as a user probes a cluster that stays up (default: built anew for each probe)")
    g.add_argument("--probe-args", default="", metavar="ARGS",
                   help="extra `dssync probe` options, one string (e.g. '--bandwidth-seconds 0.5')")
    g.add_argument("--rate-scale", type=_scale, default=1.0, metavar="F",
                   help="build every rate of the layouts at F of its value, 0 < F <= 1 (on few cores the "
                   "CPU, not the links, bounds many emulated flows at once; the ratios that decide the "
                   "racks and flags stay as drawn; default %(default)s)")
    g.add_argument("--json", metavar="OUT", help="write every row, the summary and the raw topologies")
    g.add_argument("--rescore", metavar="RECORD",
                   help="score the layouts and topologies of an earlier --json RECORD by today's rules "
                   "instead of probing (the record keeps its measured provenance as `measured`)")
    g.set_defaults(run=outputs_checked(run_probe_layouts))


def _scale(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a rate scale is in (0, 1], got {text}")
    return value


def _layout(text: str):
    from dssync.bench.probe_layouts import Layout

    try:
        return Layout.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def run_probe_layouts(args: argparse.Namespace) -> int:
    import shlex

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from dssync.bench.probe_layouts import generate, run_layouts

    if args.built_once and args.layout is None:
        raise ValueError("--built-once probes one --layout again and again; give --layout")
    console = Console()
    measured = None
    if args.rescore:
        import json
        import re

        from dssync.bench.probe_layouts import rescore

        earlier = json.loads(Path(args.rescore).read_text())
        result, measured = rescore(earlier), earlier.get("provenance")
        args.rate_scale = earlier.get("rate_scale", 1.0)
        seed = re.search(r"--seed (\S+)", earlier.get("command", ""))
        args.seed = seed.group(1) if seed else "?"
    else:
        layouts = ([args.layout] * args.count if args.layout is not None else
                   generate(args.count, args.seed, max_workers=args.max_workers, min_workers=args.min_workers))
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("probing layouts", total=len(layouts))
            result = run_layouts(layouts, probe_args=shlex.split(args.probe_args), rate_scale=args.rate_scale,
                                 report=lambda row: progress.advance(task), built_once=args.built_once)
    layouts = result["rows"]
    table = Table(title=f"dssync probe on {len(layouts)} random layouts (seed {args.seed})"
                  if args.layout is None else
                  f"dssync probe, {len(layouts)} runs on {args.layout.describe()}")
    for col in ("#", "layout", "answer", "racks", "uplinks found/true", "NICs found/true", "unplaced", "probe s",
                "whole s"):
        table.add_column(col, justify="right" if col in ("#", "probe s", "whole s") else "left")
    for k, row in enumerate(result["rows"]):
        if row.get("failed"):
            table.add_row(str(k), row["layout"], "FAILED", "-", f"-/{row['uplinks_true']}", f"-/{row['nics_true']}",
                          "-", "-", "-")
            continue
        answer = "exact" if row["exact"] else "same network" if row["same_network"] else (
            "WRONG" + (" (confident)" if row["wrong_confident"] else " (unsure)"))
        if not row["flags_right"]:
            answer += ", flags wrong"
        racks = "exact" if row["racks_exact"] else f"{row['racks_found']}"
        table.add_row(str(k), row["layout"], answer, racks, f"{row['uplinks_found']}/{row['uplinks_true']}",
                      f"{row['nics_found']}/{row['nics_true']}", str(row["unplaced"] or "-"),
                      f"{row['probe_seconds']:.1f}",
                      "-" if row.get("whole_seconds") is None else f"{row['whole_seconds']:.1f}")
    console.print(table)
    for k, row in enumerate(result["rows"]):
        if row.get("failed"):
            console.print(f"#{k}'s probe FAILED: {row['failed']}")
        elif row["difference"]:
            console.print(f"#{k} is another network: {row['difference']}")
    s = result["summary"]
    n = s["layouts"]
    console.print(f"right {s['right']}/{n} (exact {s['exact']}/{n}, the same network {s['same_network']}/{n}), "
                  f"flags right {s['flags_right']}/{n}, wrong and confident {s['wrong_confident']}, wrong only through "
                  f"another job's flows {s.get('wrong_only_through_other_jobs', 0)}; racks exact "
                  f"{s['racks_exact']}/{n} (racks that can be the same network {s['racks_same_network']}/{n}), "
                  f"flags exact {s['flags_exact']}/{n}, flag precision "
                  f"{s['flag_precision']:.3f} recall {s['flag_recall']:.3f}" + (
                      f", {s['failed']} of {n} probes FAILED" if s.get("failed") else "") + (
                      f", probe time median {s['probe_seconds_median']:.1f} s max {s['probe_seconds_max']:.1f} s"
                      if "probe_seconds_median" in s else "") + (
                      f", the whole `dssync emulate run -- dssync probe` median {s['whole_seconds_median']:.1f} s max "
                      f"{s['whole_seconds_max']:.1f} s" if "whole_seconds_median" in s else ""))
    if args.json:
        command = (f"dssync bench probe-layouts --count {args.count} --seed {args.seed} --max-workers {args.max_workers}"
                   f" --min-workers {args.min_workers}")
        if args.layout is not None:
            command = f"dssync bench probe-layouts --count {args.count} --layout {shlex.quote(args.layout.describe())}"
            command += " --built-once" if args.built_once else ""
        if args.rate_scale != 1:
            command += f" --rate-scale {args.rate_scale}"
        if args.rescore:
            command = f"dssync bench probe-layouts --rescore {args.rescore}"
        extra = {"measured": measured} if measured else {}
        write_json(args.json, stamp({"command": command, "probe_args": args.probe_args,
                                     "rate_scale": args.rate_scale, **extra, **result},
                                    args.provenance))
    return 1 if result["summary"].get("failed") else 0
