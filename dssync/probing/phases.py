"""The probe's phases, built on ``measure``: the round-robin schedule of the pairs and a
pair's latency and bandwidth, the concurrent phases (a rack's egress blast with the pings
through it, its echo), and the fans that recheck a NIC the pairs called slow, after
pinging it again over time (``_waits_on``).

``dssync.probing.probe`` orchestrates them (``probe_rank``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from dssync.collectives.base import Communicator
from dssync.probing.measure import (
    Iperf3,
    Link,
    ProbeConfig,
    concurrent_streams,
    ping_pong,
    timed_stream,
)
from dssync.topology.contention import fan_clears, nic_suspects


def round_robin_rounds(num_ranks: int, relabel: int = 0) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs in which every pair of ``0..num_ranks-1`` meets exactly once.

    Circle method: rank ``n-1`` (or a bye when ``n`` is odd) stays put while the others
    rotate one place per round; ``n - 1`` rounds for even ``n``, ``n`` for odd. A pair
    ``(a, b)`` streams from ``a`` to ``b`` first, then back; ``(low, high)`` without a
    relabel. ``relabel`` > 0 runs the circle over the ranks in an order drawn from that seed
    (the same on every rank), so each pair meets in the company of other pairs: a pair's
    rate on a busy host depends on what else its round carries, and passes over the same
    rounds would repeat that bias exactly, where passes over different ones do not. The same
    seed orients each pair: the flows that run at once then go both ways across the ranks
    (one rank's flow into a rack beside another's out of it), as a ring's and a divide-and-
    shuffle round's do, where flows all from the lower rank up put only some patterns on
    an uplink together.
    """
    if num_ranks < 1:
        raise ValueError(f"need at least one rank to schedule, got {num_ranks}")
    rng = np.random.default_rng(relabel) if relabel > 0 else None
    order = list(range(num_ranks)) if rng is None else [int(r) for r in rng.permutation(num_ranks)]
    players: list[int | None] = order + ([None] if num_ranks % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = players[k], players[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        if pairs:  # a world of one has nothing to measure
            rounds.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]
    if rng is not None:
        rounds = [[(a, b) if flip else (b, a) for (a, b), flip in zip(pairs, rng.integers(0, 2, len(pairs)), strict=True)]
                  for pairs in rounds]
    return rounds


def blast_flows(racks: list[int], rack: int, quiet: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Flows of ``rack``'s egress blast: its members send across racks all at once.

    As many flows as the larger side has ranks, paired round-robin, so every member of the
    rack and every rank outside it carries at least one flow and the rack's uplink sees all
    of its members at once. No more than that: TCP shares a link per flow, so a blast of
    every member to every rank outside (16 flows on ``inter-rack``) took two thirds of an
    uplink from the 8 streams of another job and hid the contention (0.55 against 0.90
    Gbit/s, above the 0.6 rule), where 4 flows leave it a third. ``quiet`` ranks (the
    pingers of ``place_blind`` and the rank they ping) neither send nor receive.
    """
    skip = set(quiet)
    inside = [i for i, r in enumerate(racks) if r == rack and i not in skip]
    outside = [i for i, r in enumerate(racks) if r != rack and i not in skip]
    if not inside or not outside:
        return []
    return [(inside[k % len(inside)], outside[k % len(outside)]) for k in range(max(len(inside), len(outside)))]


def latency_pair(link: Link, rank: int, peer: int, cfg: ProbeConfig) -> dict[tuple[int, int], float]:
    """``{(rank, peer): one-way µs}``; the lower rank leads first, then the roles swap."""
    low = rank < peer
    out = {}
    for lead in (low, not low):
        value = ping_pong(link, peer, lead, cfg)
        if value is not None:
            out[rank, peer] = value
    return out


def bandwidth_pair(link: Link, rank: int, peer: int, sender: int, cfg: ProbeConfig,
                   payload: torch.Tensor, iperf: Iperf3 | None) -> dict[tuple[int, int], float]:
    """``{(src, dst): Gbit/s}`` for the one direction this rank timed: from ``sender`` (this
    rank or ``peer``) to the other. With iperf3 the lower rank runs the client both ways
    (``-R`` where the higher rank's server sends) and the higher rank's server answers."""
    if iperf is not None:
        if rank > peer:
            return {}
        return {((rank, peer) if sender == rank else (peer, rank)): iperf.client(peer, reverse=sender != rank)}
    value = timed_stream(link, peer, sender == rank, cfg, payload)
    return {} if value is None else {(rank, peer): value}


def concurrent_phase(comm: Communicator, link: Link, flows: list[tuple[int, int]], cfg: ProbeConfig, what: str,
                     pings: Sequence[tuple[int, int]] = ()) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """``concurrent_streams`` on every rank after a barrier, with ``pings`` (``(pinger, echo)``) in the
    middle of it: every flow's Gbit/s and every pinger's one-way µs, on every rank.

    A pinger starts after a third of the stream time, when the queues the flows fill are
    full, and pings for the next third; an echo answers each of its pingers in a thread. It
    keeps the lower quartile of its round trips, not the fastest: TCP's flows now and then
    drain a queue for a moment, and a scheduling hiccup only delays a few pings.
    """
    comm.barrier()
    mine_pings: dict[tuple[int, int], float] = {}
    during = replace(cfg, latency_reps=10**6, latency_seconds=cfg.bandwidth_seconds / 3)
    jobs = [(a, b) for a, b in pings if comm.rank in (a, b)]
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        def ping(a: int, b: int) -> float | None:
            if comm.rank == a:
                time.sleep(cfg.bandwidth_seconds / 3)
            return ping_pong(link, b if comm.rank == a else a, comm.rank == a, during, quantile=0.25)

        pending = {pair: pool.submit(ping, *pair) for pair in jobs}
        mine = concurrent_streams(link, comm.rank, flows, cfg, what)
        for pair, job in pending.items():
            value = job.result()
            if value is not None:
                mine_pings[pair] = value
    rates: dict[tuple[int, int], float] = {}
    waits: dict[tuple[int, int], float] = {}
    for part, part_pings in comm.allgather_object((mine, mine_pings)):
        rates.update(part)
        waits.update(part_pings)
    return rates, waits


def echo_rank(racks: list[int], rack: int, pingers: list[int], bw: np.ndarray, latency_us: np.ndarray,
              clear_us: float) -> int | None:
    """The quiet rank outside ``rack`` that the pingers ping during its blast.

    One whose idle pings from every pinger were clear (at most ``clear_us``), if any (a queue that other traffic
    keeps full on the way there or back would hide the blast's), and among those one in the
    rack that takes in traffic from other racks fastest (the blast sends there too).
    """
    outside = [i for i, r in enumerate(racks) if r != rack and i not in pingers]
    if len(outside) < 2:  # the blast needs a receiver besides the echo
        return None
    sym = (latency_us + latency_us.T) / 2.0

    def ingress(i: int) -> float:
        mates = [k for k, r in enumerate(racks) if r == racks[i] and k not in pingers]
        flows = [bw[k, m] for m in mates for k in range(len(racks)) if racks[k] != racks[i] and bw[k, m] > 0]
        return float(np.median(flows)) if flows else 0.0

    return min(outside, key=lambda i: (sum(sym[j, i] > clear_us for j in pingers), -ingress(i), -bw[:, i].max(), i))


#: ``_waits_on``: windows of pings, the pause before each, and the pings in one window;
#: ``run_fans``: how many of a rank's nearest peers it is rechecked with at most
_RECHECK_WINDOWS, _RECHECK_GAP_S, _RECHECK_PINGS, _RECHECK_PEERS = 7, 0.02, 4, 8


def _waits_on(comm: Communicator, link: Link, cfg: ProbeConfig, rank: int, peer: int) -> float:
    """One-way µs from ``rank`` to ``peer`` that most moments see, on every rank: the
    median over ``_RECHECK_WINDOWS`` windows, 20 ms apart, of each window's fastest ping.

    The pairs phase keeps a path's fastest ping of a burst, which tells a path from the CPU
    on a busy host but not a standing queue from a lull in it: another job's TCP streams
    back off together now and then, and a burst of pings that starts then runs entirely in
    the lull (a burst of sub-millisecond round trips takes a few milliseconds). A rank behind
    another job's streams at its NIC can then look clear, and its fan, taking a share from
    those streams, clears the NIC. Windows spread over 0.15 s each keep their fastest ping,
    so a scheduling hiccup still costs nothing, and the median of them is a lull only if
    most of that time was one.
    """
    window = replace(cfg, latency_reps=_RECHECK_PINGS, latency_seconds=_RECHECK_GAP_S / 2)
    mine = None
    if comm.rank in (rank, peer):
        other, lead = (peer, True) if comm.rank == rank else (rank, False)
        values = []
        for _ in range(_RECHECK_WINDOWS):
            if lead:
                time.sleep(_RECHECK_GAP_S)
            value = ping_pong(link, other, lead, window)
            if value is not None:
                values.append(value)
        mine = float(np.median(values)) if lead else None
    return next(v for v in comm.allgather_object(mine) if v is not None)


def run_fans(comm: Communicator, link: Link, cfg: ProbeConfig, bw: np.ndarray, hosts: list[str],
             racks: list[int], queued: list[int], latency_us: np.ndarray,
             clear_us: float) -> tuple[dict[int, dict[str, dict[int, float]]], list[dict[str, Any]]]:
    """A fan for each rank whose pairs called its NIC slow (``nic_suspects``) and whose NIC
    has no standing queue (not ``queued``): it sends to, or takes from, every rank off its
    host at once, in each direction it looked slow. ``({rank: {direction: {peer: Gbit/s}}},
    the record)``. One fan at a time: two would meet at the peers they share.

    A ``queued`` rank (``queued_ranks``: its pings wait both ways, even to its nearest rank)
    sits behind a queue at its own NIC, another job's streams, and more flows would only
    take a larger share of them (TCP shares per flow), so a fan could not clear it and none
    is run. One clear ping is not enough: one ping can slip through another job's queue at a
    rank's NIC while the others wait, and a fan then takes a share of that job's streams and
    clears the NIC. Nor is one clear burst: before its fan, a rank is pinged again in windows spread over time
    (``_waits_on``), from its nearest ranks off its host in turn until one path is clear;
    one whose every path waits most of the time gets no fan either (in the record as
    ``{"rank", "skipped": "standing queue", "ping_us"}``, its best path's). Every path, not
    the nearest only: a clear worker's nearest rank may sit behind another job's queue at
    its rack's uplink, and only a path around that queue shows the worker's own NIC clear.
    """
    fans: dict[int, dict[str, dict[int, float]]] = {}
    record: list[dict[str, Any]] = []
    # Half the stream time and a quarter of the message: a fan tells a sum from one flow's
    # rate (a factor of two or more), and each of its flows is slow, so a whole message
    # sent after the clock ran out would add a tenth of a second at a slow NIC's rate.
    light = replace(cfg, bandwidth_seconds=cfg.bandwidth_seconds / 2, message_bytes=max(1, cfg.message_bytes // 4))
    for i, directions in nic_suspects(bw, hosts, queued=queued, racks=racks).items():
        if i in queued:
            continue
        peers = [j for j in range(len(hosts)) if hosts[j] != hosts[i]]
        if not peers:
            continue
        # Its nearest peers first: one clear path shows its NIC holds no queue
        ping_us = math.inf
        for j in sorted(peers, key=lambda j: (latency_us[i, j] + latency_us[j, i], j))[:_RECHECK_PEERS]:
            ping_us = min(ping_us, _waits_on(comm, link, cfg, i, j))
            if ping_us <= clear_us:
                break
        if ping_us > clear_us:
            record.append({"rank": i, "skipped": "standing queue", "ping_us": round(ping_us, 1)})
            continue
        # the slower direction first: a NIC stays slow unless every slow direction clears
        for d in sorted(directions, key=lambda d: bw[i].max() if d == "out" else bw[:, i].max()):
            flows = [(i, j) if d == "out" else (j, i) for j in peers]
            rates, _ = concurrent_phase(comm, link, flows, light, f"rank {i} fan-{d}")
            fans.setdefault(i, {})[d] = {(dst if d == "out" else src): v for (src, dst), v in rates.items()}
            record.append({"rank": i, "direction": d, "gbps": round(float(sum(rates.values())), 4),
                           "flows": len(rates)})
            if not fan_clears(bw, racks, i, d, fans[i][d]):
                break
    return fans, record
