"""The built-in prober: pairwise latency and bandwidth over torch.distributed (gloo) send/recv.

Run ``probe_rank(comm, config)`` on every rank (``dssync.launch.run_ranks``). Pairs are
measured in the rounds of a round-robin tournament (circle method): every round is a set
of disjoint pairs that measure at the same time, so ``N`` ranks need ``N - 1`` rounds
(``N`` when ``N`` is odd, one rank sitting out each round) rather than ``N (N - 1) / 2``.
Pairwise tests alone cannot see an oversubscribed uplink that only saturates when a whole
rack talks at once, so a second phase infers the racks and then, rack by rack, has all
members of a rack send across racks at the same time (paper §III: the contention DS-Sync's
grouping adapts to). The gathered result is the same on every rank.

This module is the public entry point and holds the orchestration (``probe_rank``) and its
``ProbeResult``; ``measure`` has the measurement primitives and ``ProbeConfig``, ``phases``
the phases (pairs, blasts, fans).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dssync.collectives.base import Communicator
from dssync.probing.measure import Iperf3, Link, ProbeConfig
from dssync.probing.phases import (
    bandwidth_pair,
    blast_flows,
    concurrent_phase,
    echo_rank,
    latency_pair,
    round_robin_rounds,
    run_fans,
)
from dssync.topology.contention import classify_contention, unsure_flags
from dssync.topology.matrices import SHARP_RATIO, clear_latency, queued_ranks
from dssync.topology.model import Topology, Worker
from dssync.topology.placement import (
    RackFit,
    filled,
    place_behind_standing_queue,
    place_blind,
    reassess_blind,
    split_across_queues,
)
from dssync.topology.prior import RackPrior, weigh_prior
from dssync.topology.racks import fit_racks
from dssync.topology.replay import concurrent_flows, cut_partitions, moved_ranks, replay_fit
from dssync.topology.telling import (
    MAX_RUNS,
    adopt_told,
    alternatives,
    design,
    judge,
    standing_answers,
    unsteady,
    untold_ties,
)

__all__ = [
    "BACKENDS",
    "ProbeConfig",
    "ProbeResult",
    "best_paths",
    "host_name",
    "probe_across_hosts",
    "probe_rank",
    "settle_racks",
]

BACKENDS = ("builtin", "iperf3")


@dataclass(frozen=True)
class ProbeResult:
    """Everything the probe found (identical on every rank)."""

    hosts: list[str]
    latency_us: np.ndarray
    bandwidth_gbps: np.ndarray
    racks: list[int]
    contention: dict[str, Any]
    rounds: int
    started_at: float  # time.time() when the process group was ready, for the wall time
    confidence: dict[str, Any] | None = None

    def to_topology(self, probe: dict[str, Any]) -> Topology:
        """The ``topology.json`` contract of what was found, with ``probe`` as its probe record."""
        return Topology(workers=tuple(Worker(rank=r, host=h, rack=k)
                                      for r, (h, k) in enumerate(zip(self.hosts, self.racks, strict=True))),
                        latency_us=self.latency_us, bandwidth_gbps=self.bandwidth_gbps,
                        contention=self.contention, probe=probe, confidence=self.confidence)


def host_name() -> str:
    """This rank's host: ``DSSYNC_HOST`` (set by ``dssync emulate run``), else the hostname."""
    return os.environ.get("DSSYNC_HOST", socket.gethostname())


