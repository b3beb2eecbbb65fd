"""Options and loaders shared by several subcommands."""

from __future__ import annotations

import argparse

from dssync._text import read_finite
from dssync.errors import TopologyError
from dssync.planning.schedule import Schedule
from dssync.topology import Topology
from dssync.topology.prior import RackPrior, parse_racks_from

__all__ = ["add_racks_from_option", "add_topology_options", "finite_float", "fraction", "non_negative_float", "non_negative_int", "positive_float",
           "positive_int", "topology_from_args", "unit_interval"]


def finite_float(text: str) -> float:
    """An argparse type: a finite number (``nan`` and ``inf`` are refused)."""
    try:
        return read_finite(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_float(text: str) -> float:
    """An argparse type: a finite number above zero."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above zero")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number, zero or more."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def fraction(text: str) -> float:
    """An argparse type: a finite number strictly between 0 and 1."""
    value = finite_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie between 0 and 1")
    return value


def unit_interval(text: str) -> float:
    """An argparse type: a finite number from 0 to 1, both included."""
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie from 0 to 1")
    return value


def _integer(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r} must be {low} or more")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer, zero or more."""
    return _integer(text, 0)


def positive_int(text: str) -> int:
    """An argparse type: an integer of 1 or more."""
    return _integer(text, 1)


def parse_rack_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"rack sizes must look like 4,4 or 5,3, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"rack sizes must be positive integers, got {text!r}")
    return sizes


def rack_sizes_from_args(args: argparse.Namespace) -> list[int]:
    """``--racks R --workers-per-rack W`` or ``--rack-sizes A,B,...`` as a list of sizes."""
    if args.racks is not None:
        if not args.workers_per_rack or args.racks < 1 or args.workers_per_rack < 1:
            raise ValueError("--racks needs a positive --workers-per-rack")
        return [args.workers_per_rack] * args.racks
    return list(args.rack_sizes)


def racks_from(text: str) -> RackPrior:
    """An argparse type: ``slurm`` or ``hostnames:REGEX`` (``dssync.topology.prior``)."""
    try:
        return parse_racks_from(text)
    except TopologyError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--racks-from ")) from None


RACKS_FROM_HELP = (
    "racks you already know, as a prior the measurement checks: slurm (SLURM's topology, "
    "`scontrol show topology`: a leaf switch is a rack) or hostnames:REGEX (the first group of REGEX "
    "in each host name, DSSYNC_HOST else the hostname, names its rack). The probe still measures; "
    "it keeps the measured rack of every worker it is sure of and the prior's for the rest, and "
    "says on stderr and in topology.json (confidence.prior_disagrees) where the two disagree")


def add_racks_from_option(parser: argparse.ArgumentParser, where: str = "") -> None:
    """``--racks-from slurm|hostnames:REGEX`` (``args.racks_from``: a ``RackPrior`` or ``None``)."""
    parser.add_argument("--racks-from", type=racks_from, default=None, metavar="slurm|hostnames:REGEX",
                        help=RACKS_FROM_HELP + where)


def add_topology_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("topology")
    g.add_argument("--topology", metavar="FILE", help="topology.json (from `dssync probe` or by hand)")
    g.add_argument("--rack-sizes", type=parse_rack_sizes, metavar="A,B,...",
                   help="a logical topology instead of a file: consecutive ranks per rack")
    g.add_argument("--racks", type=positive_int, default=None, metavar="R",
                   help="without --topology/--rack-sizes: split the ranks evenly into R racks (default: "
                   "ds-sync probes the network first when its ranks are on several hosts, else 2 racks)")
    g.add_argument("--schedule", metavar="FILE", help="schedule.json to follow (default: plan one)")


def topology_from_args(args: argparse.Namespace) -> Topology | None:
    if args.topology and args.rack_sizes:
        raise ValueError("give either --topology or --rack-sizes, not both")
    if args.topology:
        return Topology.load(args.topology)
    if args.rack_sizes:
        return Topology.from_rack_sizes(args.rack_sizes)
    return None


def schedule_from_args(args: argparse.Namespace) -> Schedule | None:
    return Schedule.load(args.schedule) if args.schedule else None
