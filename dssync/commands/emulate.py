"""``dssync emulate``: an emulated multi-rack cluster on this machine (needs root)."""

from __future__ import annotations

import argparse
import sys

from dssync.commands._common import parse_rack_sizes, rack_sizes_from_args

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("emulate", help="an emulated multi-rack network of namespaces and tc",
                       description="Build, load, use and remove an emulated multi-rack cluster: a "
                       "network namespace per worker, rack bridges, shaped uplinks to a spine.")
    esub = p.add_subparsers(dest="emulate", required=True, metavar="ACTION")

    u = esub.add_parser("up", help="build the cluster")
    layout = u.add_mutually_exclusive_group(required=True)
    from dssync.launch.emulate import SCENARIOS

    layout.add_argument("--scenario", choices=sorted(SCENARIOS))
    layout.add_argument("--rack-sizes", type=parse_rack_sizes, metavar="A,B,...")
    layout.add_argument("--racks", type=int, metavar="R", help="with --workers-per-rack")
    u.add_argument("--workers-per-rack", type=int, metavar="W")
    u.add_argument("--nic", default=None, help="worker NIC rate, both directions (default 1gbit)")
    u.add_argument("--uplink", default=None, help="rack uplink rate, both directions (default 1gbit)")
    u.add_argument("--latency", default=None,
                   help="added per-link delay; needs the kernel's sch_netem (see README)")
    u.set_defaults(run=_up)

    c = esub.add_parser("contend", help="lower a rate or start background flows")
    c.add_argument("--rack", type=int)
    c.add_argument("--uplink", metavar="RATE", help="new uplink rate of --rack")
    c.add_argument("--rank", type=int)
    c.add_argument("--nic", metavar="RATE", help="new NIC rate of --rank")
    c.add_argument("--flows", nargs="+", default=[], metavar="FLOW",
                   help="background iperf3 flows: rack:I (across rack I's uplink), nic:I (through "
                   "worker I's NIC only), rank:I "
                   "(through worker I's NIC and its rack's uplink); or cpu:I, a busy loop on worker "
                   "I's host (other work on its CPU, no traffic)")
    c.add_argument("--streams", type=int, default=None,
                   help="TCP streams per background flow (default 8: traffic of many tasks; 2 leaves "
                   "a worker about a third of a shared NIC)")
    c.add_argument("--cpu", nargs="+", default=[], metavar="RANK:CORES",
                   help="cap a worker's processes at CORES cores (e.g. 4:0.25), a compute straggler; "
                   "applies to what `emulate run` starts from then on")
    c.add_argument("--clear", action="store_true", help="stop all flows, restore all rates first")
    c.set_defaults(run=_contend)

    r = esub.add_parser("run", help="run a command once per worker, in its namespace")
    r.add_argument("--timeout", type=float, default=3600.0, help="kill every copy after this (s)")
    r.add_argument("--episode", action="append", default=[], metavar="SPEC",
                   help="a transient straggler, RANK:KIND=VALUE@START+DURATION (seconds after the job "
                   "starts): 1:cpu=0.1@5+20 caps worker 1 at 0.1 cores, 3:nic=100mbit@0+30 shapes worker "
                   "3's NIC, 2:delay=30ms@10+60 delays it (needs sch_netem); repeatable")
    r.add_argument("--launcher", default="direct", choices=("direct", "mpirun", "horovodrun"),
                   help="direct (default): one copy per worker with torchrun's variables; mpirun or "
                   "horovodrun (--gloo): that launcher starts the job from the spine's host and reaches "
                   "each worker through its remote shell, as on a real cluster")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    r.set_defaults(run=_run)

    d = esub.add_parser("down", help="remove every namespace, flow and qdisc of the cluster")
    d.set_defaults(run=_down)

    for action in (u, c, r, d):
        action.add_argument("--name", default="dss", help="cluster name (namespace prefix)")


def _up(args: argparse.Namespace) -> int:
    from dssync.launch import emulate

    if args.latency is not None:
        raise ValueError("--latency needs the sch_netem qdisc, which this dssync does not use yet; "
                         "leave it out (racks differ by their shaped uplinks)")
    spec: dict = {"flows": []}
    if args.scenario:
        spec = emulate.SCENARIOS[args.scenario]
        sizes = spec["rack_sizes"]
        nic, uplink = args.nic or spec["nic"], args.uplink or spec["uplink"]
    else:
        sizes = rack_sizes_from_args(args)
        nic, uplink = args.nic or "1gbit", args.uplink or "1gbit"
    emulate.parse_rate(nic), emulate.parse_rate(uplink)  # fail on a bad rate before building
    cluster = emulate.up(sizes, nic=nic, uplink=uplink, name=args.name)
    flows, slow, slow_up = spec["flows"], spec.get("nics", {}), spec.get("uplinks", {})
    emulate.contend_scenario(spec, name=args.name)
    print(f"emulated cluster {args.name!r} up: racks {sizes}, NIC {nic}, uplink {uplink}"
          + (f", NICs rate-limited {slow}" if slow else "") + (f", uplinks rate-limited {slow_up}" if slow_up else "")
          + (f", background flows {[f'{k}:{i}' for k, i in flows]}" if flows else "")
          + f"; workers {cluster.worker_addr(0)}..{cluster.worker_addr(cluster.world_size - 1)}")
    return 0


def _contend(args: argparse.Namespace) -> int:
    from dssync.launch import emulate

    flows = [emulate.parse_flow(f) for f in args.flows]
    cpu = dict(emulate.parse_cpu_limit(text) for text in args.cpu)
    if not (args.clear or args.uplink or args.nic or flows or cpu):
        raise ValueError("say what to change: --rack I --uplink RATE, --rank I --nic RATE, "
                         "--flows rack:I|rank:I|nic:I|cpu:I, --cpu RANK:CORES, or --clear")
    streams = emulate.FLOW_STREAMS if args.streams is None else args.streams
    c = emulate.contend(name=args.name, rack=args.rack, uplink=args.uplink, rank=args.rank,
                        nic=args.nic, flows=flows, streams=streams, cpu=cpu, clear=args.clear)
    flows_now = [f"{f['kind']}:{f['index']}" + ("" if f["kind"] == "cpu" else f" x{f.get('streams', '?')}")
                 for f in c.flows]
    print(f"contention on {args.name!r}: uplinks {c.uplink_override or 'nominal'}, "
          f"NICs {c.nic_override or 'nominal'}, flows {flows_now}, CPU limits {c.cpu_limit or 'none'}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from dssync.launch import emulate

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    episodes = [emulate.parse_episode(text) for text in args.episode]
    return emulate.run(cmd, name=args.name, timeout_s=args.timeout, out=sys.stdout, episodes=episodes,
                       launcher=args.launcher)


def _down(args: argparse.Namespace) -> int:
    from dssync.launch import emulate

    removed = emulate.down(args.name)
    print(f"removed {len(removed)} namespaces of {args.name!r}")
    return 0
