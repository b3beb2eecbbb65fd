"""``dssync bench compare``: time to accuracy of every strategy on one emulated network."""

from __future__ import annotations

import argparse

from dssync.commands._common import (
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from dssync.commands.bench._shared import (
    COMPARE_STRATEGIES,
    eval_and_warmup,
    outputs_checked,
    read_records,
    report_records,
)
from dssync.training.loop import LR_SCHEDULES, OPTIMIZERS

__all__ = ["add_parser", "run_compare"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench compare`` on ``dssync bench``'s subparsers."""
    c = bsub.add_parser("compare", help="time to accuracy of every strategy on one emulated network (needs root)",
                        description="For each scenario, build the emulated cluster and train every strategy on "
                        "the same task, --repeats seeds. The reference (ddp) runs first on every seed; its "
                        "lowest best accuracy is the target, and the others, interleaved seed by seed, stop "
                        "once they reach it. Reports time to accuracy and its ratio to the reference, "
                        "iterations to target, wall and comm ms per iteration and best accuracy.")
    c.add_argument("--scenario", default="static", metavar="S[,S...]",
                   help="static, inter-rack, inter-rack+nic, or several, comma-separated")
    c.add_argument("--strategies", default=COMPARE_STRATEGIES, metavar="A,B,...",
                   help="strategies, each optionally with settings: NAME:KEY=VALUE:... "
                   f"(e.g. psp:push_quorum=6:pull_fraction=0.75; default {COMPARE_STRATEGIES})")
    c.add_argument("--reference", default="ddp", metavar="NAME",
                   help="the strategy whose lowest best accuracy over the seeds is the target (default ddp)")
    c.add_argument("--target-accuracy", type=fraction, default=None, metavar="ACC",
                   help="the target, instead of the reference's lowest best (every strategy then interleaved)")
    c.add_argument("--no-stop", action="store_true",
                   help="run every strategy to --steps instead of stopping at the target")
    c.add_argument("--task", default="mnist-wide")
    c.add_argument("--steps", type=positive_int, default=600, help="iterations, the cap of runs that stop at the target")
    c.add_argument("--repeats", type=positive_int, default=1, help="seeds 0 .. N-1 (default 1)")
    c.add_argument("--seeds", default=None, metavar="S,S,...",
                   help="the seeds, instead of --repeats (a tuning sweep runs on seeds the report does not use)")
    c.add_argument("--tuned", metavar="TUNED.json",
                   help="run each peer named plainly in --strategies at the setting bench tune chose for it")
    c.add_argument("--eval-every", type=positive_int, default=None,
                   help="evaluate every this many iterations (default: every 2%% of --steps)")
    c.add_argument("--batch-size", type=positive_int, default=32, help="per-worker minibatch")
    c.add_argument("--adjust-every", type=non_negative_int, default=25, help="ds-sync's regrouping interval (0: off)")
    c.add_argument("--model-mb", type=positive_float, default=1.0, help="model size of the synthetic task")
    c.add_argument("--lr", type=positive_float, default=0.15,
                   help="peak learning rate of the loop's optimizer (default 0.15)")
    c.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS, help="the loop's optimizer (default sgd)")
    c.add_argument("--weight-decay", type=non_negative_float, default=0.0, metavar="WD")
    c.add_argument("--lr-schedule", default="cosine", choices=LR_SCHEDULES,
                   help="after the warm-up (default cosine, to zero at --steps)")
    c.add_argument("--warmup-steps", type=non_negative_int, default=None, metavar="N",
                   help="linear learning-rate warm-up (default: 5%% of --steps)")
    c.add_argument("--rate-scale", type=positive_float, default=1.0, metavar="F",
                   help="multiply every NIC and uplink rate of the scenarios by F (default 1)")
    c.add_argument("--cpu", nargs="+", default=[], metavar="RANK:CORES",
                   help="stragglers: cap these workers' CPU on every scenario (emulate contend --cpu)")
    c.add_argument("--episode", action="append", default=[], metavar="SPEC",
                   help="a transient straggler in every run, RANK:KIND=VALUE@START+DURATION, e.g. "
                   "1:cpu=0.1@5+20 or 3:nic=100mbit@0+30 (emulate run --episode); repeatable")
    c.add_argument("--target-loss", type=positive_float, metavar="LOSS",
                   help="also report iterations, updates and time to this test loss (SpecSync's criterion)")
    c.add_argument("--json", metavar="OUT", help="one record per run (train --json keys plus scenario), "
                   "rewritten after every run")
    c.add_argument("--resume", action="store_true",
                   help="keep the runs already in --json (an interrupted comparison with the same settings) and "
                   "run only the others")
    c.add_argument("--markdown", metavar="OUT", help="the summary table as markdown")
    c.add_argument("--plot", metavar="OUT.png")
    c.set_defaults(run=outputs_checked(run_compare))


def run_compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dssync.bench.compare import (
        compare,
        loss_rows,
        loss_table,
        markdown_table,
        plan_rows,
        plan_table,
        plot,
        seed_rows,
        seed_table,
        summarize,
        variant_config,
    )

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if args.tuned:
        import json
        from pathlib import Path

        from dssync.bench.tune import apply_tuned

        try:
            chosen = json.loads(Path(args.tuned).read_text())["chosen"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot read the chosen settings of {args.tuned} (bench tune --json): {exc}") from None
        strategies = apply_tuned(strategies, chosen)
    seeds = None
    if args.seeds is not None:
        try:
            seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--seeds takes comma-separated integers, got {args.seeds!r}") from None
    for s in strategies:  # unknown names and bad settings fail here, before any network is built
        variant_config(s, {"task": args.task})
    scenarios = [s.strip() for s in args.scenario.split(",") if s.strip()]
    from dssync.launch.emulate import parse_cpu_limit, parse_episode

    cpu = dict(parse_cpu_limit(text) for text in args.cpu)
    episodes = [parse_episode(text) for text in args.episode]
    eval_every, warmup = eval_and_warmup(args)
    settings = {"lr": args.lr, "lr_schedule": args.lr_schedule, "warmup_steps": warmup,
                "batch_size": args.batch_size, "optimizer": args.optimizer, "weight_decay": args.weight_decay}
    reference = None if args.no_stop or args.target_accuracy is not None else args.reference
    if reference is not None and reference not in strategies:
        raise ValueError(f"--reference {reference} must be one of --strategies (or give --target-accuracy)")
    console = Console(stderr=True)

    from dssync._jsonfile import write_json
    from dssync.bench.provenance import provenance, stamp

    prov, done = getattr(args, "provenance", None) or provenance(), []
    previous = _previous(args) if args.resume else []
    kept = {id(r) for r in previous}

    def report(r: dict) -> None:
        done.append(r)
        if args.json:  # the runs so far, rewritten after each: an interrupted comparison keeps them
            write_json(args.json, stamp(done, prov))
        head = f"{r['scenario']} {r['strategy']} seed {r['repeat']}{' (kept)' if id(r) in kept else ''}: "
        if "error" in r:
            console.print(head + f"FAILED: {r['error']}", markup=False, highlight=False)
            return
        tta = r.get("time_to_target_s")
        console.print(head + f"{r.get('steps_run', r['steps'])} iters, wall {r['wall_s']:.1f} s "
                      f"({r['wall_s'] * 1e3 / r.get('steps_run', r['steps']):.1f} ms/iter), best accuracy "
                      f"{r['best_accuracy']:.4f}" + ("" if tta is None else f", target reached at {tta:.1f} s"),
                      markup=False, highlight=False)

    records = compare(scenarios, strategies, task=args.task, steps=args.steps, repeats=args.repeats, seeds=seeds,
                      eval_every=eval_every, adjust_every=args.adjust_every, model_mb=args.model_mb, cpu=cpu,
                      episodes=episodes, settings=settings, reference=reference,
                      target=args.target_accuracy, stop=not args.no_stop, rate_scale=args.rate_scale,
                      previous=previous, progress=report)
    rows = summarize(records, reference=args.reference)
    table = markdown_table(rows, reference=args.reference)
    if (len(seeds) if seeds else args.repeats) > 1:
        table += (f"\n\nBest accuracy per seed, and paired with {args.reference}'s on the same seed "
                  "(†: stopped at the target, so no higher than the target):\n\n") + \
            seed_table(seed_rows(records, reference=args.reference), reference=args.reference)
    if args.target_loss is not None:
        table += "\n\n" + loss_table(loss_rows(records, args.target_loss))
    plans = plan_rows(records)
    if plans:
        table += ("\n\nHow still each online plan held: its schedule changes after the initial plan, how many "
                  "came after the first contention event, and any link it flagged that the scenario leaves "
                  "clear:\n\n") + plan_table(plans)
    report_records(table, records, args)
    if args.plot:
        plot(records, rows, args.plot, reference=args.reference)
    return 0


def _previous(args: argparse.Namespace) -> list[dict]:
    """The records of ``--json`` that ``--resume`` keeps; none if the file is not there yet. A
    record of another task or run length refuses the resumption."""
    from pathlib import Path

    if not args.json:
        raise ValueError("--resume keeps the runs of --json OUT: give --json")
    path = Path(args.json)
    if not path.exists():
        return []
    records = read_records(args.json, "--resume")
    for r in records:
        if "error" in r:
            continue
        if not isinstance(r.get("provenance"), dict):
            raise ValueError(f"--resume: {path} holds runs without provenance (written before records carried "
                             "their commit); write this comparison to another file")
        if (r.get("task"), r.get("steps")) != (args.task, args.steps):
            raise ValueError(f"--resume: {path} holds a run of task {r.get('task')} for {r.get('steps')} steps; "
                             f"this comparison is {args.task} for {args.steps}")
    return records