def best_paths(*passes: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each path's best over several passes of the pairs phase, ``(latency_us,
    bandwidth_gbps)`` each: its lowest latency that was measured (0 is none) and its
    highest bandwidth."""
    latency = np.stack([np.where(lat > 0, lat, np.inf) for lat, _ in passes]).min(axis=0)
    return np.where(np.isfinite(latency), latency, 0.0), np.stack([bw for _, bw in passes]).max(axis=0)


#: Passes of the pairs phase at most before the racks are taken as they stand.
MAX_PAIR_PASSES = 3
#: Design-run-judge steps of the telling rounds at most (``_tell``): each that moves ranks is checked by the next.
TELL_STEPS = 3


def settle_racks(first: tuple[np.ndarray, np.ndarray], measure: Callable[[], tuple[np.ndarray, np.ndarray]],
                 fit: Callable[[np.ndarray, np.ndarray], RackFit], max_passes: int = MAX_PAIR_PASSES,
                 ) -> tuple[np.ndarray, np.ndarray, RackFit, int]:
    """Passes of the pairs phase until the racks settle: ``(latency_us, bandwidth_gbps,
    fit, passes)``, the matrices each path's best over the passes (``best_paths``).

    One pass is one sample of a noisy host: a rank whose CPU was taken by other work in its
    round measures slow flows to its rack-mates, and one such pass can split a rack with
    a margin the fit calls confident (on two cores with another job's flows, one pass of the
    ``inter-rack`` layout put rank 5 in a rack of its own at a separation of 1.5). A busy CPU
    only ever makes a path look slower, so the answer is fitted on each path's best over all
    passes, and it is settled when no single pass decides it: leaving out any one pass (the
    jackknife over passes) gives every rank the same rack-mates. A margin alone is no such
    proof: three passes of ``inter-rack+nic`` whose later passes stopped moving the ranks once
    gave a wrong answer at a separation of 2.7, which its first pass alone had not given.

    At least 2 passes and at most ``max_passes``; where some pass still decides a rank after
    the last one, the ranks whose rack-mates it changes are ``unsettled``, which the
    confidence reports as unsure: the probe does not know them."""
    passes = [first, measure()]
    while True:
        best = best_paths(*passes)
        current = fit(*best)
        racks = current.racks()
        moved: set[int] = set()
        for k in range(len(passes)):
            moved |= moved_ranks(racks, fit(*best_paths(*passes[:k], *passes[k + 1:])).racks())
        if not moved or len(passes) >= max(2, max_passes):
            break
        passes.append(measure())
    current.unsettled = moved
    return (*best, current, len(passes))


def _pairs(comm: Communicator, link: Link, cfg: ProbeConfig, rounds: list[list[tuple[int, int]]],
           payload: torch.Tensor, iperf: Iperf3 | None, latency_us: np.ndarray | None = None,
           ) -> tuple[np.ndarray, np.ndarray]:
    """Every pair's one-way latency (µs) and bandwidth (Gbit/s) each way, in ``rounds``;
    the same matrices on every rank (0 where nothing was measured). Given ``latency_us``
    (an earlier pass's), no pings: that is the latency returned."""
    rank, n = comm.rank, comm.world_size
    latency: dict[tuple[int, int], float] = {}
    bandwidth: dict[tuple[int, int], float] = {}
    # All latency rounds first, then all bandwidth rounds: a ping-pong next to another
    # pair's bulk transfer would time the CPU and the queues that transfer fills.
    # Bandwidth one direction at a time, all pairs of a round together, a barrier after
    # each: every flow of a direction starts together and shares what it shares for
    # the whole of its stream, whichever backend times it.
    kinds = [("latency", True)] if latency_us is None else []
    for kind, first in (*kinds, ("bandwidth", True), ("bandwidth", False)):
        for pairs in rounds:
            for a, b in pairs:
                if rank in (a, b):
                    peer = b if rank == a else a
                    if kind == "latency":
                        latency.update(latency_pair(link, rank, peer, cfg))
                    else:  # a pair (a, b) streams from a to b first, then back
                        bandwidth.update(bandwidth_pair(link, rank, peer, a if first else b, cfg, payload, iperf))
            comm.barrier()  # the next round's pairs must not overlap this one's
    measured, bandwidth_gbps = np.zeros((n, n)), np.zeros((n, n))
    for lat_part, bw_part in comm.allgather_object((latency, bandwidth)):
        for (src, dst), value in lat_part.items():
            measured[src, dst] = value
        for (src, dst), value in bw_part.items():
            bandwidth_gbps[src, dst] = value
    return (measured if latency_us is None else latency_us), bandwidth_gbps


def _replay(comm: Communicator, fit: RackFit, raw: list[tuple[list[list[tuple[int, int]]], np.ndarray]],
            reassess: Callable[[RackFit], Any], hosts: Sequence[str] | None = None) -> dict[str, Any] | None:
    """The fitted racks checked against every rate the pairs phase's concurrent flows got,
    not only each path's best (``dssync.topology.replay.replay_fit``; ``reassess`` works the
    blind ranks out again where the clear ranks moved): rank 0 decides (the search is CPU
    work that every rank would repeat on shared cores), every rank adopts. The replay's
    record, or None where it had nothing to check."""
    mine = None
    if comm.rank == 0:
        replay = replay_fit(fit, concurrent_flows(raw), starts=cut_partitions([bw for _, bw in raw]),
                            reassess=reassess, hosts=hosts)
        if replay is not None:
            mine = (fit, replay.record())
    decided = comm.allgather_object(mine)[0]
    if decided is None:
        return None
    vars(fit).update(vars(decided[0]))  # the fit as rank 0 left it, on every rank
    return decided[1]


def _tell(comm: Communicator, link: Link, cfg: ProbeConfig, fit: RackFit,
          raw: list[tuple[list[list[tuple[int, int]]], np.ndarray]],
          reassess: Callable[[RackFit], Any], bandwidth_gbps: np.ndarray, queued: Sequence[int] = (),
          hosts: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], list[tuple[tuple[int, ...], str]]]:
    """Rounds of flows that tell the racks from their nearest rivals, run and judged
    (``dssync.topology.telling``) until they keep the racks, at most ``TELL_STEPS`` times:
    rank 0 designs and decides, every rank runs the rounds and adopts. Where the last step
    still moved ranks, nothing confirmed the move: those ranks are unsure. No telling flow
    crosses an uplink the pairs (``bandwidth_gbps``) flag. The steps' record, and the answers
    the last step left standing beside the one written, with why (``telling.alternatives``)."""
    observed = concurrent_flows(raw) if comm.rank == 0 else []
    rejected: list[tuple[int, ...]] = []
    judged: list[tuple[int, ...]] = []  # rivals of the current answer its rounds told and kept it against (rank 0)
    tied: list[tuple[int, ...]] = []  # rivals the last verdict found alike with the answer it took (rank 0)
    history: list[tuple[list[tuple[int, int]], np.ndarray]] = []  # every telling round run, each flow's best (rank 0)
    steps: list[dict[str, Any]] = []
    moved: set[int] = set()
    last: tuple[Any, Any] | None = None  # the last step's design and verdict (rank 0)
    left: list[tuple[int, ...]] = []  # ties of the answer that no later round told (rank 0)
    shaken: list[tuple[int, ...]] = []  # answers left on a slow NIC's flows alone (rank 0)
    for step_no in range(TELL_STEPS):
        # blind ranks too: their flows are slow, but they still take their share of an uplink;
        # not a rank behind another job's queue at its NIC, whose rates are that job's to set
        movable = sorted({*(i for members in fit.groups for i in members), *fit.blind} - set(queued))
        plan = None
        if comm.rank == 0:
            racks = fit.racks()
            flags = classify_contention(bandwidth_gbps, racks, hosts=hosts, queued=queued)
            flagged = {u["rack"] for u in flags["uplinks"]}
            plan = design(racks, observed, movable, hosts=hosts, skip=judged,
                          avoid=[[i for i, r in enumerate(racks) if r == rack] for rack in flagged],
                          slow_nics=sorted({*(u["rank"] for u in flags["nics"]), *queued, *fit.blind}),
                          first=tied)
        rounds = comm.allgather_object(plan.rounds if plan is not None else None)[0]  # rank 0's, to all
        if not rounds:
            if plan is not None:
                last = (plan, None)
                left = untold_ties(plan, tied)
            break
        measured: list[list[np.ndarray | None]] = []
        again = list(range(len(rounds)))
        while again:  # twice each, then again those whose best two runs disagree (rank 0 says which)
            row: list[np.ndarray | None] = [None] * len(rounds)
            for k in again:
                rates, _ = concurrent_phase(comm, link, rounds[k], cfg, "telling round")
                row[k] = np.array([rates.get(f, 0.0) for f in rounds[k]])
            measured.append(row)
            if len(measured) >= 2:
                again = comm.allgather_object(unsteady(measured) if comm.rank == 0 and len(measured) < MAX_RUNS
                                              else [])[0]
        decided = None
        if comm.rank == 0:
            verdict = judge(plan, observed, measured, rejected, history)
            last = (plan, verdict)
            history += verdict.ran  # what later steps' choices must explain too
            step = {"racks": list(plan.answer), "rounds": [[list(f) for f in flows] for flows in plan.rounds],
                    "gbps": [[None if r is None else np.round(r, 4).tolist() for r in row] for row in measured],
                    "untold": plan.untold, "unrun": len(plan.unrun), **verdict.record()}
            told = [plan.rivals[k][0] for k in sorted({k for ks in plan.told for k in ks})]
            if verdict.racks is not None:
                rejected.append(plan.answer)
                moved = adopt_told(fit, verdict.racks, reassess)
                if verdict.shaky & moved:  # taken on a slow NIC's flows alone: unsure, the answer left stands
                    fit.unexplained |= verdict.shaky & moved
                    shaken.append(plan.answer)
                left = [] if moved else left  # an earlier answer's ties are not this one's
                judged = [] if moved else judged + told  # a new answer has rivals of its own
                tied = verdict.tied if moved else []  # the next step tells them from it first
                if not moved:  # a rival the fit cannot hold (two blind ranks in a rack of their own)
                    fit.unexplained |= moved_ranks(plan.answer, verdict.racks)
                    step["taken"] = None
            else:
                fit.unexplained |= verdict.doubted
                left += untold_ties(plan, tied)
                judged += told
                tied = []
                moved = set()
                if step_no == TELL_STEPS - 1:  # rivals a round would have told, never run: not known
                    for labels in plan.unrun:
                        fit.unexplained |= moved_ranks(plan.answer, labels)
            decided = (fit, step, moved)
        fit_now, step, moved = comm.allgather_object(decided)[0]  # rank 0's; only it designs
        vars(fit).update(vars(fit_now))
        steps.append(step)
        if step["taken"] is None and not step["unrun"]:
            break  # kept against every rival a round could tell (a next step tells those that found no room)
    fit.unexplained |= moved  # the last step moved them and no round confirmed it
    standing, left, shaken = comm.allgather_object((alternatives(*last) if last is not None else [], left,
                                                    shaken))[0]  # rank 0's
    for labels in left:  # nothing measured told these ranks' racks: unsure, and the tie stands beside the answer
        fit.unexplained |= moved_ranks(fit.racks(), labels)
    return steps, [*((labels, "tied") for labels in left), *standing, *((labels, "shaky") for labels in shaken)]


