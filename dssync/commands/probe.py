"""``dssync probe``: measure latency, bandwidth and contention between the ranks; write topology.json."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dssync.commands._common import add_racks_from_option, parse_rack_sizes
from dssync.launch import from_environ, run_ranks
from dssync.probing.probe import BACKENDS, ProbeConfig, host_name, probe_rank
from dssync.topology import Topology

__all__ = ["add_parser", "confidence_lines", "plot_topology", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="measure the network between the ranks, write topology.json",
                       description="Measure pairwise latency and bandwidth in rounds of disjoint pairs, "
                       "infer the racks, measure each rack's uplink with all its members sending at once, "
                       "and write topology.json. Without a launcher, spawns --nproc local ranks; under "
                       "one (torchrun, mpirun, horovodrun, dssync emulate run) runs one rank, over torch.distributed "
                       "when the launcher sets MASTER_ADDR/MASTER_PORT, else over its own library (MPI, "
                       "Horovod).")
    p.add_argument("--backend", default="builtin", choices=BACKENDS,
                   help="bandwidth between pairs: gloo messages (builtin, default) or iperf3 flows")
    p.add_argument("--out", required=True, metavar="FILE", help="where to write topology.json")
    p.add_argument("--plot", metavar="PNG", help="also draw the bandwidth matrix with the racks outlined")
    p.add_argument("--nproc", type=int, default=None,
                   help="local ranks to spawn (default 2 without a launcher; omit under one)")
    p.add_argument("--message-mb", type=float, default=0.5,
                   help="bandwidth message size in MiB (default %(default)s)")
    p.add_argument("--bandwidth-seconds", type=float, default=0.25,
                   help="seconds each timed stream lasts: a direction of a pair (builtin backend) "
                   "and each uplink phase (default %(default)s)")
    p.add_argument("--latency-reps", type=int, default=20,
                   help="timed round trips per direction, at most (default %(default)s)")
    p.add_argument("--latency-seconds", type=float, default=0.1,
                   help="no more round trips after this long, per direction (default %(default)s)")
    p.add_argument("--iperf-seconds", type=int, default=1, help="iperf3 -t per direction (iperf3 backend)")
    p.add_argument("--iperf-omit", type=int, default=0,
                   help="iperf3 -O: seconds at the start of each test left out (TCP slow start)")
    p.add_argument("--isolated", action="store_true",
                   help="measure one pair at a time (N(N-1)/2 rounds instead of N-1): what each path "
                   "gives a single flow, with nothing shared; for comparing backends")
    p.add_argument("--rack-sizes", type=parse_rack_sizes, metavar="A,B,...",
                   help="known racks of consecutive ranks, instead of inferring them (the uplink "
                   "phase still runs)")
    add_racks_from_option(p, "; not with --rack-sizes. See docs/probing.md")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any single exchange may wait")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.message_mb <= 0:
        raise ValueError(f"--message-mb must be positive, got {args.message_mb}")
    cfg = ProbeConfig(message_bytes=max(1, int(args.message_mb * 2**20)),
                      bandwidth_seconds=args.bandwidth_seconds,
                      latency_seconds=args.latency_seconds, latency_reps=args.latency_reps,
                      timeout_s=args.timeout, iperf_seconds=args.iperf_seconds, iperf_omit=args.iperf_omit,
                      isolated=args.isolated)
    if args.plot and Path(args.plot).suffix.lower() != ".png":
        raise ValueError(f"--plot writes a PNG; give a file name ending in .png, got {args.plot!r}")
    for target in filter(None, (args.out, args.plot)):
        if not Path(target).resolve().parent.is_dir():
            raise ValueError(f"cannot write {target}: its folder does not exist; create it first")
    launched = from_environ()
    nproc = args.nproc if args.nproc is not None or launched is not None else 2
    racks = None
    if args.rack_sizes:
        racks = [rack for rack, size in enumerate(args.rack_sizes) for _ in range(size)]
        world_size = launched.world_size if launched is not None else nproc
        if len(racks) != world_size:
            raise ValueError(f"--rack-sizes {','.join(map(str, args.rack_sizes))} holds {len(racks)} "
                             f"ranks but the world has {world_size}; make them add up")
    # Under mpirun or horovodrun without a torch rendezvous, the probe runs over the
    # launcher's own library: `mpirun -np 4 dssync probe` works as typed.
    library = launched.library() if launched is not None else "torch"
    if args.racks_from is not None:  # a host the prior cannot name fails before any measuring
        if args.rack_sizes:
            raise ValueError("give --rack-sizes (racks taken as they are) or --racks-from (racks the "
                             "measurement checks), not both")
        args.racks_from.key(host_name(), launched.rank if launched is not None else 0)
    # base_port (its default, 5301) and the prior by position: run_ranks passes no keywords,
    # and a partial would hide probe_rank's module from the spawned ranks' preload
    results = run_ranks(probe_rank, cfg, args.backend, racks, 5301, args.racks_from, nproc=nproc,
                        timeout_s=args.timeout, backend=library)
    if launched is not None and launched.rank != 0:
        return 0  # rank 0 writes the file, once
    result = results[0]
    # The wall time runs from the process group being ready to the file being written; the
    # plot comes after, it is no part of probing.
    seconds = round(time.time() - result.started_at, 3)
    topology = result.to_topology({"backend": args.backend, "library": library, "seconds": seconds,
                                   "message_bytes": cfg.message_bytes, "rounds": result.rounds})
    topology.save(args.out)
    if args.plot:
        plot_topology(topology, args.plot)
    uplinks = [u["rack"] for u in result.contention["uplinks"]]
    nics = [n["rank"] for n in result.contention["nics"]]
    print(f"wrote {args.out}: {topology.world_size} ranks, {topology.num_racks} racks "
          f"{[len(r) for r in topology.racks()]}, slow uplinks {uplinks or 'none'}, "
          f"slow NICs {nics or 'none'}, {seconds:.1f} s")
    for line in confidence_lines(result.confidence or {}):
        print(line)
    return 0


def confidence_lines(confidence: dict) -> list[str]:
    """What the probe is unsure of, and what to do about it (nothing when it is sure)."""
    lines = []
    # with --racks-from, the prior decided the workers of unsure boundaries (weigh_prior said so)
    for b in [] if confidence.get("racks_from") else confidence.get("boundaries", []):
        if not b["confident"]:
            lines.append(f"racks {b['racks'][0]} and {b['racks'][1]} are told apart with separation "
                         f"{b['separation']} (below {confidence.get('threshold')})")
    unsure = confidence.get("unsure", [])
    unplaced = confidence.get("unplaced", [])
    if unplaced:
        lines.append(f"could not place workers {unplaced}: every flow of theirs is held back by their own NIC "
                     "and no measurement showed which uplink they share; each is written as a rack of its own")
    unsettled = confidence.get("unsettled", [])
    if unsettled:
        lines.append(f"workers {unsettled} change racks when one pass over the pairs is left out "
                     "(a busy host's measurements disagree): their racks are a guess")
    if confidence.get("one_rack_guess"):
        lines.append("the workers are not one uniform rack, yet no split of them into racks was clean: "
                     "written as one rack")
    elif close := sorted(set(unsure) - set(unsettled)):
        lines.append(f"workers {close} sit almost as close to another rack as to their own")
    # the answers the measurement left standing beside the one written (telling.standing_answers)
    standing = confidence.get("alternatives") or []
    lines += [alt["says"] for alt in standing[:4]]
    if len(standing) > 4:
        lines.append(f"and {len(standing) - 4} more such answers (confidence.alternatives in the file)")
    flags = confidence.get("flags_unsure") or {}
    if flags.get("uplinks"):
        lines.append(f"the uplinks of racks {flags['uplinks']} carried close to the slow-link rule, or less than "
                     "their NICs allow without standing out from the other racks: whether they are slow is a guess")
    if flags.get("nics"):
        lines.append(f"the NICs of workers {flags['nics']} carried close to the slow-link rule: "
                     "whether they are slow is a guess")
    if lines:
        lines.append("to settle it: give the racks you know (--racks-from slurm|hostnames:REGEX, or "
                     "--rack-sizes), or measure longer (--bandwidth-seconds 1)")
    return [f"warning: {line}" for line in lines]


def plot_topology(topology: Topology, path: str) -> None:
    """Heatmap of ``bandwidth_gbps`` (row sends to column), each rack's block outlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if topology.bandwidth_gbps is None:
        raise ValueError("this topology has no bandwidth matrix to plot; probe it first")
    n = topology.world_size
    fig, ax = plt.subplots(figsize=(1.2 + 0.5 * n, 0.8 + 0.5 * n))
    image = ax.imshow(topology.bandwidth_gbps, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="bandwidth (Gbit/s)")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for rack, members in enumerate(topology.racks()):
        # Racks usually hold consecutive ranks (one block); otherwise outline each member pair.
        if members == list(range(members[0], members[-1] + 1)):
            cells = [(members[0], members[0], len(members))]
        else:
            cells = [(i, j, 1) for i in members for j in members]
        for i, j, size in cells:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), size, size, fill=False, lw=2,
                                   edgecolor=colors[rack % len(colors)]))
    ax.set_xlabel("receiver rank")
    ax.set_ylabel("sender rank")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_title(f"bandwidth, {topology.num_racks} rack(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
