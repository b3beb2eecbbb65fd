"""``dssync bench allreduce``: allreduce time, algbw and busbw per size (nccl-tests style)."""

from __future__ import annotations

import argparse

from dssync._jsonfile import write_json
from dssync.bench.provenance import stamp
from dssync.commands._common import (
    add_topology_options,
    non_negative_int,
    positive_float,
    positive_int,
    topology_from_args,
)
from dssync.commands.bench._shared import outputs_checked
from dssync.launch import from_environ, run_ranks

__all__ = ["add_parser", "run_allreduce"]


def add_parser(bsub: argparse._SubParsersAction) -> None:
    """Register ``bench allreduce`` on ``dssync bench``'s subparsers."""
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
    r.set_defaults(run=outputs_checked(run_allreduce))


def run_allreduce(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dssync.bench.allreduce import allreduce_rank, format_table, size_sweep
    from dssync.launch.spawn import BACKENDS
    from dssync.planning.schedule import Schedule
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
        write_json(args.json, stamp(record, args.provenance))
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
        write_json(args.json, stamp({"backends": records}, args.provenance))
    return 0
