"""Racks that explain what the pairs phase's concurrent flows got (``replay_racks``).

The pairs phase runs its pairs in rounds, and the flows of a round's direction all at once.
Each path's best over the passes (what ``fit_racks`` clusters) shows a rack boundary only
where crossing it costs a single flow something: a slower uplink, another job's queue.
Where every uplink is as fast as a NIC, a lone flow across racks gets what a flow inside one
gets, and the boundary shows only when flows *share* the uplink: two flows from outside into
one rack get half of its downlink each, two flows into two workers of one rack from inside
it share nothing. The best-of-passes matrices keep the pass in which a path ran alone and
forget the ones in which it shared.

So the racks are checked against every rate the pairs phase measured, not only the best:
under a candidate answer, each round's flows get the max-min fair rates of a network with
that answer's links (each worker's NIC each way, each rack's uplink each way, and the
hosts' CPUs, which every flow of a round shares on a machine that is never idle), the
capacities the largest each link was seen to carry under that answer. The answer whose
rates lie closest to the measured ones (squared log-ratios, each capped, so one flow a busy
host held back counts no more than a clear halving) is kept; moves of one worker to
another rack or a rack of its own, and merges of two racks, are tried from the fitted answer
while one lowers the misfit by at least ``MIN_GAIN``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dssync.topology.matrices import renumber_racks
from dssync.topology.placement import RackFit

__all__ = ["DOUBT", "FLOW_CAP", "MIN_GAIN", "SEARCH_SECONDS", "Replay", "adopt", "capacities", "concurrent_flows",
           "cut_partitions", "max_min_rates", "misfit", "moved_ranks", "named_racks", "replay_fit", "replay_racks"]

#: A move must lower the misfit by this much (in squared natural-log units: about six
#: flows halved that the answer now explains) to be taken: on two busy cores a worker whose
#: NIC another job shares measured rates that a wrong rack explained better by 2.0.
MIN_GAIN = 3.0
#: A worker that a single move elsewhere explains better by this much (about two flows
#: halved), though not by ``MIN_GAIN``, is unsure: the flows measured doubt where it is.
DOUBT = 1.0
#: One flow's misfit at most: a factor of e away from its prediction (a busy host that held
#: a flow back counts no more than that).
FLOW_CAP = 1.0
#: The search's CPU seconds at most (the misfit of one answer costs 12-24 ms at 16 workers:
#: the clusterings' 70-90 cuts take about 2 s, and the search from every worker alone tries
#: hundreds of answers a step: 13-28 s unbounded on 16-worker rates). Where it runs out, it
#: stops where it got to and says so; the margins of the answer it keeps are computed in
#: full after it.
SEARCH_SECONDS = 3.0

Flow = tuple[int, int]


def concurrent_flows(passes: Sequence[tuple[Sequence[Sequence[tuple[int, int]]], np.ndarray]],
                     ) -> list[tuple[list[Flow], np.ndarray]]:
    """The sets of flows that ran at once and the rate each got: for each pass's round
    (``(rounds, bandwidth_gbps)``), each pair ``(a, b)`` from ``a`` to ``b``, then back."""
    out = []
    for rounds, bw in passes:
        bw = np.asarray(bw, dtype=float)
        for pairs in rounds:
            for flows in ([(a, b) for a, b in pairs], [(b, a) for a, b in pairs]):
                flows = [f for f in flows if bw[f] > 0]
                if flows:
                    out.append((flows, np.array([bw[f] for f in flows])))
    return out


def max_min_rates(paths: Sequence[Sequence[Any]], capacity: dict[Any, float]) -> np.ndarray:
    """Max-min fair rates (progressive filling) of flows over ``paths`` (the links each
    crosses) with ``capacity`` per link."""
    rate = np.zeros(len(paths))
    left = dict(capacity)
    active = set(range(len(paths)))
    while active:
        count: dict[Any, int] = {}
        for f in active:
            for link in paths[f]:
                count[link] = count.get(link, 0) + 1
        step = min(max(left[link], 0.0) / c for link, c in count.items())
        for f in active:
            rate[f] += step
        for link, c in count.items():
            left[link] -= step * c
        full = {link for link in count if left[link] <= 1e-9 * max(1.0, capacity[link])}
        active = {f for f in active if not full.intersection(paths[f])}
    return rate


def flow_links(src: int, dst: int, racks: Sequence[Any]) -> list[Any]:
    links: list[Any] = [("out", src), ("in", dst), ("cpu",)]
    if racks[src] != racks[dst]:
        links += [("up", racks[src]), ("down", racks[dst])]
    return links


def capacities(racks: Sequence[Any], observed: Sequence[tuple[list[Flow], np.ndarray]]) -> dict[Any, float]:
    """Each link's capacity under ``racks``: the most it was seen to carry at once."""
    capacity: dict[Any, float] = {}
    for flows, rates in observed:
        carried: dict[Any, float] = {}
        for (s, d), r in zip(flows, rates, strict=True):
            for link in flow_links(s, d, racks):
                carried[link] = carried.get(link, 0.0) + float(r)
        for link, total in carried.items():
            capacity[link] = max(capacity.get(link, 0.0), total)
    return capacity


