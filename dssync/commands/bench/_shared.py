"""What several ``dssync bench`` subcommands share: the compared strategies, the output-file check,
the evaluation defaults and the report."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from dssync._jsonfile import check_writable, write_json
from dssync.strategies import compared_by_default

#: The comparison of time to accuracy: what users run today and every rival, beside ds-sync.
COMPARE_STRATEGIES = ",".join(compared_by_default())

__all__ = ["COMPARE_STRATEGIES"]


def outputs_checked(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` after its output files (``--json``, ``--markdown``, ``--plot``) are checked
    writable (a bench runs for minutes and must not lose its record at the end), with its
    provenance taken now, as ``args.provenance``."""
    def checked(args: argparse.Namespace) -> int:
        from dssync.bench.provenance import provenance

        for key in ("json", "markdown", "plot"):
            if getattr(args, key, None):
                check_writable(getattr(args, key))
        args.provenance = provenance()  # as the bench starts: the code that measures
        return run(args)
    return checked


def eval_and_warmup(args: argparse.Namespace) -> tuple[int, int]:
    """--eval-every and --warmup-steps, defaulting to 2 % and 5 % of --steps."""
    eval_every = args.eval_every or max(1, args.steps // 50)
    return eval_every, args.warmup_steps if args.warmup_steps is not None else args.steps // 20


def read_records(path: str, what: str) -> list[dict]:
    """The records of a ``bench compare --json`` file, or ``ValueError`` naming ``what`` it was
    read for and why it cannot be."""
    import json
    from pathlib import Path

    try:
        records = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what}: cannot read {path}: {exc}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{what}: {path} is not a list of bench compare records")
    return records


def report_records(table: str, records: object, args: argparse.Namespace) -> None:
    """Print the markdown table; write the records (--json) and the table (--markdown), each
    stamped with its provenance (``dssync.bench.provenance``): a ``provenance`` key in every
    record of a list, or in the one record, and the markdown's first line. The provenance is
    the one taken when the bench started (``outputs_checked``), so that a commit made while
    a long bench ran is not credited with its figures."""
    from collections import Counter
    from pathlib import Path

    from dssync.bench.provenance import markdown_line, provenance, stamp

    prov = getattr(args, "provenance", None) or provenance()
    print(table)
    stamped = stamp(records, prov)
    if args.json:
        write_json(args.json, stamped)
    if args.markdown:
        head = markdown_line(prov)
        if isinstance(stamped, list):  # a resumed measurement: say which runs older code measured
            commits = Counter((r["provenance"].get("commit") or "unknown")[:12] for r in stamped if isinstance(r, dict))
            if len(commits) > 1:
                head += " (runs by commit: " + ", ".join(f"{c} {n}" for c, n in commits.items()) + ")"
        Path(args.markdown).write_text(head + "\n\n" + table + "\n")
