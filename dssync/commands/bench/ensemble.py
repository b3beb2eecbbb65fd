"""``dssync bench ensemble``: ds-sync's local ensemble against the plain world average, per evaluation."""

from __future__ import annotations

import argparse

from dssync.commands._common import (
    add_topology_options,
    non_negative_int,
    positive_float,
    positive_int,
    topology_from_args,
)
from dssync.commands.bench._shared import eval_and_warmup, outputs_checked, report_records
from dssync.training.loop import LR_SCHEDULES

__all__ = ["add_parser", "run_ensemble"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench ensemble`` on ``dssync bench``'s subparsers."""
    e = bsub.add_parser("ensemble", help="ds-sync's local ensemble against the plain world average, per evaluation",
                        description="Train ds-sync on local ranks once per ensemble rule, same seed (the "
                        "workers' trajectory is the same whatever the rule), and compare the handed-back "
                        "model's test accuracy with the plain world average's at every evaluation.")
    e.add_argument("--rules", default="swa:0.75,ema:0.98", metavar="R,R,...",
                   help="rules beside none: swa[:START] (fraction of the run), ema[:DECAY] (default swa:0.75,ema:0.98)")
    e.add_argument("--task", default="mnist-wide")
    e.add_argument("--steps", type=positive_int, default=600)
    e.add_argument("--seeds", type=positive_int, default=3, help="seeds 0..N-1")
    e.add_argument("--nproc", type=positive_int, default=8)
    e.add_argument("--batch-size", type=positive_int, default=32)
    e.add_argument("--lr", type=positive_float, default=0.15)
    e.add_argument("--lr-schedule", default="cosine", choices=LR_SCHEDULES)
    e.add_argument("--warmup-steps", type=non_negative_int, default=None, metavar="N", help="default: 5%% of --steps")
    e.add_argument("--eval-every", type=positive_int, default=None, help="default: every 2%% of --steps")
    e.add_argument("--timeout", type=positive_float, default=300.0)
    e.add_argument("--json", metavar="OUT")
    e.add_argument("--markdown", metavar="OUT")
    add_topology_options(e)
    e.set_defaults(run=outputs_checked(run_ensemble))


def run_ensemble(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dssync.bench.ensemble import compare_ensembles, summarize_ensembles
    from dssync.bench.tables import markdown
    from dssync.commands._common import schedule_from_args
    from dssync.strategies import DSSyncStrategy
    from dssync.training.loop import TrainConfig

    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    topology = topology_from_args(args)
    eval_every, warmup = eval_and_warmup(args)
    base = TrainConfig(strategy=DSSyncStrategy.name, task=args.task, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                       lr_schedule=args.lr_schedule, eval_every=eval_every, warmup_steps=warmup,
                       topology=topology, num_racks=args.racks or 2, schedule=schedule_from_args(args),
                       timeout_s=args.timeout)
    nproc = topology.world_size if topology is not None else args.nproc
    console = Console(stderr=True)
    records = compare_ensembles(base, rules, range(args.seeds), nproc=nproc, progress=lambda r: console.print(
        f"seed {r['seed']} {r['rule']}: final accuracy {r['final_accuracy']:.4f}, best {r['best_accuracy']:.4f}",
        markup=False, highlight=False))
    table = markdown(
        ["rule", "evaluations", "lower than plain", "higher", "worst pp", "mean pp", "mean loss diff",
         "at the end, pp (per seed)", "final acc.", "best acc."],
        [[r["rule"], r["evaluations"], r["lower"], r["higher"], f"{r['worst_pp']:+.2f}", f"{r['mean_pp']:+.3f}",
          f"{r['mean_loss_diff']:+.4f}", ", ".join(f"{d:+.2f}" for d in r["final_pp"]), f"{r['final_accuracy']:.4f}",
          f"{r['best_accuracy']:.4f}"] for r in summarize_ensembles(records)])
    report_records(table, records, args)
    return 0
