"""``dssync bench predict``: time to accuracy at cluster scale, from the simulator and the measured
iterations to target."""

from __future__ import annotations

import argparse

from dssync.bench.simulate import STRATEGIES as SIMCHECK_STRATEGIES
from dssync.commands._common import parse_rack_sizes, positive_int, unit_interval
from dssync.commands.bench._shared import outputs_checked, report_records

__all__ = ["add_parser", "run_predict"]

#: The simcheck records of the validation scenarios (bench/README.md).
VALIDATION = tuple(f"bench/results/simcheck{s}.json" for s in ("", "-three-rack", "-slow-links", "-slow-nic"))


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench predict`` on ``dssync bench``'s subparsers."""
    d = bsub.add_parser("predict", help="time to accuracy at cluster scale, from the simulator and the measured "
                        "iterations to target",
                        description="Each strategy's wall ms/iteration from `dssync simulate`'s model, calibrated "
                        "by a `bench simcheck` record, on --racks racks of --workers-per-rack with background "
                        "streams on a fraction of the uplinks, times its iterations to target over ddp's from a "
                        "`bench compare` record: the predicted time to accuracy, as ddp's over each strategy's.")
    d.add_argument("--simcheck", default="bench/results/simcheck.json", metavar="RECORD.json",
                   help="the calibration (alpha, efficiency) to use (default %(default)s)")
    d.add_argument("--compare", default="bench/results/compare-mnist-wide.json", metavar="RECORD.json",
                   help="the iterations to target and compute time to use (default %(default)s)")
    d.add_argument("--validation", default=",".join(VALIDATION), metavar="RECORD.json,...",
                   help="bench simcheck records whose spread of simulated ÷ measured wall time is drawn as a "
                   "band around each prediction (default: the four checked in)")
    d.add_argument("--racks", type=parse_rack_sizes, default=[2, 8, 32, 128, 512], metavar="R,R,...")
    d.add_argument("--workers-per-rack", type=positive_int, default=32)
    d.add_argument("--contended", default="0,0.25", metavar="F,F,...",
                   help="fractions of the uplinks with 8 background streams, one panel each")
    d.add_argument("--strategies", default=None, metavar="A,B,...",
                   help="as the compare record names them, with settings (default: every strategy of it the "
                   "simulator models)")
    d.add_argument("--nic", default=None, help="worker NIC rate (default: the calibrated cluster's, whose queue "
                   "and TCP behaviour the fitted parameters describe)")
    d.add_argument("--uplink", default=None, help="rack uplink rate (default: the calibrated cluster's)")
    d.add_argument("--iterations", type=positive_int, default=200, help="simulated iterations per point")
    d.add_argument("--json", metavar="OUT")
    d.add_argument("--markdown", metavar="OUT")
    d.add_argument("--plot", metavar="OUT.png")
    d.set_defaults(run=outputs_checked(run_predict))


def run_predict(args: argparse.Namespace) -> int:
    import json
    import statistics
    from pathlib import Path

    from rich.console import Console

    from dssync.bench.predict import (
        iterations_factors,
        markdown_table,
        plot,
        predict_tta,
        validation_spread,
    )
    from dssync.bench.simcheck import FITTED
    from dssync.launch.emulate import parse_rate

    def read(path: str, what: str) -> object:
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--{what} {path}: {exc}") from None
    sim, records = read(args.simcheck, "simcheck"), read(args.compare, "compare")
    try:
        calibration = {k: float(sim["calibration"][k]) for k in FITTED}
        nic, uplink = args.nic or sim["calibration"]["nic"], args.uplink or sim["calibration"]["uplink"]
        factors = iterations_factors(records)
        ddp = [r for r in records if r["strategy"] == "ddp"]
        compute_ms = statistics.median(r["wall_ms_per_iter"] - r["per_rank_comm_ms_per_iter"] for r in ddp)
        size_bytes = 4 * (784 * 512 + 512 + 512 * 10 + 10) if ddp[0]["task"] == "mnist-wide" else None
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"--simcheck {args.simcheck} or --compare {args.compare} is not such a record: {exc}") from None
    if size_bytes is None:
        raise ValueError(f"--compare {args.compare}: the model size of task {ddp[0]['task']!r} is not known here")
    try:
        fractions = [unit_interval(x) for x in args.contended.split(",") if x.strip()]
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"--contended: {exc}") from None
    from dssync._text import parse_variant

    def modelled(s: str) -> bool:
        return parse_variant(s)[0] in SIMCHECK_STRATEGIES
    if args.strategies is None:
        strategies = [s for s in factors if modelled(s)]
    else:
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in strategies if not modelled(s) or s not in factors]
    if bad or "ddp" not in strategies:
        raise ValueError(f"--strategies must include ddp (the reference) and only strategies of --compare "
                         f"{args.compare} that the simulator models ({', '.join(SIMCHECK_STRATEGIES)}); "
                         f"not {', '.join(bad) or 'without ddp'}")
    spread = validation_spread([read(path, "validation") for path in args.validation.split(",") if path.strip()])
    console = Console(stderr=True)
    with console.status("simulating") as status:
        rows = predict_tta(racks=args.racks, workers_per_rack=args.workers_per_rack, fractions=fractions,
                           strategies=strategies, calibration=calibration, factors=factors, size_bytes=size_bytes,
                           compute_ms=compute_ms, nic_bps=parse_rate(nic) / 8,
                           uplink_bps=parse_rate(uplink) / 8, iterations=args.iterations, spread=spread,
                           progress=lambda r: status.update(f"{r['workers']} workers, {r['strategy']}"))
    record = {"simcheck": args.simcheck, "compare": args.compare, "calibration": calibration,
              "compute_ms": compute_ms, "size_bytes": size_bytes, "nic": nic, "uplink": uplink,
              "iterations": args.iterations, "factors": factors, "validation": args.validation.split(","),
              "validation_spread": spread, "rows": rows}
    report_records(markdown_table(rows), record, args)
    if args.plot:
        plot(rows, args.plot)
    return 0
