"""``dssync plan``: build the divide-and-shuffle schedule for a topology."""

from __future__ import annotations

import argparse
import dataclasses

from dssync.commands._common import parse_rack_sizes, positive_float, positive_int
from dssync.planning.planner import (
    DEFAULT_MAX_PERIOD,
    PLAN_KINDS,
    base_plan,
    check_adjusted,
    check_paced,
    check_static,
    contended,
    paced,
)
from dssync.planning.schedule import EXPLICIT_MAX, Schedule
from dssync.topology import Topology

__all__ = ["add_parser", "print_schedule", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan a divide-and-shuffle schedule for a topology",
                       description="Read TOPOLOGY (topology.json), write the divide-and-shuffle schedule as "
                       "schedule.json: the static plan (paper Fig. 4), or, when the topology records "
                       "slow uplinks or NICs, the adjusted plan that keeps them in groups of two "
                       "(Fig. 5, 6), unless the static plan mixes sooner around them (--plan).")
    p.add_argument("topology", metavar="TOPOLOGY", nargs="?", help="topology.json (or --rack-sizes)")
    p.add_argument("--rack-sizes", type=parse_rack_sizes, metavar="A,B,...",
                   help="plan for consecutive ranks in racks of these sizes instead of a topology file")
    p.add_argument("--racks", type=positive_int, metavar="R",
                   help="with --workers-per-rack: R racks of W consecutive ranks each (for large layouts)")
    p.add_argument("--workers-per-rack", type=positive_int, metavar="W")
    p.add_argument("--slow-uplinks", type=_ints, default=[], metavar="R,...",
                   help="also treat these racks' uplinks as slow (added to the topology's contention)")
    p.add_argument("--slow-nics", type=_ints, default=[], metavar="I,...",
                   help="also treat these ranks' NICs as slow (added to the topology's contention)")
    p.add_argument("--out", required=True, metavar="FILE", help="where to write schedule.json")
    p.add_argument("--print", action="store_true", dest="show", help="also print the period as a table")
    p.add_argument("--max-period", type=positive_int, default=DEFAULT_MAX_PERIOD,
                   help="longest exact rotation before a bounded one is used (default %(default)s)")
    p.add_argument("--message-mb", type=positive_float, default=None,
                   help="model size; with measured bandwidth, fills in predicted_comm_ms")
    p.add_argument("--pace", type=positive_int, default=1, metavar="K",
                   help="racks exchange every K-th round only, rack-local rounds between "
                   "(dssync's extension for a cross-rack group much slower than the racks; default 1)")
    p.add_argument("--plan", choices=PLAN_KINDS, default="auto", dest="kind",
                   help="with slow links: auto (default) builds the adjusted plan unless the static one mixes "
                   "sooner around them (planner.time_to_mix); adjusted always builds the adjusted plan")
    p.set_defaults(run=run)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 0,2, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    if (args.racks is None) != (args.workers_per_rack is None):
        raise ValueError("--racks and --workers-per-rack go together")
    if args.racks is not None:
        if args.rack_sizes is not None:
            raise ValueError("give --rack-sizes or --racks with --workers-per-rack, not both")
        args.rack_sizes = [args.workers_per_rack] * args.racks
    if (args.topology is None) == (args.rack_sizes is None):
        raise ValueError("give a topology file or --rack-sizes (or --racks with --workers-per-rack), one of them")
    topology = Topology.load(args.topology) if args.topology else Topology.from_rack_sizes(args.rack_sizes)
    if args.slow_uplinks or args.slow_nics:
        uplinks, nics = contended(topology)
        topology = dataclasses.replace(topology, contention={
            "uplinks": [{"rack": r} for r in sorted(set(uplinks) | set(args.slow_uplinks))],
            "nics": [{"rank": i} for i in sorted(set(nics) | set(args.slow_nics))]})
    message_bytes = None if args.message_mb is None else int(args.message_mb * 1e6)
    from rich.console import Console

    # Large layouts take seconds (100,000 ranks in two racks: a period of 50,000 rounds):
    # a spinner on stderr says what runs, on a terminal only.
    with Console(stderr=True).status(f"planning {topology.world_size} ranks in {topology.num_racks} racks"):
        built, schedule = base_plan(topology, max_period=args.max_period, message_bytes=message_bytes,
                                    kind=args.kind)
        if args.pace > 1:
            schedule = paced(schedule, topology, args.pace, message_bytes=message_bytes)
        base = check_paced(schedule, topology, args.pace)
        uplinks, nics = contended(topology)
        if built == "adjusted":
            check_adjusted(base, topology, slow_uplinks=uplinks, slow_nics=nics)
        else:
            check_static(base, topology)
        schedule.save(args.out)
    if args.show:
        print_schedule(schedule, topology)
    kind = f"adjusted for slow uplinks {uplinks} and NICs {nics}" if built == "adjusted" else \
        f"static, which mixes sooner around slow uplinks {uplinks} and NICs {nics}" if uplinks or nics else "static"
    kind += f", paced by {args.pace}" if args.pace > 1 else ""
    print(f"wrote {args.out}: {topology.world_size} ranks, {topology.num_racks} racks, {kind}, "
          f"period {schedule.length}, rho {schedule.rho:.4f} "
          f"({schedule.rho ** (1 / schedule.length):.4f} a round)")
    for note in schedule.notes:
        print(f"note: {note}")
    return 0


def print_schedule(schedule: Schedule, topology: Topology) -> None:
    from rich.console import Console
    from rich.table import Table

    if schedule.length * schedule.world_size > EXPLICIT_MAX:
        print(f"(--print: a period of {schedule.length} rounds over {schedule.world_size} ranks is too large for "
              "a table; the schedule file lists it)")
        return
    table = Table(title=f"divide-and-shuffle period (rho = {schedule.rho:.4f})")
    table.add_column("round", justify="right")
    table.add_column("inter-rack groups")
    table.add_column("intra-rack groups")
    for t, partition in enumerate(schedule.period):
        crossing = [g for g in partition if len({topology.rack_of(r) for r in g}) > 1]
        local = [g for g in partition if g not in crossing]
        table.add_row(str(t), " ".join(str(list(g)) for g in crossing) or "-",
                      " ".join(str(list(g)) for g in local) or "-")
    Console().print(table)