def named_racks(racks: Sequence[int]) -> list[tuple[int, ...]]:
    """Each rank's rack named by its members: a link is known by its rack's members, so
    two answers that agree on a rack agree on its links, whatever their labels."""
    members: dict[int, list[int]] = {}
    for i, r in enumerate(racks):
        members.setdefault(r, []).append(i)
    return [tuple(members[r]) for r in racks]


def moved_ranks(before: Sequence[int], after: Sequence[int]) -> set[int]:
    """The ranks whose rack-mates differ between the two answers."""
    a, b = named_racks(before), named_racks(after)
    return {i for i in range(len(a)) if a[i] != b[i]}


def misfit(racks: Sequence[int], observed: Sequence[tuple[list[Flow], np.ndarray]],
           memo: dict[Any, float] | None = None) -> float:
    """How far the measured rates lie from the ones ``racks`` predicts (module docstring).
    ``memo`` keeps each round's misfit by what decides it (which of its flows share which
    links, and those links' capacities), so answers that differ in one worker recompute
    only the rounds that worker's racks touch."""
    named = named_racks(racks)
    capacity = capacities(named, observed)
    memo = {} if memo is None else memo
    total = 0.0
    for k, (flows, rates) in enumerate(observed):
        paths = [flow_links(s, d, named) for s, d in flows]
        key = (k, tuple(tuple((link, capacity[link]) for link in links) for links in paths))
        if key not in memo:
            err = np.log(np.maximum(rates, 1e-3) / np.maximum(max_min_rates(paths, capacity), 1e-3))
            memo[key] = float(np.minimum(err * err, FLOW_CAP).sum())
        total += memo[key]
    return total


