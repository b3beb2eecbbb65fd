"""``dssync bench simcheck``: the simulator's prediction against the emulated cluster."""

from __future__ import annotations

import argparse

from dssync._jsonfile import write_json
from dssync.bench.simulate import STRATEGIES as SIMCHECK_STRATEGIES
from dssync.commands._common import non_negative_int, positive_float, positive_int
from dssync.commands.bench._shared import outputs_checked, report_records

__all__ = ["add_parser", "run_simcheck"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench simcheck`` on ``dssync bench``'s subparsers."""
    k = bsub.add_parser("simcheck", help="the simulator's prediction against the emulated cluster (needs root)",
                        description="Calibrate the simulator's per-message cost and per-flow efficiency from "
                        "`bench allreduce` on the emulated static cluster, measure each strategy's CPU time on "
                        "unshaped links, then run every strategy on every scenario (--seeds each) on a "
                        "communication-bound job (synthetic task of --model-mb, one sample per rank) and report "
                        "wall and per-rank comm ms/iter beside `dssync simulate`'s model of the same job. "
                        "--from re-runs the model on a record without a cluster.")
    k.add_argument("--scenario", default="static,inter-rack,inter-rack+nic", metavar="S[,S...]")
    k.add_argument("--strategies", default=",".join(SIMCHECK_STRATEGIES), metavar="A,B,...")
    k.add_argument("--seeds", type=positive_int, default=3, help="seeds 0..N-1 per strategy and scenario")
    k.add_argument("--model-mb", type=positive_float, default=1.0)
    k.add_argument("--steps", type=positive_int, default=20, help="iterations per job (diloco's outer step is the 20th)")
    k.add_argument("--warmup", type=non_negative_int, default=4, help="iterations left out of every mean")
    k.add_argument("--rate-scale", type=positive_float, default=0.05, metavar="F",
                   help="multiply every NIC and uplink rate of the scenarios by F, on the emulated cluster "
                   "and in the model (default 0.05: 50 Mbit/s, where the links rather than the machine's "
                   "cores take at least 80%% of a job's time)")
    k.add_argument("--from", dest="source", metavar="RECORD.json",
                   help="a simcheck record: re-run the model on its measurements, run nothing")
    k.add_argument("--calibrated", metavar="RECORD.json",
                   help="take the calibration and the CPU-share rows from this simcheck record (same --rate-scale, "
                   "--model-mb, --steps, --warmup) and measure only the jobs: a new scenario against a model "
                   "fitted once")
    k.add_argument("--model", choices=("iterations", "flows"), default="iterations",
                   help="iterations: `dssync simulate`'s model (the one that scales); flows: the event-driven "
                   "flow model (bench/flows.py), for clusters of this size (docs/simulator.md)")
    k.add_argument("--queue-rtt", default="bench/results/queue-rtt.json", metavar="RECORD.json",
                   help="with --model flows: the measured queue and round trip (python -m dssync.bench.queue_rtt), "
                   "at the same --rate-scale")
    k.add_argument("--json", metavar="OUT")
    k.add_argument("--markdown", metavar="OUT")
    k.set_defaults(run=outputs_checked(run_simcheck))


def run_simcheck(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rich.console import Console

    from dssync.bench.provenance import provenance
    from dssync.bench.simcheck import markdown_table, predict, simcheck

    if args.source:
        try:
            record = json.loads(Path(args.source).read_text())
            record["rows"] = predict(record)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{args.source} is not a simcheck record: {exc}") from None
        # The jobs keep the provenance of the code that measured them; the model's is this run's.
        record["replayed"] = {"from": args.source, "model": args.model,
                              "provenance": getattr(args, "provenance", None) or provenance()}
    else:
        console = Console(stderr=True)

        def say(stage: str, r: dict) -> None:
            if stage == "calibration":  # the others: one job's row
                console.print(f"calibration: alpha {1e6 * r['alpha_s']:.0f} us, efficiency {r['efficiency']:.3f}")
            else:
                console.print(f"{stage} {r['scenario']} {r['strategy']} seed {r['seed']}: wall {r['wall_ms']:.1f} "
                              f"ms/iter, per-rank comm {r['comm_ms']:.1f}")
        calibrated = None
        if args.calibrated:
            try:
                calibrated = json.loads(Path(args.calibrated).read_text())
                calibrated["calibration"], calibrated["cpu"]  # noqa: B018 - what the run takes from it
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"--calibrated {args.calibrated} is not a simcheck record: {exc}") from None
        record = simcheck([s.strip() for s in args.scenario.split(",") if s.strip()],
                          [s.strip() for s in args.strategies.split(",") if s.strip()],
                          seeds=range(args.seeds), model_mb=args.model_mb, steps=args.steps, warmup=args.warmup,
                          rate_scale=args.rate_scale, progress=say,
                          save=(lambda r: write_json(args.json, r)) if args.json else None, calibrated=calibrated)
        if args.calibrated:
            record["calibrated_from"] = args.calibrated
    if args.model == "flows":
        record["rows"], record["flow_model"] = _flow_rows(record, args.queue_rtt)
    table = markdown_table(record)
    if args.source:
        measured = record.get("provenance")  # one run's provenance, or a note on the runs a record joins
        measured = f"at commit {(measured.get('commit') or 'unknown')[:12]}" if isinstance(measured, dict) else \
            f"as its provenance says ({measured})"
        table = f"The {args.model} model at the commit above on the jobs of {args.source}, measured {measured}.\n\n{table}"
    report_records(table, record, args)
    return 0


def _flow_rows(record: dict, queue_rtt: str) -> tuple[list, dict]:
    """The flow model's rows for ``record``'s jobs, with the queue and round trip of the
    ``queue_rtt`` record, and what it used (``flow_model`` in the record)."""
    from dssync.bench import flows

    try:
        queue_s, rtt_s = flows.measured_queue(queue_rtt, record["rate_scale"])
    except ValueError as exc:
        raise ValueError(f"--queue-rtt {exc}") from None
    checked = flows.check(record, queue_s=queue_s, rtt_s=rtt_s)
    return flows.job_rows(record, checked), {"queue_rtt": queue_rtt, "queue_s": queue_s, "rtt_s": rtt_s,
                                             "fit": checked["fit"]}