def _aggregates(phases: list[dict[str, Any]], racks: list[int]) -> list[float] | None:
    """Each rack's blast aggregate in rack order (NaN for a rack that had no blast), from
    ``phases`` (one per group, named by ``rack``)."""
    if not phases:
        return None
    by_rack = {p["rack"]: p["egress_gbps"] for p in phases if p["flows"]}
    return [by_rack.get(r, float("nan")) for r in range(max(racks) + 1)]


def probe_rank(comm: Communicator, cfg: ProbeConfig, backend: str = "builtin",
               racks: list[int] | None = None, base_port: int = 5301,
               prior: RackPrior | None = None) -> ProbeResult:
    """Measure the world from this rank; every rank returns the same ``ProbeResult``.

    ``backend="iperf3"`` measures pairwise bandwidth with ``iperf3`` (server on port
    ``base_port + rank``) instead of gloo messages; latency and the concurrent uplink phase
    use gloo messages with either backend. ``racks`` (rack per rank, numbered in order of
    lowest rank) replaces the inferred racks, for a layout known in advance. ``prior``
    (``--racks-from``) is racks the user knows, which the measurement checks: it decides the
    ranks it is sure of, the prior the rest (``dssync.topology.prior.weigh_prior``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown probe backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if racks is not None and len(racks) != comm.world_size:
        raise ValueError(f"racks lists {len(racks)} ranks for a world of {comm.world_size}; "
                         "give one rack per rank")
    started_at = time.time()
    n = comm.world_size
    link = Link(comm)
    hosts = [str(h) for h in comm.allgather_object(host_name())]
    prior_racks = prior.racks(hosts) if prior is not None else None  # --racks-from: a bad host fails here
    comm.barrier()
    payload = torch.zeros(cfg.message_bytes, dtype=torch.uint8)
    rounds = round_robin_rounds(n)
    if cfg.isolated:  # every pair alone: what a path gives one flow, for comparing backends
        rounds = [[pair] for pairs in rounds for pair in pairs]
    iperf = Iperf3(comm, cfg, base_port) if backend == "iperf3" else None
    raw: list[tuple[list[list[tuple[int, int]]], np.ndarray]] = []  # each pass's rounds and rates

    def pass_over(pass_rounds: list[list[tuple[int, int]]], **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        lat, bw = _pairs(comm, link, cfg, pass_rounds, payload, iperf, **kwargs)
        raw.append((pass_rounds, bw))
        return lat, bw

    try:
        if iperf is not None:
            comm.barrier()  # every server started before any client connects
        latency_us, bandwidth_gbps = pass_over(rounds)
        known = racks is not None
        if known:
            fit = RackFit(n=n, groups=[[i for i in range(n) if racks[i] == r] for r in sorted(set(racks))],
                          metric="given")
            pair_passes = 1
        else:
            # Each later pass meets the pairs in other company (``round_robin_rounds``' relabel)
            # and times the streams only: a path's latency is its fastest of twenty pings
            # already, which a busy host cannot make faster, and the pings were a fifth of a pass.
            later = (round_robin_rounds(n, relabel=k) if not cfg.isolated else rounds for k in itertools.count(1))
            first_latency = latency_us
            latency_us, bandwidth_gbps, fit, pair_passes = settle_racks(
                (latency_us, bandwidth_gbps),
                lambda: pass_over(next(later), latency_us=first_latency),
                lambda lat, bw: fit_racks(lat, bw, hosts))
    finally:
        if iperf is not None:
            iperf.close()
    # each phase's wall seconds on this rank, start-up to the end of the pairs' passes first
    phase_seconds = {"pairs": round(time.time() - started_at, 3)}
    replay_record = None
    telling: list[dict[str, Any]] = []
    standing: list[tuple[tuple[int, ...], str]] = []  # answers the telling rounds left beside the one written
    if not known and not cfg.isolated:
        def reassess(f: RackFit) -> Any:
            return reassess_blind(f, bandwidth_gbps, latency_us, hosts)
        mark = time.time()
        replay_record = _replay(comm, fit, raw, reassess, hosts)
        phase_seconds["replay"] = round(time.time() - mark, 3)
        mark = time.time()
        telling, standing = _tell(comm, link, cfg, fit, raw, reassess, bandwidth_gbps, queued_ranks(latency_us),
                                  hosts)
        phase_seconds["telling"] = round(time.time() - mark, 3)
        # the flows' answer checked against the pings: a queue between rack-mates is an uplink's
        split_across_queues(fit, latency_us)
    provisional = fit.racks()
    # Egress blasts, one per rack: its uplink with all of its members sending across at once
    # (the paper's contended uplink only shows when a whole rack talks), and, for every rank
    # the pairs could not place, a ping through the queue that fills only its own rack's uplink.
    pingers = [] if known else [j for j in sorted({*fit.unplaced, *fit.tentative}) if fit.candidates.get(j)]
    phases: list[dict[str, Any]] = []
    out_best = bandwidth_gbps.max(axis=1)
    clear_us = clear_latency(latency_us)
    queued = queued_ranks(latency_us)  # behind another job's queue at their own NIC
    # (group, pinger, echo, kind) -> the ping's one-way µs in each pass; kind: "out" from a
    # blind rank to a rank outside the group, "in" to a spare member, "spare" from it out
    passes: dict[tuple[int, int, int, str], list[float]] = {}
    full: dict[int, bool] = {}  # group -> its blast filled a queue at a link its members share
    if len(set(provisional)) > 1:
        def blast(g: int, members: list[int]) -> None:
            rack = provisional[members[0]]
            echo = echo_rank(provisional, rack, pingers, bandwidth_gbps, latency_us, clear_us) if pingers else None
            # a member to spare (two still send), the one the pingers reach fastest at rest,
            # answers pings from the inside and pings out itself
            spare = (min(members, key=lambda i: (sum(latency_us[i, j] + latency_us[j, i] for j in pingers), i))
                     if echo is not None and len(members) >= 3 else None)
            quiet = [*pingers, *(e for e in (echo, spare) if e is not None)]
            flows = blast_flows(provisional, rack, quiet)
            kinds = {(j, echo): "out" for j in pingers if echo is not None}
            if spare is not None:
                kinds.update({(j, spare): "in" for j in pingers} | {(spare, echo): "spare"})
            rates, waits = concurrent_phase(comm, link, flows, cfg, f"rack {rack} egress", list(kinds) if flows else [])
            total = float(sum(rates.values()))
            if len(phases) == g:
                phases.append({"rack": rack, "egress_gbps": 0.0, "flows": len(rates)})
            phases[g]["egress_gbps"] = max(phases[g]["egress_gbps"], round(total, 4))
            senders = {src for src, _ in rates}
            # the members sent well below what their NICs carry alone: they share a link
            full[g] = full.get(g, False) or bool(
                senders and total < SHARP_RATIO * float(sum(out_best[i] for i in senders)))
            for pair, us in waits.items():
                passes.setdefault((g, *pair, kinds[pair]), []).append(us)

        # Two passes over the racks, each rack's best kept: a burst of CPU work on a busy
        # host only ever makes a link look slower, while a contended uplink is slow in both
        # passes. With one pass, an uncontended rack of the 3,2,4 layout once measured
        # 0.28 Gbit/s against the contended rack's 0.33 and was flagged with it.
        for g, members in [*enumerate(fit.groups)] * 2:
            blast(g, members)
        # A third pass where an uplink's aggregate is too close to call (``unsure_flags``):
        # a rack whose blast a busy host held back both times may carry its NICs' worth now.
        if unsure_flags(bandwidth_gbps, provisional, _aggregates(phases, provisional), hosts=hosts,
                        queued=queued)["uplinks"]:
            for g, members in enumerate(fit.groups):
                blast(g, members)
        # A queue is there in both passes, a scheduling hiccup in one: the lower pass counts.
        # The idle time is the lower of the pairs phase's and the blasts': a path that was
        # clear once is not behind a queue of other traffic.
        delays: dict[int, dict[int, dict[str, tuple[float, float]]]] = {j: {} for j in pingers}
        slow_up = {u["rack"] for u in classify_contention(bandwidth_gbps, provisional, hosts=hosts,
                                                         queued=queued)["uplinks"]}
        for (g, a, b, kind), values in passes.items():
            ping = (min(values), float(min(latency_us[a, b] or np.inf, latency_us[b, a] or np.inf, *values)))
            if kind == "spare":  # the spare member's own ping out says, better than the rates, whether it filled
                full[g] = filled(ping, clear_us, provisional[a] in slow_up)
            else:
                delays[a].setdefault(g, {})[kind] = ping
        # racks of blind ranks alone get no blast of their own: nothing clear to send
        place_blind(fit, delays, full, clear_us)
        place_behind_standing_queue(fit, latency_us, clear_us,
                                    [g for g, members in enumerate(fit.groups) if provisional[members[0]] in slow_up])
        racks = fit.racks()
    else:
        delays, racks = {}, provisional
    if prior_racks is not None:  # --racks-from: the measured racks checked against the prior
        racks, prior_record = weigh_prior(fit, prior_racks, prior.source, report=comm.rank == 0)
    phase_seconds["blasts"] = round(time.time() - started_at - sum(phase_seconds.values()), 3)
    # Phase g blasted group g: name it by its final rack. A rack of unplaced ranks alone had none.
    for g, p in enumerate(phases):
        p["rack"] = racks[fit.groups[g][0]]
    aggregates = _aggregates(phases, racks)
    fans, fan_record = run_fans(comm, link, cfg, bandwidth_gbps, hosts, racks, queued, latency_us, clear_us)
    phase_seconds["fans"] = round(time.time() - started_at - sum(phase_seconds.values()), 3)
    contention: dict[str, Any] = dict(classify_contention(bandwidth_gbps, racks, aggregates, hosts=hosts, fans=fans,
                                                                queued=queued))
    contention["uplink_aggregates"] = phases
    contention["nic_fans"] = fan_record
    confidence = fit.confidence()
    # Flags decided by a ratio too close to the rule to call, or an uplink carrying less
    # than its NICs allow without standing out: the answer is then not confident either.
    confidence["flags_unsure"] = unsure_flags(bandwidth_gbps, racks, aggregates, hosts=hosts, fans=fans,
                                              queued=queued)
    # what the probe could not tell its racks from, in the workers it is unsure of or could not place
    confidence["alternatives"] = standing_answers(racks, standing, [*confidence["unsure"], *confidence["unplaced"]])
    confidence["racks_confident"] = confidence["confident"]
    if confidence["flags_unsure"]["uplinks"] or confidence["flags_unsure"]["nics"]:
        confidence["confident"] = False
    confidence["pings_us"] = {str(j): {str(g): {k: [round(during, 1), round(idle, 1)] for k, (during, idle) in p.items()}
                                       for g, p in d.items()} for j, d in delays.items()}
    confidence["phase_seconds"] = phase_seconds
    confidence["pair_passes"] = pair_passes
    # every pass's rounds and the rate each flow got: what the replay read, kept so that a
    # rack a later reader doubts can be checked against the flows themselves
    confidence["pair_rates"] = [{"rounds": [[list(p) for p in pairs] for pairs in pass_rounds],
                                 "gbps": np.round(np.asarray(bw, dtype=float), 4).tolist()}
                                for pass_rounds, bw in raw]
    if replay_record is not None:
        confidence["replay"] = replay_record
    if telling:
        confidence["telling"] = telling
    if prior_racks is not None:
        confidence.update(prior_record)
    return ProbeResult(hosts=hosts, latency_us=latency_us, bandwidth_gbps=bandwidth_gbps, racks=racks,
                       contention=contention, rounds=len(rounds), started_at=started_at, confidence=confidence)


def probe_across_hosts(comm: Communicator, *, timeout_s: float, prior: RackPrior | None = None,
                       library: str | None = None) -> Topology | None:
    """``dssync probe``'s measurement over ``comm`` (collective) as a ``Topology``, when its
    ranks run on more than one host; None on one host, where a probe would measure the CPU.
    ``prior``: racks the user knows (``--racks-from``); ``library``: the collective library
    the job runs on, recorded in the topology's probe metadata."""
    if len(set(comm.allgather_object(host_name()))) < 2:
        return None
    result = probe_rank(comm, ProbeConfig(timeout_s=timeout_s), prior=prior)
    meta: dict[str, Any] = {"backend": "builtin"}
    if library is not None:
        meta["library"] = library
    return result.to_topology({**meta, "rounds": result.rounds})
