"""``dssync bench``: measurements, each printed as a table and written as JSON."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from dssync._jsonfile import check_writable, write_json
from dssync.bench.simulate import STRATEGIES as SIMCHECK_STRATEGIES
from dssync.commands._common import (
    add_topology_options,
    fraction,
    non_negative_float,
    non_negative_int,
    parse_rack_sizes,
    positive_float,
    positive_int,
    topology_from_args,
    unit_interval,
)
from dssync.launch import from_environ, run_ranks
from dssync.train import LR_SCHEDULES

#: The comparison of DESIGN section 7: what users run today and every rival, beside ds-sync.
COMPARE_STRATEGIES = "ddp,allreduce,hierarchical,torch-hier,diloco,local-sgd,gossip,asp,ds-sync"

__all__ = ["COMPARE_STRATEGIES", "add_parser", "run_ensemble", "run_allreduce", "run_compare", "run_averaging", "run_simcheck", "run_predict", "run_overlap", "run_probe_backends", "run_probe_layouts"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    r = bsub.add_parser("allreduce", help="allreduce time, algbw and busbw per size (nccl-tests style)",
                        description="Time allreduce over a size sweep on the whole world, on the racks "
                        "at once, or on the groups of a schedule, round by round, all groups of a round "
                        "at once. Without a launcher, spawns --nproc local ranks.")
    r.add_argument("--sizes", default="1K:64M", metavar="LO[:HI]", help="size sweep, e.g. 1K:256M (default 1K:64M)")
    r.add_argument("--factor", type=int, default=4, help="multiply the size by this much each row (default 4)")
    r.add_argument("--groups", default="world", metavar="world|racks|SCHEDULE.json")
    r.add_argument("--warmup", type=non_negative_int, default=5, help="untimed ops per size")
    r.add_argument("--iters", type=positive_int, default=20, help="timed ops per size")
    r.add_argument("--nproc", type=positive_int, default=None, help="local ranks (default 8 without a launcher)")
    r.add_argument("--backend", default="torch", metavar="torch|mpi|horovod[,...]",
                   help="collective library, or several comma-separated: without a launcher, dssync starts "
                   "each one's job itself (local spawn, mpirun, horovodrun --gloo) and prints every table")
    r.add_argument("--timeout", type=positive_float, default=300.0)
    r.add_argument("--json", metavar="OUT")
    add_topology_options(r)
    r.set_defaults(run=_outputs_checked(run_allreduce))

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
    c.add_argument("--repeats", type=positive_int, default=1)
    c.add_argument("--eval-every", type=positive_int, default=None,
                   help="evaluate every this many iterations (default: every 2%% of --steps)")
    c.add_argument("--batch-size", type=positive_int, default=32, help="per-worker minibatch")
    c.add_argument("--adjust-every", type=non_negative_int, default=25, help="ds-sync's regrouping interval (0: off)")
    c.add_argument("--model-mb", type=positive_float, default=1.0, help="model size of the synthetic task")
    c.add_argument("--lr", type=positive_float, default=0.15, help="peak learning rate of the loop's SGD (default 0.15)")
    c.add_argument("--lr-schedule", default="cosine", choices=LR_SCHEDULES,
                   help="after the warm-up (default cosine, to zero at --steps)")
    c.add_argument("--warmup-steps", type=non_negative_int, default=None, metavar="N",
                   help="linear learning-rate warm-up (default: 5%% of --steps)")
    c.add_argument("--cpu", nargs="+", default=[], metavar="RANK:CORES",
                   help="stragglers: cap these workers' CPU on every scenario (emulate contend --cpu)")
    c.add_argument("--episode", action="append", default=[], metavar="SPEC",
                   help="a transient straggler in every run, RANK:KIND=VALUE@START+DURATION, e.g. "
                   "1:cpu=0.1@5+20 or 3:nic=100mbit@0+30 (emulate run --episode); repeatable")
    c.add_argument("--target-loss", type=positive_float, metavar="LOSS",
                   help="also report iterations, updates and time to this test loss (SpecSync's criterion)")
    c.add_argument("--json", metavar="OUT", help="one record per run (train --json keys plus scenario)")
    c.add_argument("--markdown", metavar="OUT", help="the summary table as markdown")
    c.add_argument("--plot", metavar="OUT.png")
    c.set_defaults(run=_outputs_checked(run_compare))

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
    k.add_argument("--json", metavar="OUT")
    k.add_argument("--markdown", metavar="OUT")
    k.set_defaults(run=_outputs_checked(run_simcheck))

    d = bsub.add_parser("predict", help="time to accuracy at cluster scale, from the simulator and the measured "
                        "iterations to target",
                        description="Each strategy's wall ms/iteration from `dssync simulate`'s model, calibrated "
                        "by a `bench simcheck` record, on --racks racks of --workers-per-rack with background "
                        "streams on a fraction of the uplinks, times its iterations to target over ddp's from a "
                        "`bench compare` record: the predicted time to accuracy, as ddp's over each strategy's.")
    d.add_argument("--simcheck", default="bench/results/simcheck.json", metavar="RECORD.json",
                   help="the calibration (alpha, efficiency) to use (default %(default)s)")
    d.add_argument("--compare", default="bench/results/compare.json", metavar="RECORD.json",
                   help="the iterations to target and compute time to use (default %(default)s)")
    d.add_argument("--racks", type=parse_rack_sizes, default=[2, 8, 32, 128, 512], metavar="R,R,...")
    d.add_argument("--workers-per-rack", type=positive_int, default=32)
    d.add_argument("--contended", default="0,0.25", metavar="F,F,...",
                   help="fractions of the uplinks with 8 background streams, one panel each")
    d.add_argument("--strategies", default=",".join(SIMCHECK_STRATEGIES), metavar="A,B,...")
    d.add_argument("--nic", default=None, help="worker NIC rate (default: the calibrated cluster's, whose queue "
                   "and TCP behaviour the fitted parameters describe)")
    d.add_argument("--uplink", default=None, help="rack uplink rate (default: the calibrated cluster's)")
    d.add_argument("--iterations", type=positive_int, default=200, help="simulated iterations per point")
    d.add_argument("--json", metavar="OUT")
    d.add_argument("--markdown", metavar="OUT")
    d.add_argument("--plot", metavar="OUT.png")
    d.set_defaults(run=_outputs_checked(run_predict))

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
    e.set_defaults(run=_outputs_checked(run_ensemble))

    a = bsub.add_parser("averaging", help="ds-sync group averaging vs a bare allreduce, same groups",
                        description="DS-Sync's parameter averaging of a model of --size-mb vs a bare "
                        "dist.all_reduce of one pre-flattened buffer on the same groups, interleaved "
                        "in one run.")
    a.add_argument("--size-mb", type=positive_float, default=25.0)
    a.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    a.add_argument("--trials", type=positive_int, default=10, help="timed passes over the period")
    a.add_argument("--warmup", type=non_negative_int, default=2, help="untimed passes first")
    a.add_argument("--timeout", type=positive_float, default=300.0)
    a.add_argument("--json", metavar="OUT")
    a.set_defaults(run=_outputs_checked(run_averaging))

    b = bsub.add_parser("probe-backends", help="built-in prober vs iperf3, path by path (needs root)",
                        description="Build an emulated network with unequal paths, probe it one pair "
                        "at a time with the built-in backend and with iperf3, and print every directed "
                        "pair's figures side by side.")
    b.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    b.add_argument("--nic", default="1gbit")
    b.add_argument("--uplink", default="400mbit")
    b.add_argument("--slow-nic", action="append", default=None, metavar="RANK:RATE",
                   help="give a worker a slower NIC (repeatable; default 1:600mbit)")
    b.add_argument("--seconds", type=positive_int, default=1,
                   help="stream length per direction, both backends (whole seconds: iperf3 -t)")
    b.add_argument("--concurrent", action="store_true",
                   help="measure in the normal concurrent rounds instead of one pair at a time")
    b.add_argument("--json", metavar="OUT")
    b.set_defaults(run=_outputs_checked(run_probe_backends))

    g = bsub.add_parser("probe-layouts", help="the prober on seeded random emulated networks (needs root)",
                        description="Draw COUNT random layouts (2-4 racks of 1-5 workers, slower uplinks and "
                        "NICs, background flows across uplinks and through NICs) from SEED, build each one, "
                        "run `dssync probe` on it and score the racks and the flags against what was built.")
    g.add_argument("--count", type=positive_int, default=20, help="layouts to probe (default %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed of the layout generator (default %(default)s)")
    g.add_argument("--max-workers", type=positive_int, default=9, help="largest world drawn (default %(default)s)")
    g.add_argument("--probe-args", default="", metavar="ARGS",
                   help="extra `dssync probe` options, one string (e.g. '--bandwidth-seconds 0.5')")
    g.add_argument("--json", metavar="OUT", help="write every row, the summary and the raw topologies")
    g.set_defaults(run=_outputs_checked(run_probe_layouts))

    o = bsub.add_parser("overlap", help="ds-sync overlapped vs after-step, side by side (needs root)",
                        description="Build an emulated network and train the same task with ds-sync "
                        "after the step and overlapped layer by layer, alternating, --reps times "
                        "each; print wall time per iteration and accuracy and their ratio.")
    o.add_argument("--rack-sizes", type=parse_rack_sizes, default=[4, 4], metavar="A,B,...")
    o.add_argument("--nic", default="1gbit")
    o.add_argument("--uplink", default="1gbit")
    o.add_argument("--flows", nargs="*", default=[], metavar="FLOW", help="background flows, as in emulate contend")
    o.add_argument("--task", default="mnist-cnn")
    o.add_argument("--steps", type=positive_int, default=40)
    o.add_argument("--batch-size", type=positive_int, default=128)
    o.add_argument("--bucket-mb", type=non_negative_float, default=1.0)
    o.add_argument("--reps", type=positive_int, default=3)
    o.add_argument("--json", metavar="OUT")
    o.set_defaults(run=_outputs_checked(run_overlap))


def _outputs_checked(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` after its output files (``--json``, ``--markdown``, ``--plot``) are checked
    writable: a bench runs for minutes and must not lose its record at the end."""
    def checked(args: argparse.Namespace) -> int:
        for key in ("json", "markdown", "plot"):
            if getattr(args, key, None):
                check_writable(getattr(args, key))
        return run(args)
    return checked


