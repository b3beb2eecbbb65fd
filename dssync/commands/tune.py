"""``dssync tune sync-switch``: search Sync-Switch's switch point, reusable for recurring jobs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dssync._jsonfile import check_writable, write_json
from dssync.bench.provenance import stamp
from dssync.commands._common import fraction, positive_float, positive_int

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="search a strategy's policy offline (sync-switch: the switch point)")
    tsub = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    s = tsub.add_parser("sync-switch", help="binary-search the earliest BSP->ASP switch point that keeps BSP's "
                        "accuracy", description="Sync-Switch's offline timing policy (paper 000, Algorithm 1): train "
                        "pure BSP --repeats times for the target accuracy (unless --reuse gives it), then bisect "
                        "the switch point for --settings steps, --repeats runs each. Writes the policy as JSON; "
                        "train with it through `dssync train --strategy sync-switch --set switch_at=S`.")
    s.add_argument("--task", default="digits")
    s.add_argument("--steps", type=positive_int, default=200)
    s.add_argument("--nproc", type=int, default=4, help="local ranks per trial")
    s.add_argument("--batch-size", type=positive_int, default=32)
    s.add_argument("--lr", type=positive_float, default=0.05, help="the BSP phase's rate (ASP runs it / nproc)")
    s.add_argument("--beta", type=fraction, default=0.01, help="accuracy margin around pure BSP's")
    s.add_argument("--settings", type=positive_int, default=4, help="switch points to try (the paper's M)")
    s.add_argument("--repeats", type=positive_int, default=1, help="runs per switch point, seeds 0.. (the paper's R)")
    s.add_argument("--reuse", metavar="POLICY.json",
                   help="a policy this command wrote for the same job: take its target accuracy, run no BSP trials")
    s.add_argument("--out", metavar="POLICY.json", help="write the policy and every trial here")
    s.add_argument("--timeout", type=positive_float, default=300.0)
    s.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dssync.training.loop import TrainConfig, train
    from dssync.training.tune import search_switch_point

    if args.steps < 1 or args.nproc < 2:
        raise ValueError("--steps must be positive and --nproc at least 2")
    if args.out:
        check_writable(args.out)
    target = None
    if args.reuse:
        if not Path(args.reuse).is_file():
            raise ValueError(f"--reuse {args.reuse}: no such policy file (write one with --out)")
        try:
            known = json.loads(Path(args.reuse).read_text())
            job = known["job"]
            target = float(known["target_accuracy"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{args.reuse}: not a policy written by `dssync tune sync-switch` ({exc})") from None
        mine = _job(args)
        if job != mine:
            diff = {k: (job.get(k), v) for k, v in mine.items() if job.get(k) != v}
            raise ValueError(f"{args.reuse} was tuned for another job: {diff} (theirs, this one)")
    console = Console(stderr=True)

    def one(switch_at: float, seed: int) -> float:
        record = train(TrainConfig(strategy="sync-switch", task=args.task, steps=args.steps, seed=seed,
                                   batch_size=args.batch_size, lr=args.lr, eval_every=args.steps,
                                   strategy_options={"switch_at": switch_at}, timeout_s=args.timeout),
                       nproc=args.nproc)
        return float(record["final_accuracy"])

    with console.status("tuning sync-switch"):
        policy = search_switch_point(one, beta=args.beta, settings=args.settings, repeats=args.repeats,
                                     target=target, progress=lambda line: console.print(line, highlight=False))
    policy["job"] = _job(args)
    print(f"switch at {policy['switch_at']:.4g} of the workload (target accuracy {policy['target_accuracy']:.4f} "
          f"± {args.beta}): dssync train --strategy sync-switch --set switch_at={policy['switch_at']:.6g}")
    if args.out:
        write_json(args.out, stamp(policy))
    return 0


def _job(args: argparse.Namespace) -> dict[str, object]:
    """What makes two tuning runs the same job (a recurring job may reuse the target)."""
    return {"task": args.task, "steps": args.steps, "nproc": args.nproc, "batch_size": args.batch_size,
            "lr": args.lr}
