"""``dssync train``: train one task with one strategy, on local ranks or under a launcher."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from dssync._jsonfile import check_writable, write_json
from dssync.averaging.ensemble import ENSEMBLES
from dssync.bench.provenance import stamp
from dssync.commands._common import (
    add_racks_from_option,
    add_topology_options,
    finite_float,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    schedule_from_args,
    topology_from_args,
)
from dssync.launch import from_environ
from dssync.strategies import REGISTRY, DSSyncStrategy, get_strategy, having, probing
from dssync.training.loop import LR_SCHEDULES, OPTIMIZERS, TrainConfig, train
from dssync.training.tasks import TASKS

__all__ = ["add_parser", "config_from_args", "config_from_file", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a task with a synchronization strategy",
                       description="Train TASK with STRATEGY. Without a launcher, spawns --nproc "
                       "local ranks; under torchrun (or another launcher) runs one rank.")
    p.add_argument("--strategy", metavar="NAME", help=f"one of: {', '.join(sorted(REGISTRY))} (or --config)")
    p.add_argument("--config", metavar="JOB.json",
                   help="every setting of the run from a job config (the JSON of TrainConfig.to_dict, as "
                   "the library writes it); only --nproc, --json and --no-progress go with it")
    p.add_argument("--task", default="digits", metavar="TASK", help=f"one of: {', '.join(sorted(TASKS))}")
    p.add_argument("--steps", type=positive_int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="local ranks to spawn (default 8 without a launcher; omit under one)")
    p.add_argument("--backend", default="torch", choices=("torch", "mpi", "horovod"),
                   help="collective library (default torch: gloo on CPU, NCCL on CUDA)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="per-rank minibatch")
    p.add_argument("--lr", type=positive_float, default=0.05, help="peak learning rate of the loop's optimizer")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                   help="the loop's optimizer: sgd (momentum 0.9) or adamw (DiLoCo's inner optimizer; give it "
                   "an Adam-sized --lr such as 1e-3) (default sgd)")
    p.add_argument("--weight-decay", type=non_negative_float, default=0.0, metavar="WD",
                   help="decoupled weight decay of adamw, L2 of sgd (default 0)")
    p.add_argument("--lr-schedule", default="constant", choices=LR_SCHEDULES,
                   help="after the warm-up: constant, or a half cosine to zero at --steps")
    p.add_argument("--warmup-steps", type=int, default=0, metavar="N",
                   help="linear learning-rate warm-up over the first N iterations (large overall batch)")
    p.add_argument("--eval-every", type=positive_int, default=25)
    p.add_argument("--target-accuracy", type=positive_float, default=None, metavar="ACC",
                   help="stop at the first evaluation whose test accuracy reaches ACC (--steps is the cap); "
                   "the record gets time_to_target_s")
    p.add_argument("--model-mb", type=positive_float, default=1.0, help="model size of the synthetic task")
    ds = DSSyncStrategy.Config()  # the defaults the help quotes
    p.add_argument("--ensemble", default=None, choices=ENSEMBLES,
                   help="ds-sync: what each rank keeps for the final world average: none (its current "
                   "parameters, the default), swa (its iterates from --swa-start on), ema (--ema-decay)")
    p.add_argument("--swa-start", type=finite_float, default=None, metavar="FRACTION",
                   help=f"ds-sync --ensemble swa: average the iterates after this fraction of the run (default {ds.swa_start})")
    p.add_argument("--ema-decay", type=finite_float, default=None, help="ds-sync --ensemble ema: decay of the local EMA "
                   f"model (default {ds.ema_decay})")
    p.add_argument("--overlap", action="store_true",
                   help="ds-sync: average layer by layer as backward produces gradients (paper V-A.1)")
    p.add_argument("--bucket-mb", type=non_negative_float, default=None, metavar="MB",
                   help=f"ds-sync --overlap: layers share one allreduce until it holds MB (default {ds.bucket_mb:g}; "
                   "0: one per layer)")
    p.add_argument("--adjust-every", type=positive_int, default=None, metavar="N",
                   help="ds-sync: sense contention from group timings every N iterations and regroup "
                   "(paper: 100; default off)")
    p.add_argument("--max-pace", type=positive_int, default=None, metavar="K",
                   help="ds-sync --adjust-every: let racks exchange as rarely as every K-th round when "
                   f"the cross-rack group is the job's bottleneck (default {ds.max_pace}; 1: every round, as in the paper)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                   help="any setting of the strategy's Config, e.g. --set staleness=2 (ssp), "
                   "--set push_quorum=3 --set pull_fraction=0.75 (psp); repeatable")
    p.add_argument("--timeout", type=positive_float, default=300.0, help="seconds any collective may wait")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: each rank's model and data on its local GPU, CUDA tensors through NCCL")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="checkpoint folder: resume from its latest checkpoint if it has one (also after "
                   "torchrun restarts a job), write one every --checkpoint-every iterations and at the end")
    p.add_argument("--checkpoint-every", type=non_negative_int, default=0, metavar="N", help="with --checkpoint (default: at the end only)")
    p.add_argument("--stop-after", type=int, default=None, metavar="K",
                   help="with --checkpoint: stop after iteration K as a preemption would; a later run "
                   "with the same settings resumes there")
    p.add_argument("--json", metavar="OUT", help="write the run's record as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_topology_options(p)
    add_racks_from_option(p, " (ds-sync, when it probes: not with --topology, --rack-sizes or --racks)")
    p.set_defaults(run=run)
    _DEFAULTS.update(vars(p.parse_args([])))


#: ``dssync train``'s defaults: what a run with ``--config`` must leave as they are.
_DEFAULTS: dict[str, Any] = {}
#: The options that are the run's own, not the job's settings: they go with ``--config``.
_RUN_OPTIONS = frozenset({"config", "nproc", "json", "no_progress", "run"})


def config_from_file(args: argparse.Namespace) -> TrainConfig:
    """The job config of ``--config``, with the run's own progress choice; any other setting
    given beside it is refused (the file holds them all)."""
    beside = sorted(k for k, v in vars(args).items() if k in _DEFAULTS and k not in _RUN_OPTIONS
                    and v != _DEFAULTS[k])
    if beside:
        flags = ", ".join("--" + k.replace("_", "-") for k in beside)
        raise ValueError(f"--config {args.config} holds every setting of the run; {flags} cannot go with it "
                         "(only --nproc, --json and --no-progress can)")
    try:
        with open(args.config, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"--config {args.config}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"--config {args.config}: not JSON ({exc})") from None
    cfg = TrainConfig.from_dict(data, source=args.config)
    return dataclasses.replace(cfg, progress=not args.no_progress and sys.stderr.isatty())


def run(args: argparse.Namespace) -> int:
    if args.config is not None:
        cfg = config_from_file(args)
    elif args.strategy is None:
        raise ValueError("give --strategy NAME (or --config JOB.json)")
    else:
        cfg = config_from_args(args)
    topology = cfg.topology
    nproc = args.nproc
    if nproc is None and from_environ() is None and cfg.backend == "torch":
        nproc = topology.world_size if topology is not None else 8
    if args.json:
        check_writable(args.json)  # before training, not after
    record = train(cfg, nproc=nproc)
    if record is None:  # a non-zero rank under a launcher
        return 0
    if args.json:
        write_json(args.json, stamp(finite_record(record)))
    summary = {k: record[k] for k in ("strategy", "task", "world_size", "resumed_from", "steps_run", "final_accuracy",
                                      "best_accuracy", "wall_s", "per_rank_comm_ms_per_iter",
                                      "comm_ms_per_iter", "time_to_target_s")}
    print(json.dumps(summary))
    return 0


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's settings from ``dssync train``'s options, validated once."""
    strategy = get_strategy(args.strategy)
    options = {}
    for flag, key, kind in (("--ensemble", "ensemble", None), ("--swa-start", "swa_start", "swa"),
                            ("--ema-decay", "ema_decay", "ema"), ("--overlap", "overlap", None),
                            ("--adjust-every", "adjust_every", None), ("--max-pace", "max_pace", None)):
        value = getattr(args, key)
        if value is None or value is False:
            continue
        if key not in strategy.Config.settings():
            raise ValueError(f"{flag} applies to --strategy {' or '.join(having(key))} only")
        if kind is not None and args.ensemble != kind:
            raise ValueError(f"{flag} applies to --ensemble {kind} only")
        options[key] = value
    if args.bucket_mb is not None:
        if not args.overlap:
            raise ValueError("--bucket-mb applies to --overlap only")
        options["bucket_mb"] = args.bucket_mb
    options.update(strategy.Config.read(args.settings, args.strategy))
    if args.racks_from is not None and (not strategy.probes or args.topology or args.rack_sizes or args.racks):
        names = " or ".join(probing())
        raise ValueError(f"--racks-from applies when {names} probes the network: --strategy {names} without "
                         "--topology, --rack-sizes or --racks")
    topology = topology_from_args(args)
    return TrainConfig(
        strategy=args.strategy, task=args.task, steps=args.steps, seed=args.seed,
        batch_size=args.batch_size, lr=args.lr, optimizer=args.optimizer, weight_decay=args.weight_decay,
        lr_schedule=args.lr_schedule,
        warmup_steps=args.warmup_steps, target_accuracy=args.target_accuracy, eval_every=args.eval_every,
        model_mb=args.model_mb, num_racks=args.racks or 2, topology=topology,
        probe_first=args.racks is None, racks_from=args.racks_from.source if args.racks_from else None,
        schedule=schedule_from_args(args), strategy_options=options, timeout_s=args.timeout,
        progress=not args.no_progress and sys.stderr.isatty(), backend=args.backend,
        device=args.device, checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every, stop_after=args.stop_after,
    )


def finite_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as strict JSON can hold it: a run whose model diverged evaluates to a NaN or
    infinite loss, which becomes ``null``, and the record says ``"diverged": true`` (its
    accuracies stay, so a comparison still ranks it) instead of the whole record being lost."""
    bad: list[str] = []  # json's own parser names every NaN and Infinity it meets; each becomes None
    out = json.loads(json.dumps(record), parse_constant=lambda c: bad.append(c))
    if bad:
        out["diverged"] = True
    return out
