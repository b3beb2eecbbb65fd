"""The strategies' patterns on SimGrid, against the emulated cluster's measurements.

``python -m dssync.bench.simgrid_check --record bench/results/simcheck.json --json OUT``
replays every (scenario, strategy) job of a ``dssync bench simcheck`` record on SimGrid, the
flow-level simulator of distributed applications, and reports simulated ÷ measured beside
``dssync simulate``'s own model. It answers one question: does an asynchronous flow model,
in which a member leaves a collective when its own part is done and the bytes it sent keep
sharing their links with what it does next, predict the contended scenarios better than the
iteration model does?

How a job is built (all from the record and ``dssync.patterns``, nothing fitted here):

- the emulated cluster as a SimGrid platform: one host per worker, each NIC two links (out,
  in) at the scenario's rate, each rack uplink two links, a host per rack for another job's
  flows and a sink on the spine, routes as the veths run;
- a background flow is ``FLOW_STREAMS`` endless transfers from its source to the sink;
- each rank runs its strategy's pattern iteration by iteration: its compute time (the
  record's CPU-share row), then each ``Op`` as gloo runs it, as point-to-point transfers:
  a ring allreduce is ``2(n-1)`` steps in which a rank posts its send (the mailbox's
  receiver is set, so the bytes go at once, as into a socket buffer) and waits for its
  receive, and waits for its previous send before it posts the next (the socket holds one
  message); a reduce is the ring's first half and every member's share sent to the root; a
  broadcast is a binomial tree; a gossip step sends one way and receives from the other.
  A rank does not wait for its last send of an operation, so bytes still in flight when it
  moves on share their links with its next transfers.

SimGrid's network model is its default (``LV08``: max-min sharing weighted by round-trip
time, TCP's window bound); ``--model`` picks another. SimGrid is Debian's
``python3-simgrid`` (``apt-get install python3-simgrid``); this module adds its path when the
virtual environment lacks it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dssync.patterns import Op, pattern, read_spec

__all__ = ["platform_xml", "simulate_job"]

DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"
NIC_LATENCY_S = 10e-6
UPLINK_LATENCY_S = 5e-6
BIG = 1e15  # bytes of an endless background transfer


def _simgrid() -> Any:
    try:
        import simgrid
    except ImportError:
        sys.path.append(DEBIAN_DIST_PACKAGES)
        try:
            import simgrid
        except ImportError:
            raise SystemExit("SimGrid's Python bindings are missing: apt-get install python3-simgrid") from None
    return simgrid


def platform_xml(rack_sizes: list[int], nic_bps: float, uplink_bps: float, slow_nics: dict[int, float],
                 uplink_latency: dict[int, float]) -> str:
    """The emulated cluster as a SimGrid platform (``bps``: bytes/s; ``uplink_latency``: extra
    seconds on a rack's outgoing uplink, the queue another job keeps full there)."""
    n = sum(rack_sizes)
    rack = [r for r, size in enumerate(rack_sizes) for _ in range(size)]
    lines = ['<?xml version="1.0"?>', '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
             '<platform version="4.1">', '<zone id="cluster" routing="Full">']
    hosts = [f"w{i}" for i in range(n)] + [f"bg{r}" for r in range(len(rack_sizes))] + ["sink"]
    lines += [f'<host id="{h}" speed="1Gf"/>' for h in hosts]
    for h in hosts:
        bw = slow_nics.get(int(h[1:]), nic_bps) if h.startswith("w") else nic_bps
        for d in ("out", "in"):
            lines.append(f'<link id="{h}-{d}" bandwidth="{bw}Bps" latency="{NIC_LATENCY_S}s"/>')
    for r in range(len(rack_sizes)):
        lines.append(f'<link id="up{r}-out" bandwidth="{uplink_bps}Bps" '
                     f'latency="{UPLINK_LATENCY_S + uplink_latency.get(r, 0.0)}s"/>')
        lines.append(f'<link id="up{r}-in" bandwidth="{uplink_bps}Bps" latency="{UPLINK_LATENCY_S}s"/>')

    def rack_of(h: str) -> int | None:
        return rack[int(h[1:])] if h.startswith("w") else int(h[2:]) if h.startswith("bg") else None

    for a in hosts:
        for b in hosts:
            if a == b:
                continue
            ra, rb = rack_of(a), rack_of(b)
            path = [f"{a}-out"]
            if ra != rb:
                path += ([f"up{ra}-out"] if ra is not None else []) + ([f"up{rb}-in"] if rb is not None else [])
            path.append(f"{b}-in")
            links = "".join(f'<link_ctn id="{x}"/>' for x in path)
            lines.append(f'<route src="{a}" dst="{b}" symmetrical="NO">{links}</route>')
    lines += ["</zone>", "</platform>"]
    return "\n".join(lines)


def _transfers(op: Op, rank: int) -> list[tuple[str, int, float]]:
    """``rank``'s part of ``op``, in gloo's order: ``("send"|"recv", peer, bytes)``."""
    group = next((g for g in op.groups if rank in g), None) if op.kind != "send" else None
    out: list[tuple[str, int, float]] = []
    if op.kind == "send":
        for src, dst in op.groups:
            if src == rank:
                out.append(("send", dst, op.nbytes))
        for src, dst in op.groups:
            if dst == rank:
                out.append(("recv", src, op.nbytes))
        return out
    if group is None or len(group) == 1:
        return out
    n, i = len(group), group.index(rank)
    nxt, prv, chunk = group[(i + 1) % n], group[(i - 1) % n], op.nbytes / n
    if op.kind == "allreduce":
        for _ in range(2 * (n - 1)):
            out += [("send", nxt, chunk), ("recv", prv, chunk)]
    elif op.kind == "reduce":
        for _ in range(n - 1):
            out += [("send", nxt, chunk), ("recv", prv, chunk)]
        out += [("recv", g, chunk) for g in group[1:]] if i == 0 else [("send", group[0], chunk)]
    elif op.kind == "broadcast":  # binomial tree over group positions, the root first
        dim = (n - 1).bit_length()
        low = i.bit_length()
        if i:
            out.append(("recv", group[i - (1 << (low - 1))], op.nbytes))
        out += [("send", group[i + (1 << k)], op.nbytes) for k in range(low, dim) if i + (1 << k) < n]
    else:
        raise ValueError(f"no SimGrid replay of a {op.kind!r} collective")
    return out


def simulate_job(**job: Any) -> list[list[float]]:
    """``_simulate_job`` in a child process: SimGrid runs one simulation per process."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(_simulate_job, (), job)


def _simulate_job(*, rack_sizes: list[int], nic_bps: float, uplink_bps: float, strategy: str, nbytes: float,
                 steps: int, compute_s: float, background: dict[int, int], slow_nics: dict[int, float],
                 uplink_latency: dict[int, float], model: str = "LV08", cfg: tuple[str, ...] = ()) -> list[list[float]]:
    """Per rank, the seconds each iteration spent communicating (waits included), and per
    iteration rank 0's wall seconds, as the harness measures them: ``(comm_by_rank, wall)``."""
    sg = _simgrid()
    n = sum(rack_sizes)
    racks, start = [], 0
    for size in rack_sizes:
        racks.append(list(range(start, start + size)))
        start += size
    period = ()
    if read_spec(strategy)[0] == "ds-sync":
        from dssync.bench.simulate import Network, planned_rounds

        period = planned_rounds(Network(tuple(rack_sizes), uplink_out_streams=dict(background),
                                        slow_nics=dict(slow_nics)))
    pat = pattern(strategy, racks, nbytes, steps=steps, plan_period=period)
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "platform.xml"
        xml.write_text(platform_xml(rack_sizes, nic_bps, uplink_bps, slow_nics, uplink_latency))
        e = sg.Engine(["simgrid_check", f"--cfg=network/model:{model}", *(f"--cfg={c}" for c in cfg),
                       "--log=root.thres:critical"])
        e.load_platform(str(xml))
        comm = [[0.0] * steps for _ in range(n)]
        wall = [0.0] * steps

        def box(src: int, dst: int) -> Any:
            return sg.Mailbox.by_name(f"{src}>{dst}")

        def worker(rank: int) -> None:
            for src in range(n):  # bytes sent to this rank go at once, as into its socket
                if src != rank:
                    box(src, rank).set_receiver(sg.Actor.self())
            last = None  # the send still in flight: the socket holds one message
            for t in range(steps):
                t0 = e.clock
                sg.this_actor.sleep_for(compute_s)
                t1 = e.clock
                for op in pat.iteration(t):
                    for kind, peer, size in _transfers(op, rank):
                        if kind == "send":
                            if last is not None:
                                last.wait()
                            last = box(rank, peer).put_async(rank, int(size))
                        else:
                            box(peer, rank).get()
                comm[rank][t] = e.clock - t1
                if rank == 0:
                    wall[t] = e.clock - t0
            if last is not None:
                last.wait()

        for i in range(n):
            sg.Actor.create(f"w{i}", sg.Host.by_name(f"w{i}"), worker, i)
        for r, k in background.items():
            for j in range(k):
                sg.Actor.create(f"bg{r}-{j}", sg.Host.by_name(f"bg{r}"), _bg_sender, f"bg{r}", j)
        e.run()
    return [comm, wall]


def _bg_sender(src: str, j: int) -> None:
    sg = _simgrid()
    sg.Actor.self().daemonize()
    mb = sg.Mailbox.by_name(f"{src}-{j}")
    sink = sg.Actor.create(f"sink-{src}-{j}", sg.Host.by_name("sink"), _bg_sink, f"{src}-{j}")
    mb.set_receiver(sink)
    while True:
        mb.put(0, int(BIG))


def _bg_sink(name: str) -> None:
    sg = _simgrid()
    sg.Actor.self().daemonize()
    mb = sg.Mailbox.by_name(name)
    while True:
        mb.get()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", required=True, help="a dssync bench simcheck record")
    p.add_argument("--scenarios", default="static,inter-rack")
    p.add_argument("--strategies", default="ddp,allreduce,hierarchical,torch-hier,diloco,gossip,ds-sync")
    p.add_argument("--model", default="LV08")
    p.add_argument("--cfg", action="append", default=[], metavar="KEY:VALUE",
                   help="a SimGrid setting (e.g. network/latency-factor:1), repeatable")
    p.add_argument("--background-streams", type=float, default=None,
                   help="streams per background flow (default: the record's calibrated weight times 8, rounded)")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)

    from dssync.bench.simulate import network_of

    rec = json.loads(Path(args.record).read_text())
    cal, scale = rec["calibration"], rec["rate_scale"]
    compute = {r["strategy"]: r["compute_ms"] / 1e3 for r in rec["cpu"]}
    rows = []
    for scenario in [s for s in args.scenarios.split(",") if s]:
        net = network_of(scenario, rate_scale=scale)
        streams = dict(net.uplink_out_streams)
        if net.nic_out_streams:  # a rank flow leaves from that worker's own host: not replayed
            raise SystemExit(f"{scenario}: background from a worker's own host is not replayed")
        per = args.background_streams if args.background_streams is not None else \
            max(1, round(cal["background_weight"] * 8))
        background = {r: int(per) for r in streams}
        latency = {r: cal["queue_s"] for r in streams}
        for strategy in [s for s in args.strategies.split(",") if s]:
            jobs = [j for j in rec["jobs"] if j["scenario"] == scenario and j["strategy"] == strategy]
            if not jobs:
                continue
            t0 = time.perf_counter()
            comm, wall = simulate_job(rack_sizes=list(net.rack_sizes), nic_bps=cal["efficiency"] * net.nic_bps,
                                      uplink_bps=cal["efficiency"] * net.uplink_bps, strategy=strategy,
                                      nbytes=rec["model_bytes"], steps=rec["steps"], compute_s=compute[strategy],
                                      background=background, slow_nics={i: cal["efficiency"] * b for i, b in net.slow_nics.items()},
                                      uplink_latency=latency, model=args.model, cfg=tuple(args.cfg))
            w = rec["warmup"]
            sim_wall = 1e3 * statistics.fmean(wall[w:])
            sim_comm = 1e3 * statistics.fmean(statistics.fmean(c[w:]) for c in comm)
            row = {"scenario": scenario, "strategy": strategy, "sim_wall_ms": sim_wall, "sim_comm_ms": sim_comm,
                   "wall_ratios": [sim_wall / j["wall_ms"] for j in jobs],
                   "comm_ratios": [sim_comm / j["comm_ms"] for j in jobs], "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"{scenario:>12} {strategy:>12}: wall {sim_wall:8.1f} ms ÷ {min(row['wall_ratios']):.2f}-"
                  f"{max(row['wall_ratios']):.2f}, comm {sim_comm:8.1f} ÷ {min(row['comm_ratios']):.2f}-"
                  f"{max(row['comm_ratios']):.2f} ({row['seconds']:.1f} s)", flush=True)
    if args.json:
        from dssync.bench.provenance import write_module_record

        write_module_record(args.json, {"record": args.record, "model": args.model, "cfg": args.cfg, "rows": rows},
                            "dssync.bench.simgrid_check", argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
