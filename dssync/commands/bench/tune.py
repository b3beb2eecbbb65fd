"""``dssync bench tune``: each peer's setting, chosen from a recorded sweep (``dssync.bench.tune``)."""

from __future__ import annotations

import argparse

from dssync.commands.bench._shared import outputs_checked, read_records, report_records

__all__ = ["add_parser", "run_tune"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench tune`` on ``dssync bench``'s subparsers."""
    t = bsub.add_parser("tune", help="pick each peer's setting from a bench compare sweep",
                        description="Read the records of a bench compare that ran several settings of each peer "
                        "(NAME:KEY=VALUE:...) beside the reference, on seeds the reported comparison does not use, "
                        "and pick per peer the setting with the shortest time to the reference's target: the "
                        "geometric mean over scenarios of its median time to target (a seed that never reaches "
                        "counting as never) over the reference's; ties and peers that never reach go to the "
                        "higher best accuracy. bench compare --tuned OUT.json then runs each peer at its pick.")
    t.add_argument("sweep", nargs="+", metavar="SWEEP.json",
                   help="the records of the sweep (bench compare --json; several files are read as one)")
    t.add_argument("--reference", default="ddp", metavar="NAME", help="the sweep's reference strategy (default ddp)")
    t.add_argument("--json", metavar="OUT", help="the choice and every candidate's figures")
    t.add_argument("--markdown", metavar="OUT", help="the sweep's table as markdown")
    t.set_defaults(run=outputs_checked(run_tune))


def run_tune(args: argparse.Namespace) -> int:
    from dssync.bench.tune import choose, markdown_table

    records = [r for path in args.sweep for r in read_records(path, "the sweep")]
    record = choose(records, reference=args.reference)
    table = markdown_table(record) + "\n\nChosen: " + ", ".join(record["chosen"].values())
    report_records(table, record, args)
    return 0