def run_allreduce(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dssync.bench.allreduce import allreduce_rank, format_table, size_sweep
    from dssync.launch.spawn import BACKENDS
    from dssync.schedule import Schedule
    from dssync.topology import Topology

    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise ValueError(f"unknown backend {unknown[0] if unknown else args.backend!r}; choose from "
                         f"{', '.join(BACKENDS)}, comma-separated")
    if args.warmup < 0 or args.iters < 1:
        raise ValueError("--warmup must be at least 0 and --iters at least 1")
    sizes = size_sweep(args.sizes, args.factor)
    launched = from_environ()
    if launched is not None and len(backends) > 1:
        raise ValueError(f"under {launched.launcher} give one --backend; without a launcher dssync starts each "
                         "backend's job itself")
    if launched is None and backends != ["torch"]:
        return _allreduce_per_backend(args, backends)
    world = launched.world_size if launched is not None else (args.nproc or 8)
    if args.groups == "world":
        rounds = [[list(range(world))]]
    elif args.groups == "racks":
        topo = topology_from_args(args) or Topology.even(world, min(args.racks or 2, world))
        if topo.world_size != world:
            raise ValueError(f"the topology has {topo.world_size} workers but the job has {world} ranks")
        rounds = [topo.racks()]
    elif Path(args.groups).suffix == ".json":
        schedule = Schedule.load(args.groups)
        if schedule.world_size != world:
            raise ValueError(f"the schedule is for {schedule.world_size} ranks but the job has {world}")
        rounds = [[list(g) for g in r] for r in schedule.period]
    else:
        raise ValueError(f"--groups is world, racks or a schedule.json file, got {args.groups!r}")
    record = run_ranks(allreduce_rank, sizes, rounds, args.warmup, args.iters,
                       nproc=None if launched is not None else world, timeout_s=args.timeout,
                       backend=backends[0])[0]
    if record is None:
        return 0
    record.update({"world_size": world, "groups": args.groups, "rounds": rounds,
                   "warmup": args.warmup, "iters": args.iters, "backend": args.backend})
    print(format_table(record, f"allreduce, {world} ranks, groups {args.groups} "
                       f"({len(rounds)} round(s) of {[len(g) for g in rounds[0]]}), backend {args.backend}, "
                       f"warmup {args.warmup}, iters {args.iters}"))
    if args.json:
        write_json(args.json, record)
    return 0


def _allreduce_per_backend(args: argparse.Namespace, backends: list[str]) -> int:
    """Run ``bench allreduce`` once per backend, each under its own launcher, and print every
    table and a one-line busbw summary."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from dssync.bench.allreduce import size_sweep

    world = args.nproc or 8
    passthrough = ["--sizes", args.sizes, "--factor", str(args.factor), "--groups", args.groups,
                   "--warmup", str(args.warmup), "--iters", str(args.iters), "--timeout", str(args.timeout)]
    for flag, value in (("--topology", args.topology), ("--schedule", args.schedule),
                        ("--racks", args.racks)):
        if value is not None:
            passthrough += [flag, str(value)]
    if args.rack_sizes:
        passthrough += ["--rack-sizes", ",".join(map(str, args.rack_sizes))]
    me = [sys.executable, "-m", "dssync.cli", "bench", "allreduce"]
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            out = os.path.join(tmp, f"{backend}.json")
            cmd = [*me, *passthrough, "--backend", backend, "--json", out]
            if backend == "torch":
                cmd += ["--nproc", str(world)]
            elif backend == "mpi":
                mpirun = shutil.which("mpirun")
                if mpirun is None:
                    raise ValueError("--backend mpi needs mpirun on PATH (apt-get install openmpi-bin)")
                root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
                cmd = [mpirun, "-np", str(world), "--oversubscribe", *root, *cmd]
            else:
                horovodrun = shutil.which("horovodrun") or os.path.join(os.path.dirname(sys.executable), "horovodrun")
                if not os.path.exists(horovodrun):
                    raise ValueError("--backend horovod needs horovodrun: build and install Horovod with "
                                     "`python -m dssync.launch.build_horovod`")
                cmd = [horovodrun, "-np", str(world), "-H", f"localhost:{world}", "--gloo", *cmd]
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=args.timeout * (len(size_sweep(args.sizes, args.factor)) + 2))
            if proc.returncode != 0 or not os.path.exists(out):
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
                raise ValueError(f"--backend {backend} job failed (exit {proc.returncode}):\n{tail}")
            records[backend] = json.loads(Path(out).read_text())
            print(proc.stdout.strip(), flush=True)
    top = {b: r["rows"][-1] for b, r in records.items()}
    print("# busbw at the largest size: " + ", ".join(
        f"{b} {row['busbw_gbs']:.3f} GB/s ({row['size']} B)" for b, row in top.items()))
    if args.json:
        write_json(args.json, {"backends": records})
    return 0


def _eval_and_warmup(args: argparse.Namespace) -> tuple[int, int]:
    """--eval-every and --warmup-steps, defaulting to 2 % and 5 % of --steps."""
    eval_every = args.eval_every or max(1, args.steps // 50)
    return eval_every, args.warmup_steps if args.warmup_steps is not None else args.steps // 20


def run_compare(args: argparse.Namespace) -> int:

    from rich.console import Console

    from dssync.bench.compare import (
        compare,
        loss_rows,
        loss_table,
        markdown_table,
        parse_variant,
        plot,
        seed_rows,
        seed_table,
        summarize,
    )
    from dssync.commands.train import strategy_settings
    from dssync.strategies import get_strategy

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:  # unknown names and bad settings fail here, before any network is built
        name, settings = parse_variant(s)
        get_strategy(name).Config(**strategy_settings(name, settings))
    scenarios = [s.strip() for s in args.scenario.split(",") if s.strip()]
    from dssync.launch.emulate import parse_cpu_limit, parse_episode

    cpu = dict(parse_cpu_limit(text) for text in args.cpu)
    episodes = [parse_episode(text) for text in args.episode]
    eval_every, warmup = _eval_and_warmup(args)
    train_args = ["--lr", repr(args.lr), "--lr-schedule", args.lr_schedule, "--warmup-steps", str(warmup),
                  "--batch-size", str(args.batch_size)]
    reference = None if args.no_stop or args.target_accuracy is not None else args.reference
    if reference is not None and reference not in strategies:
        raise ValueError(f"--reference {reference} must be one of --strategies (or give --target-accuracy)")
    console = Console(stderr=True)

    def report(r: dict) -> None:
        head = f"{r['scenario']} {r['strategy']} seed {r['repeat']}: "
        if "error" in r:
            console.print(head + f"FAILED: {r['error']}", markup=False, highlight=False)
            return
        tta = r.get("time_to_target_s")
        console.print(head + f"{r.get('steps_run', r['steps'])} iters, wall {r['wall_s']:.1f} s "
                      f"({r['wall_s'] * 1e3 / r.get('steps_run', r['steps']):.1f} ms/iter), best accuracy "
                      f"{r['best_accuracy']:.4f}" + ("" if tta is None else f", target reached at {tta:.1f} s"),
                      markup=False, highlight=False)

    records = compare(scenarios, strategies, task=args.task, steps=args.steps, repeats=args.repeats,
                      eval_every=eval_every, adjust_every=args.adjust_every, model_mb=args.model_mb, cpu=cpu,
                      episodes=episodes, train_args=train_args, reference=reference,
                      target=args.target_accuracy, stop=not args.no_stop, progress=report)
    rows = summarize(records, reference=args.reference)
    table = markdown_table(rows, reference=args.reference)
    if args.repeats > 1:
        table += (f"\n\nBest accuracy per seed, and paired with {args.reference}'s on the same seed "
                  "(†: stopped at the target, so no higher than the target):\n\n") + \
            seed_table(seed_rows(records, reference=args.reference), reference=args.reference)
    if args.target_loss is not None:
        table += "\n\n" + loss_table(loss_rows(records, args.target_loss))
    _report(table, records, args)
    if args.plot:
        plot(records, rows, args.plot, reference=args.reference)
    return 0


def _report(table: str, records: object, args: argparse.Namespace) -> None:
    """Print the markdown table; write the records (--json) and the table (--markdown)."""
    from pathlib import Path

    print(table)
    if args.json:
        write_json(args.json, records)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


def run_ensemble(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dssync.bench.ensemble import compare_ensembles, summarize_ensembles
    from dssync.commands._common import schedule_from_args
    from dssync.train import TrainConfig

    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    topology = topology_from_args(args)
    eval_every, warmup = _eval_and_warmup(args)
    base = TrainConfig(strategy="ds-sync", task=args.task, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                       lr_schedule=args.lr_schedule, eval_every=eval_every, warmup_steps=warmup,
                       topology=topology, num_racks=args.racks or 2, schedule=schedule_from_args(args),
                       timeout_s=args.timeout)
    nproc = topology.world_size if topology is not None else args.nproc
    console = Console(stderr=True)
    records = compare_ensembles(base, rules, range(args.seeds), nproc=nproc, progress=lambda r: console.print(
        f"seed {r['seed']} {r['rule']}: final accuracy {r['final_accuracy']:.4f}, best {r['best_accuracy']:.4f}",
        markup=False, highlight=False))
    lines = ["| rule | evaluations | lower than plain | higher | worst pp | mean pp | mean loss diff | "
             "at the end, pp (per seed) | final acc. | best acc. |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summarize_ensembles(records):
        lines.append(f"| {r['rule']} | {r['evaluations']} | {r['lower']} | {r['higher']} | {r['worst_pp']:+.2f} | "
                     f"{r['mean_pp']:+.3f} | {r['mean_loss_diff']:+.4f} | "
                     f"{', '.join(f'{d:+.2f}' for d in r['final_pp'])} | {r['final_accuracy']:.4f} | "
                     f"{r['best_accuracy']:.4f} |")
    _report("\n".join(lines), records, args)
    return 0


def run_simcheck(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rich.console import Console

    from dssync.bench.simcheck import markdown_table, predict, simcheck

    if args.source:
        try:
            record = json.loads(Path(args.source).read_text())
            record["rows"] = predict(record)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{args.source} is not a simcheck record: {exc}") from None
    else:
        console = Console(stderr=True)

        def say(stage: str, r: dict) -> None:
            if stage == "calibration":  # the others: one job's row
                console.print(f"calibration: alpha {1e6 * r['alpha_s']:.0f} us, efficiency {r['efficiency']:.3f}")
            else:
                console.print(f"{stage} {r['scenario']} {r['strategy']} seed {r['seed']}: wall {r['wall_ms']:.1f} "
                              f"ms/iter, per-rank comm {r['comm_ms']:.1f}")
        record = simcheck([s.strip() for s in args.scenario.split(",") if s.strip()],
                          [s.strip() for s in args.strategies.split(",") if s.strip()],
                          seeds=range(args.seeds), model_mb=args.model_mb, steps=args.steps, warmup=args.warmup,
                          rate_scale=args.rate_scale, progress=say,
                          save=(lambda r: write_json(args.json, r)) if args.json else None)
    _report(markdown_table(record), record, args)
    return 0


def run_predict(args: argparse.Namespace) -> int:
    import json
    import statistics
    from pathlib import Path

    from rich.console import Console

    from dssync.bench.predict import iterations_factors, markdown_table, plot, predict_tta
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
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in strategies if s not in SIMCHECK_STRATEGIES]
    if bad or "ddp" not in strategies:
        raise ValueError(f"--strategies must include ddp (the reference) and only {', '.join(SIMCHECK_STRATEGIES)}")
    console = Console(stderr=True)
    with console.status("simulating") as status:
        rows = predict_tta(racks=args.racks, workers_per_rack=args.workers_per_rack, fractions=fractions,
                           strategies=strategies, calibration=calibration, factors=factors, size_bytes=size_bytes,
                           compute_ms=compute_ms, nic_bps=parse_rate(nic) / 8,
                           uplink_bps=parse_rate(uplink) / 8, iterations=args.iterations,
                           progress=lambda r: status.update(f"{r['workers']} workers, {r['strategy']}"))
    record = {"simcheck": args.simcheck, "compare": args.compare, "calibration": calibration,
              "compute_ms": compute_ms, "size_bytes": size_bytes, "nic": nic, "uplink": uplink,
              "iterations": args.iterations, "factors": factors, "rows": rows}
    _report(markdown_table(rows), record, args)
    if args.plot:
        plot(rows, args.plot)
    return 0


def run_averaging(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dssync.bench.averaging import averaging_rank

    if args.trials < 1 or args.warmup < 0:
        raise ValueError("--trials must be at least 1 and --warmup at least 0")
    nproc = sum(args.rack_sizes)
    record = run_ranks(averaging_rank, args.rack_sizes, args.size_mb, args.trials, args.warmup,
                       nproc=nproc, timeout_s=args.timeout)[0]
    if record is None:
        return 0
    table = Table(title=f"group averaging, {nproc} ranks in racks {args.rack_sizes}, "
                  f"{len(record['samples_ms']['bare'])} rounds")
    for col in ("size (B)", "ds-sync avg (ms)", "bare all_reduce (ms)", "ratio"):
        table.add_column(col, justify="right")
    table.add_row(str(record["bytes"]), f"{record['ds_sync_ms']:.2f}",
                  f"{record['bare_allreduce_ms']:.2f}", f"{record['ratio']:.3f}")
    Console().print(table)
    if args.json:
        write_json(args.json, record)
    return 0


def run_probe_backends(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dssync.bench.probe_backends import compare_backends

    slow = {}
    for spec in args.slow_nic if args.slow_nic is not None else ["1:600mbit"]:
        rank, _, rate = spec.partition(":")
        if not rank.isdigit() or not rate:
            raise ValueError(f"--slow-nic wants RANK:RATE such as 1:600mbit, got {spec!r}")
        slow[int(rank)] = rate
    record = compare_backends(args.rack_sizes, nic=args.nic, uplink=args.uplink, slow_nics=slow,
                              seconds=args.seconds, isolated=not args.concurrent)
    table = Table(title=f"probe backends, racks {args.rack_sizes}, NIC {args.nic}, uplink {args.uplink}, "
                  f"slow NICs {slow or 'none'}, {'concurrent rounds' if args.concurrent else 'one pair at a time'}")
    for col in ("src", "dst", "builtin (Gbit/s)", "iperf3 (Gbit/s)", "builtin/iperf3 - 1"):
        table.add_column(col, justify="right")
    for row in record["rows"]:
        diff = "n/a" if row["diff"] is None else f"{row['diff']:+.1%}"
        table.add_row(str(row["src"]), str(row["dst"]), f"{row['builtin_gbps']:.3f}",
                      f"{row['iperf3_gbps']:.3f}", diff)
    console = Console()
    console.print(table)
    console.print(f"max |diff| {record['max_abs_diff']:.1%}, median {record['median_abs_diff']:.1%} over "
                  f"{len(record['rows'])} directed pairs; probe time builtin "
                  f"{record['probe_seconds']['builtin']:.1f} s, iperf3 {record['probe_seconds']['iperf3']:.1f} s")
    if args.json:
        write_json(args.json, record)
    return 0


def run_overlap(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dssync.bench.overlap import compare_overlap
    from dssync.launch import emulate

    console = Console(stderr=True)
    flows = [emulate.parse_flow(f) for f in args.flows]
    record = compare_overlap(
        args.rack_sizes, nic=args.nic, uplink=args.uplink, flows=flows, task=args.task, steps=args.steps,
        batch_size=args.batch_size, bucket_mb=args.bucket_mb, reps=args.reps,
        progress=lambda r: console.print(f"{r['mode']:>10} rep {r['rep']}: {r['ms_per_iter']:.1f} ms/iter, "
                                         f"accuracy {r['final_accuracy']:.4f}"))
    table = Table(title=f"ds-sync overlapped vs after-step: {args.task}, batch {args.batch_size}, "
                  f"{args.steps} steps, racks {args.rack_sizes}, NIC {args.nic}, uplink {args.uplink}, "
                  f"flows {record['network']['flows'] or 'none'}; median of {args.reps}")
    for col in ("mode", "ms/iter", "final accuracy"):
        table.add_column(col, justify="right")
    for mode in ("after-step", "overlap"):
        table.add_row(mode, f"{record['median_ms_per_iter'][mode]:.1f}",
                      f"{record['median_final_accuracy'][mode]:.4f}")
    Console().print(table)
    Console().print(f"overlap / after-step wall time per iteration: {record['ratio']:.3f}; "
                    f"accuracy difference {record['accuracy_diff_pp']:+.2f} pp")
    if args.json:
        write_json(args.json, record)
    return 0


def run_probe_layouts(args: argparse.Namespace) -> int:
    import shlex

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from dssync.bench.probe_layouts import generate, run_layouts

    layouts = generate(args.count, args.seed, max_workers=args.max_workers)
    console = Console()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("probing layouts", total=len(layouts))
        result = run_layouts(layouts, probe_args=shlex.split(args.probe_args),
                             report=lambda row: progress.advance(task))
    table = Table(title=f"dssync probe on {len(layouts)} random layouts (seed {args.seed})")
    for col in ("#", "layout", "racks", "uplinks found/true", "NICs found/true", "unplaced", "probe s"):
        table.add_column(col, justify="right" if col in ("#", "probe s") else "left")
    for k, row in enumerate(result["rows"]):
        racks = "exact" if row["racks_exact"] else (
            ("equivalent" if row["racks_equivalent"] else "WRONG") + f" {row['racks_found']}"
            + (" (confident)" if row["wrong_with_confidence"] else " (unsure)"))
        table.add_row(str(k), row["layout"], racks, f"{row['uplinks_found']}/{row['uplinks_true']}",
                      f"{row['nics_found']}/{row['nics_true']}", str(row["unplaced"] or "-"),
                      f"{row['probe_seconds']:.1f}")
    console.print(table)
    s = result["summary"]
    console.print(f"racks exact {s['racks_exact']}/{s['layouts']} (equivalent: no flow pattern tells them apart, "
                  f"{s['racks_equivalent']}/{s['layouts']}), flags exact {s['flags_exact']}/{s['layouts']} "
                  f"(on equivalent racks, the contended links' workers: {s['flags_equivalent']}/{s['layouts']}), "
                  f"wrong racks reported with confidence {s['wrong_with_confidence']} (of them telling apart "
                  f"{s['telling_wrong_with_confidence']}), flag precision "
                  f"{s['flag_precision']:.3f} recall {s['flag_recall']:.3f}, probe time median "
                  f"{s['probe_seconds_median']:.1f} s max {s['probe_seconds_max']:.1f} s")
    if args.json:
        command = f"dssync bench probe-layouts --count {args.count} --seed {args.seed} --max-workers {args.max_workers}"
        write_json(args.json, {"command": command, "probe_args": args.probe_args, **result})
    return 0