def cut_partitions(passes: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
    """Every cut of the clusterings of the pass matrices (Gbit/s, ``passes``): each path's
    best, worst and median over the passes, each made symmetric by its faster direction,
    as distances -log(rate / fastest), clustered by average, complete and single linkage
    and cut at every number of racks. The best shows a boundary where crossing it costs a
    lone flow; the worst and median keep the rounds in which flows shared a link."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    stack = np.asarray(passes, dtype=float)
    n = stack.shape[1]
    if n < 2:
        return []
    off = ~np.eye(n, dtype=bool)
    out: set[tuple[int, ...]] = set()
    for mat in (stack.max(axis=0), np.where(off, stack, np.inf).min(axis=0), np.median(stack, axis=0)):
        sym = np.maximum(mat, mat.T)
        top = max(float(sym[off].max()), 1e-3)
        dist = -np.log(np.clip(sym, 1e-3, top) / top)
        np.fill_diagonal(dist, 0.0)
        for method in ("average", "complete", "single"):
            tree = linkage(squareform(dist, checks=False), method)
            for k in range(1, n + 1):
                out.add(canonical_partition(list(fcluster(tree, k, "maxclust"))))
    return sorted(out)


def canonical_partition(labels: Sequence[int]) -> tuple[int, ...]:
    return tuple(renumber_racks(labels))  # hashable, one name per partition


@dataclass
class Replay:
    """What the replay decided: the racks, the misfit before and after, the moves taken,
    and for each movable worker how much the best other place for it would cost more
    (``margins``, misfit units; below ``MIN_GAIN`` the flows hardly tell)."""

    racks: list[int]
    before: float
    after: float
    moves: list[dict[str, Any]] = field(default_factory=list)
    margins: dict[int, float] = field(default_factory=dict)
    #: the search ran out of ``SEARCH_SECONDS`` before it stopped by itself
    cut_short: bool = False
    #: where the fit found one rack: the search from every worker alone, cut short, had
    #: already found racks that explain the flows better by ``MIN_GAIN``; not taken (half an
    #: agglomeration is no answer), but the one rack is in doubt
    doubt_one_rack: bool = False

    def record(self) -> dict[str, Any]:
        return {"misfit_before": round(self.before, 3), "misfit_after": round(self.after, 3), "moves": self.moves,
                "margins": {str(i): round(m, 3) for i, m in sorted(self.margins.items())},
                "cut_short": self.cut_short, "doubt_one_rack": self.doubt_one_rack}


def _units(movable: Sequence[int], hosts: Sequence[str] | None) -> list[list[int]]:
    """The movable ranks by host: ranks on one host are one machine, so in one rack, and
    move together (each rank its own unit where ``hosts`` is None)."""
    if hosts is None:
        return [[i] for i in movable]
    by_host: dict[str, list[int]] = {}
    for i in movable:
        by_host.setdefault(hosts[i], []).append(i)
    return list(by_host.values())


def neighbours(labels: tuple[int, ...], movable: Sequence[int],
                hosts: Sequence[str] | None = None) -> list[tuple[tuple[int, ...], dict[str, Any]]]:
    """Every answer one step from ``labels``: a movable rank (with the ranks on its host)
    moved to another group or a rack of its own, or two groups merged."""
    out = []
    groups = sorted({labels[i] for i in movable})
    fresh = max(labels) + 1
    for unit in _units(movable, hosts):
        i = unit[0]
        for target in [*groups, fresh]:
            if target == labels[i] or (target == fresh and sum(x == labels[i] for x in labels) == len(unit)):
                continue
            new = list(labels)
            for k in unit:
                new[k] = target
            what = {"move": i, "to": "alone" if target == fresh else sorted(j for j in movable if labels[j] == target)}
            if len(unit) > 1:
                what["with"] = unit[1:]
            out.append((canonical_partition(new), what))
    for a in groups:
        for b in groups:
            if a < b:
                out.append((canonical_partition([a if x == b else x for x in labels]),
                            {"merge": [sorted(j for j in movable if labels[j] == g) for g in (a, b)]}))
    return out


def _splits_a_host(labels: Sequence[int], hosts: Sequence[str] | None) -> bool:
    if hosts is None:
        return False
    seen: dict[str, int] = {}
    return any(seen.setdefault(h, r) != r for h, r in zip(hosts, labels, strict=True))


def replay_racks(racks: Sequence[int], observed: Sequence[tuple[list[Flow], np.ndarray]],
                 movable: Sequence[int] | None = None, min_gain: float = MIN_GAIN,
                 seconds: float = SEARCH_SECONDS, starts: Sequence[Sequence[int]] = (),
                 hosts: Sequence[str] | None = None) -> Replay:
    """From ``racks``, the racks that explain ``observed`` best (module docstring).

    Only ``movable`` workers move (all by default; a worker whose NIC is slow both ways shows
    nothing in its flows and stays where it was placed), and ranks on one host (``hosts``)
    only together. ``starts`` are other answers to
    search from (every worker's rack in each; the unmovable stay where ``racks`` puts them):
    the one that explains the flows best, where it beats ``racks`` by ``min_gain``. The
    search stops after ``seconds`` of CPU time wherever it is (``cut_short``)."""
    n = len(racks)
    movable = list(range(n)) if movable is None else sorted(movable)
    labels = canonical_partition(racks)
    cache: dict[tuple[int, ...], float] = {}
    memo: dict[Any, float] = {}

    def cost(lab: tuple[int, ...]) -> float:
        if lab not in cache:
            cache[lab] = misfit(lab, observed, memo)
        return cache[lab]

    before = cost(labels)
    deadline = time.process_time() + seconds
    cut = [False]

    def out_of_time() -> bool:
        cut[0] = cut[0] or time.process_time() > deadline
        return cut[0]

    def descend(labels: tuple[int, ...]) -> tuple[tuple[int, ...], float, list[dict[str, Any]]]:
        current, moves = cost(labels), []
        for _ in range(2 * n):
            options = []
            for lab, what in neighbours(labels, movable, hosts):
                if out_of_time():
                    return labels, current, moves
                options.append((cost(lab), lab, what))
            if not options:
                break
            best, lab, what = min(options, key=lambda o: o[0])
            if current - best < min_gain:
                break
            moves.append({**what, "gain": round(current - best, 3)})
            labels, current = lab, best
        return labels, current, moves

    # Three starts, in this order under the budget. The clusterings' best cut: where a lone
    # flow shows the racks only faintly, a cut is often the whole answer at once, which no
    # chain of single moves that each explain MIN_GAIN more reaches; being whole, it is kept
    # even where the search from it runs out of time. The fitted answer. And where that is
    # one rack, every movable worker alone: with uplinks as fast as NICs a rack shows only
    # once two of its workers share its uplink, so single moves from one rack stall where
    # merges of single workers do not.
    fixed = {i: labels[i] for i in range(n) if i not in set(movable)}
    tried = []
    for start in starts:
        if out_of_time():
            break
        mine = canonical_partition([start[i] if i not in fixed else n + fixed[i] for i in range(n)])
        if not _splits_a_host(mine, hosts):
            tried.append((cost(mine), mine))
    found = []
    if tried:
        best_cost, best_start = min(tried)
        if best_cost + min_gain <= before:
            found.append(("a clustering's cut", *descend(best_start)))
    fitted = descend(labels)
    found.insert(0, ("the fit", *fitted))
    doubt = False
    if len({labels[i] for i in movable}) == 1 and not cut[0]:
        alone = list(labels)
        for k, unit in enumerate(_units(movable, hosts)):
            for i in unit:
                alone[i] = max(labels) + 1 + k
        start = canonical_partition(alone)
        from_alone = descend(start)
        if not cut[0]:
            found.append(("every worker alone", *from_alone))
        else:  # half an agglomeration is no answer; that it already explains more doubts the one rack
            doubt = from_alone[1] <= fitted[1] - min_gain
    name, labels, current, moves = min(found, key=lambda f: f[2] + (0 if f[0] == "the fit" else min_gain))
    if name != "the fit":
        moves = [{"start": name}, *moves]
    margins: dict[int, float] = {}
    for lab, what in neighbours(labels, movable, hosts):
        if "move" in what:
            for i in [what["move"], *what.get("with", [])]:
                margins[i] = min(margins.get(i, math.inf), cost(lab) - current)
    return Replay(racks=list(labels), before=before, after=current, moves=moves, margins=margins,
                  cut_short=cut[0], doubt_one_rack=doubt)


def adopt(fit: RackFit, racks: Sequence[int], movable: Sequence[int], how: str,
          reassess: Callable[[RackFit], Any] | None = None) -> None:
    """Make ``racks`` (labels over all ranks) the groups of ``fit``'s ``movable`` ranks;
    ``reassess`` works the blind ranks out again on the new groups."""
    labels = sorted({racks[i] for i in movable}, key=lambda r: min(i for i in movable if racks[i] == r))
    fit.groups = [[i for i in movable if racks[i] == r] for r in labels]
    fit.margins = {}  # the clustering's separations describe groups that are gone
    fit.metric = f"{fit.metric}+{how}"
    if fit.blind and reassess is not None:
        reassess(fit)


def replay_fit(fit: RackFit, observed: Sequence[tuple[list[Flow], np.ndarray]],
               starts: Sequence[Sequence[int]] = (),
               reassess: Callable[[RackFit], Any] | None = None,
               hosts: Sequence[str] | None = None) -> Replay | None:
    """Check ``fit`` against ``observed`` and change it in place: its clear ranks' groups
    become the replay's racks when a move was taken. A blind rank's candidates and
    placement name the fitted groups: with blind ranks the replay moves the clear ranks
    only, and ``reassess`` (``placement.reassess_blind`` over the probe's matrices) works
    the blind ranks out again on the new groups; without it the ranks the replay would move
    are doubted instead. The clear ranks the flows do
    not vouch for become ``unexplained``: where the replay moved ranks, every rank whose
    best other place explains the flows less well by under ``MIN_GAIN`` (the replay's answer
    is as sure as the move that made it, and the clustering's separations no longer apply);
    where it moved none, every rank another place explains better by ``DOUBT``. None with
    one clear rank."""
    movable = sorted(i for members in fit.groups for i in members
                     if reassess is None or i not in fit.blind)
    if len(movable) < 2 or not observed:
        return None
    fitted = fit.racks()
    replay = replay_racks(fitted, observed, movable, seconds=SEARCH_SECONDS, starts=starts, hosts=hosts)
    # beside blind ranks, whose flows moved nobody and may put them with the ranks that
    # moved, those are only as sure as the blind ranks' places
    moved = moved_ranks(fitted, replay.racks) & set(movable) if replay.moves and fit.blind else set()
    if moved and reassess is None:
        # not taken: the ranks the replay would move are doubted, and the margins are the
        # fitted answer's own
        replay = replay_racks(fitted, observed, movable, min_gain=math.inf, hosts=hosts)
        fit.unexplained = moved | {i for i, m in replay.margins.items() if m < -DOUBT}
        return replay
    if replay.moves:
        adopt(fit, replay.racks, movable, "replay", reassess)
    bar = MIN_GAIN if replay.moves else -DOUBT
    fit.unexplained = moved | {i for i, m in replay.margins.items() if m < bar}
    if replay.doubt_one_rack:
        fit.unexplained = set(movable)
    return replay
