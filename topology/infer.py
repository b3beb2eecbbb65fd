"""Infer racks and classify contention from measured latency and bandwidth matrices.

Pure functions on plain arrays (numpy, scipy; no torch), so they are tested exhaustively on
synthetic matrices. ``dssync probe`` feeds them what it measured; the planner consumes
their result through ``topology.json`` (DESIGN section 2; the two contention kinds are
the paper's Fig. 5, a slow rack uplink, and Fig. 6, a slow end-host NIC).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
from scipy.cluster.hierarchy import DisjointSet, fcluster, linkage
from scipy.spatial.distance import squareform

__all__ = ["DEFAULT_SLOW_RATIO", "RackFit", "blind_ranks", "classify_contention", "clear_latency", "fan_clears",
           "filled", "fit_racks", "held", "infer_racks", "nic_suspects", "place_behind_standing_queue", "place_blind", "renumber_racks", "slow_keys"]

DEFAULT_RACK_GAP = 0.5
DEFAULT_SLOW_RATIO = 0.6


def _square(name: str, value: Any, n: int | None = None) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or (n is not None and arr.shape[0] != n):
        want = "a square matrix" if n is None else f"a {n}x{n} matrix"
        raise ValueError(f"{name} must be {want}, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite, non-negative numbers; re-run the probe")
    return arr


def _nearest(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cost`` symmetrised, and each rank's smallest cost to any other rank."""
    sym = (cost + cost.T) / 2.0
    return sym, (sym + np.diag(np.full(len(sym), np.inf))).min(axis=1)


def _ratio_to_nearest(cost: np.ndarray) -> np.ndarray | None:
    """Symmetrised ``cost`` divided by the typical nearest-neighbour cost (``None``: unusable).

    The scale is the median over ranks of each rank's smallest cost to any other rank: in a
    rack of two or more, a rank's nearest neighbour is a rack-mate, so this is the intra-rack
    level, whatever the absolute numbers (loopback, 1 GbE, InfiniBand).
    """
    sym, nearest = _nearest(cost)
    base = float(np.median(nearest))
    if not np.isfinite(base) or base <= 0:
        return None
    out = sym / base
    np.fill_diagonal(out, 0.0)
    return out


def _bandwidth_cost(bw: np.ndarray, slow_ratio: float = DEFAULT_SLOW_RATIO,
                    queued: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """How many times slower each pair's path is than its endpoints' NICs allow.

    Direction by direction, a flow ``i -> j`` costs ``min(out_i, in_j) / bw[i, j]``, where
    ``out_i`` is ``i``'s best outgoing flow and ``in_j`` is ``j``'s best incoming flow: what
    the two NICs allow, over what the path gave. A pair costs the worse of its two directions,
    because a shared link between racks may be contended one way only (traffic leaving a
    rack). A direction whose sending NIC (or receiving NIC) is itself slow, its best flow below
    ``slow_ratio`` times the median rank's, says nothing about the path (every flow through
    that NIC is slow alike) and is left out, so a rank whose NIC is shared with another job
    still joins its rack through its clear direction (for a ``queued`` rank, the loaded
    direction is left out, see ``_slow_ends``). Also returns which pairs had such an
    informative direction (a rank whose NIC is slow both ways sees no path at all).
    """
    bw = bw.copy()
    np.fill_diagonal(bw, 0.0)
    out_best, in_best = bw.max(axis=1), bw.max(axis=0)
    cost = np.full_like(bw, np.nan)
    np.divide(np.minimum.outer(out_best, in_best), bw, out=cost, where=bw > 0)
    blind = np.logical_or.outer(*_slow_ends(bw, slow_ratio, queued))
    seen = np.where(blind, np.nan, cost)
    known = ~np.isnan(seen) | ~np.isnan(seen.T)
    with np.errstate(invalid="ignore"):
        pair = np.fmax(seen, seen.T)  # NaN-skipping: the informative direction decides
        pair = np.where(np.isnan(pair), np.fmin(cost, cost.T), pair)  # both blind: the clearer one
    # A pair never measured (0 Gbit/s) says nothing: give it the worst cost seen.
    finite = pair[np.isfinite(pair)]
    pair[~np.isfinite(pair)] = finite.max() if finite.size else 1.0
    np.fill_diagonal(pair, 0.0)
    return pair, known & (bw > 0) & (bw.T > 0)


def renumber_racks(labels: Sequence[int]) -> list[int]:
    """Relabel racks ``0..R-1`` in order of their lowest rank (the topology.json rule)."""
    seen: dict[int, int] = {}
    return [seen.setdefault(int(label), len(seen)) for label in labels]


#: A flow below this fraction of what its two NICs allow was held back by a link between them
#: (an uplink): a rack-mate's flow in a round of disjoint pairs only shares the two NICs.
CROSS_RATIO = 0.5
#: A boundary, or a worker's place, is confident when every worker it separates is at least
#: this many times farther (on average) from the other rack than from its own.
CONFIDENT_MARGIN = 1.25
#: A path is clear (no queue on it) up to this many times the typical nearest-neighbour
#: latency (``clear_latency``).
DELAY_RATIO = 3.0
#: A ping that waited behind a full queue during a blast took at least this many times its
#: idle time (``held``). Recorded on the emulated racks (5 ms tbf queues): waits behind a
#: blast's queue took 6.6 to 41 times their idle time (0.5 to 3.2 ms), while pings that only
#: met a busy host during a blast took at most 4.6 times (0.24 ms); at three times, two
#: such pings placed a worker of a 2,5 layout in the wrong rack with confidence.
WAIT_RATIO = 5.0
#: A blast is sharp (a queue filled at a link its members share) when they sent below this
#: fraction of what their NICs carried alone.
SHARP_RATIO = 0.6
#: A rank's fan (flows to or from every other rank at once) clears its NIC when it carried at
#: least this fraction of what its flows got alone, one bottleneck each: a NIC that bounds its
#: flows carries about its single-flow rate however many there are (1/2 of that sum with two
#: bottlenecks, less with more), a NIC that does not carries all of it.
FAN_RATIO = 0.75


@dataclass
class RackFit:
    """What the measurements say about the racks, before and after the placement phase.

    ``groups`` are the racks of the *clear* ranks (those with at least one direction whose
    NIC is not itself the bottleneck), clustered on their paths. A *blind* rank's NIC is
    slow both ways, so every flow of it is slow alike and its paths show nothing; it is not a
    rack of its own and not a member of whichever rack looks closest: ``candidates`` lists the
    groups its flows did not rule out (a flow well below what both NICs allow crossed an
    uplink), and ``placed`` what the placement phase decided (``place_blind``). A blind rank
    with no decision is ``unplaced`` and gets a rack of its own in ``racks()``: that never puts
    a cross-rack flow where the plan thinks there is none.
    """

    n: int
    groups: list[list[int]]
    blind: list[int] = field(default_factory=list)
    candidates: dict[int, list[int]] = field(default_factory=dict)  # blind rank -> group indices
    placed: dict[int, int | None] = field(default_factory=dict)  # blind rank -> group index, None: alone
    evidence: dict[int, str] = field(default_factory=dict)
    margins: dict[int, float] = field(default_factory=dict)  # clear rank -> separation from the next group
    metric: str = "none"
    #: blind ranks placed only because every other group was ruled out: a rack of their own
    #: was never ruled out, so the probe's pings test them again, and until then they are unsure
    tentative: set[int] = field(default_factory=set)

    @property
    def unplaced(self) -> list[int]:
        return sorted(j for j in self.blind if j not in self.placed)

    def racks(self) -> list[int]:
        labels = [-1] * self.n
        for g, members in enumerate(self.groups):
            for i in members:
                labels[i] = g
        fresh = len(self.groups)
        for j in self.blind:
            where = self.placed.get(j)
            if where is None:
                labels[j] = fresh
                fresh += 1
            else:
                labels[j] = where
        return renumber_racks(labels)

    def confidence(self) -> dict[str, Any]:
        """The ``confidence`` record of topology.json (racks numbered as in ``racks()``)."""
        racks = self.racks()
        by_group = {g: racks[members[0]] for g, members in enumerate(self.groups) if members}
        boundaries = []
        for a in range(len(self.groups)):
            for b in range(a + 1, len(self.groups)):
                ranks = [i for i in self.groups[a] + self.groups[b] if i in self.margins]
                sep = min((self.margins[i] for i in ranks), default=float("inf"))
                boundaries.append({"racks": [by_group[a], by_group[b]],
                                   "separation": round(sep, 3) if np.isfinite(sep) else None,
                                   "confident": bool(sep >= CONFIDENT_MARGIN)})
        unsure = sorted({i for i, m in self.margins.items() if m < CONFIDENT_MARGIN and len(self.groups) > 1}
                        | self.tentative)
        return {
            "metric": self.metric,
            "threshold": CONFIDENT_MARGIN,
            "boundaries": boundaries,
            "placed": [{"rank": j, "rack": racks[j], "how": self.evidence.get(j, "")}
                       for j in sorted(self.placed)],
            "unplaced": self.unplaced,
            "unsure": unsure,
            "confident": not self.unplaced and not unsure,
        }


def _slow_ends(bw: np.ndarray, slow_ratio: float, queued: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, whether its best outgoing and its best incoming flow (diagonal zero) are
    below ``slow_ratio`` of the median rank's: its NIC, not the path, bounds that direction.
    A ``queued`` rank (``queued_ranks``) shares its NIC with another job, so its loaded
    direction counts as slow even where one lucky flow of it ran fast (``_loaded``)."""
    out_best, in_best = bw.max(axis=1), bw.max(axis=0)
    out_slow, in_slow = out_best < slow_ratio * np.median(out_best), in_best < slow_ratio * np.median(in_best)
    for i in queued:
        if not (out_slow[i] or in_slow[i]):
            (out_slow if _loaded(bw, i) == "out" else in_slow)[i] = True
    return out_slow, in_slow


def _loaded(bw: np.ndarray, i: int) -> str:
    """The direction of rank ``i``'s NIC that another job's flows load: the one whose median
    flow is slower (``"out"`` or ``"in"``; diagonal zero)."""
    others = np.arange(len(bw)) != i
    return "out" if np.median(bw[i, others]) <= np.median(bw[others, i]) else "in"


def queued_ranks(latency_us: Any) -> list[int]:
    """Ranks behind a standing queue at their own NIC: even their fastest ping to anyone
    waits (above ``clear_latency``). Another job's flows fill that queue, so the rank's NIC
    is contended (paper Fig. 6) however fast one flow of it ran in a lull of that job's."""
    lat = _square("latency_us", latency_us)
    return np.flatnonzero(_nearest(lat)[1] > clear_latency(lat)).tolist()


def blind_ranks(bandwidth_gbps: Any, slow_ratio: float = DEFAULT_SLOW_RATIO) -> list[int]:
    """Ranks whose best flow is slow both ways (below ``slow_ratio`` of the median rank's)."""
    bw = _square("bandwidth_gbps", bandwidth_gbps).copy()
    np.fill_diagonal(bw, 0.0)
    out_slow, in_slow = _slow_ends(bw, slow_ratio)
    return np.flatnonzero(out_slow & in_slow).tolist()


def infer_racks(
    latency_us: Any,
    bandwidth_gbps: Any | None = None,
    hosts: Sequence[str] | None = None,
    *,
    gap: float = DEFAULT_RACK_GAP,
) -> list[int]:
    """The rack of every rank, racks numbered ``0..R-1`` in order of their lowest rank
    (``fit_racks(...).racks()``: a blind rank that the pairs alone cannot place is a rack of
    its own)."""
    return fit_racks(latency_us, bandwidth_gbps, hosts, gap=gap).racks()


def fit_racks(
    latency_us: Any,
    bandwidth_gbps: Any | None = None,
    hosts: Sequence[str] | None = None,
    *,
    gap: float = DEFAULT_RACK_GAP,
    slow_ratio: float = DEFAULT_SLOW_RATIO,
) -> RackFit:
    """Racks from pairwise latency and bandwidth, with how sure each boundary is.

    Rule: for each metric, each pair gets a distance that says how many times worse than a
    typical rack-mate it is, ``latency / L0`` or ``c / C0``, where ``c`` is the pair's
    bandwidth cost, how many times slower its path is than its two NICs allow, in its worse
    direction (``_bandwidth_cost``: directions through a slow NIC are left out, so a NIC
    shared with another job, which slows all of a rank's flows alike, is no rack boundary),
    and ``L0``, ``C0`` are the median over ranks of each rank's smallest (nearest-neighbour)
    latency and cost. Each pair's distance is then raised to how differently the two ranks
    see the others (``_with_profile``), so that one cross-rack flow that had an uplink to
    itself cannot join two racks. Ranks are clustered by average linkage
    (``scipy.cluster.hierarchy``) and two clusters are one rack while their average distance
    is at most ``1 + gap`` (relative to the typical nearest-neighbour cost; the default 0.5
    splits racks whose cross traffic is 1.5x worse: two flows sharing an uplink already halve
    it). A metric is used only when its own clustering separates cleanly (the 10th percentile
    of distances between its clusters above the 90th percentile within them), so a metric
    that is only noise is ignored; when both separate, bandwidth decides, because under load
    latency measures queues (a saturated NIC or uplink adds milliseconds to every round trip
    through it) more than racks. Latency decides when bandwidth shows no structure (racks that
    differ only in distance). A uniform matrix, loopback included, gives one rack.

    Bandwidth clusters only the clear ranks; a *blind* rank (slow NIC both ways,
    ``blind_ranks``) is placed apart (``RackFit``): a group is ruled out when one of its flows
    with a member ran below ``CROSS_RATIO`` of what both NICs allow, and a blind rank with one
    group left, every other group ruled out, is placed there. Others wait for the probe's
    placement phase (``place_blind``).

    Each clear rank's *margin* is how many times farther (average distance) it is from the
    nearest other rack than from its own (a rack of one: than a typical rack-mate, 1);
    a boundary is as sure as the least sure rank it separates (``CONFIDENT_MARGIN``).

    ``hosts`` (hostname per rank) is a hint: ranks on the same host are one machine and so
    one rack; it merges clusters, it never splits them (a two-rank world, or a matrix with
    no structure, can only be told apart by it).
    """
    if gap <= 0:
        raise ValueError(f"gap must be positive (a relative margin such as 1.0), got {gap}")
    lat = _square("latency_us", latency_us)
    n = lat.shape[0]
    if hosts is not None and len(hosts) != n:
        raise ValueError(f"hosts names {len(hosts)} ranks but latency_us has {n}; give one host per rank")
    if n < 2:
        return RackFit(n=n, groups=[list(range(n))] if n else [])
    bw = None if bandwidth_gbps is None else _square("bandwidth_gbps", bandwidth_gbps, n)
    blind = blind_ranks(bw, slow_ratio) if bw is not None and n > 2 else []
    clear = [i for i in range(n) if i not in blind]
    if len(clear) < 2:  # nothing clear to cluster on: bandwidth says nothing
        blind, clear = [], list(range(n))
    # A rank whose pings to everyone wait sits behind a queue of its own (its NIC shared with
    # another job's flows): that is no rack boundary, so latency clusters the others only.
    clear_us = clear_latency(lat)
    queued = queued_ranks(lat)
    lat_ranks = [i for i in range(n) if i not in queued] if n - len(queued) >= 2 else list(range(n))
    lat_sub = np.ix_(lat_ranks, lat_ranks)
    choices: list[tuple[str, list[int], np.ndarray | None]] = [
        ("latency", lat_ranks, _with_profile(_ratio_to_nearest(lat[lat_sub]), np.ones((len(lat_ranks),) * 2, dtype=bool),
                                             gap))]
    held_back: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # bandwidth ratio, known pairs, steady ranks
    if bw is not None:
        cost, known = _bandwidth_cost(bw, slow_ratio, queued)
        sub = np.ix_(clear, clear)
        out_slow, in_slow = _slow_ends(np.where(np.eye(n, dtype=bool), 0.0, bw), slow_ratio, queued)
        ratio = _ratio_to_nearest(cost[sub])
        if ratio is not None:
            held_back = (ratio, known[sub], ~(out_slow | in_slow)[clear])
        choices.append(("bandwidth", clear, _with_profile(ratio, known[sub], gap)))

    def clusters(metric: str, dist: np.ndarray) -> list[int]:
        labels = _cluster(dist, gap)
        if metric != "bandwidth" or held_back is None:
            return labels
        ratio, known_sub, steady = held_back
        return _merge_unseparated(labels, ratio, known_sub, steady, gap)

    # A metric speaks only if its clusters are clearly apart: on a busy host, ping-pong
    # latency can be pure scheduling noise (hundreds of µs on some pairs), and taking the
    # worse of a noisy metric and a clean one would split racks at random. Bandwidth also
    # speaks when its flows show every boundary (``_evidenced``), lucky cross-rack pairs or not.
    labelled = [(c, clusters(c[0], c[2])) for c in choices if c[2] is not None]
    informative = [(c, labels) for c, labels in labelled if _separated(c[2], labels)
                   or (c[0] == "bandwidth" and held_back is not None and _evidenced(labels, *held_back[:2], gap))]
    if informative:
        (metric, ranks, dist), labels = informative[-1]  # bandwidth first
    else:
        metric, ranks, dist, labels = "none", clear, None, [0] * len(clear)
    if metric == "latency" and bw is not None and not _far_apart(lat, ranks, labels, clear, clear_us):
        # Bandwidth saw one rack of clear ranks. Latency may split those only by a gap no busy
        # host or half-drained queue makes: on a 3,1 layout whose rack 0 carried another job's
        # flows, pings of 80 against 130 us split its three workers, and on a 4,1 layout one
        # round trip of 1.9 ms (192 us the other way) split four rack-mates three ways.
        metric, ranks, dist, labels = "bandwidth", clear, None, [0] * len(clear)
    if metric == "latency":
        blind = [i for i in range(n) if i not in ranks]  # latency does not see NIC rates, only queues
    groups_by_label: dict[int, list[int]] = {}
    for rank, label in zip(ranks, labels, strict=True):
        groups_by_label.setdefault(label, []).append(rank)
    groups = list(groups_by_label.values())
    if hosts is not None:
        groups = _merge_groups_by_host(groups, hosts)
    fit = RackFit(n=n, groups=sorted(groups, key=min), blind=blind, metric=metric)
    if dist is not None and len(fit.groups) > 1:
        fit.margins = _margins(dist, ranks, fit.groups)
    if bw is not None and blind:
        _rule_out(fit, bw, hosts)
        _rule_out_by_queue(fit, lat, clear_us)
        by_latency = [(c[1], labels) for c, labels in informative if c[0] == "latency"]
        if metric == "bandwidth" and by_latency:
            _place_by_latency(fit, dict(zip(*by_latency[0], strict=True)))
    return fit


#: Above this many clusters (ranks, for the search over ranks) the fewest-racks search is
#: skipped: it is exact, and in the worst case grows like the partitions of its units.
MERGE_SEARCH_GROUPS = 12


def _fewest_racks(units: list[list[int]], ratio: np.ndarray, known: np.ndarray, gap: float,
                  prefer: list[int] | None = None) -> list[list[int]]:
    """The fewest racks, each a union of whole ``units`` (lists of rank indices), that keep
    together no pair held back (a ``ratio`` above ``1 + gap``) or never measured through
    clear NICs (``known``); among those, the one that agrees best with ``prefer`` (a label
    per rank: fewest units joined that it keeps apart, and kept apart that it joins), then
    whose joined pairs ran fastest. Exact branch and bound: a unit joins a rack only if it
    fits every unit there."""
    m = len(units)
    between = [[ratio[np.ix_(units[a], units[b])] for b in range(m)] for a in range(m)]
    fits = [[a != b and bool(known[np.ix_(units[a], units[b])].all()) and float(between[a][b].max()) <= 1.0 + gap
             for b in range(m)] for a in range(m)]
    agree = [[0.0 if prefer is None else (1.0 if prefer[units[a][0]] != prefer[units[b][0]] else -1.0)
              for b in range(m)] for a in range(m)]
    weight = [[agree[a][b] + 1e-3 * float(between[a][b].mean()) for b in range(m)] for a in range(m)]
    best: list[Any] = [m + 1, float("inf"), [[u] for u in range(m)]]

    def search(k: int, sets: list[list[int]], score: float) -> None:
        # joining never lowers the score without ``prefer``; with it, only the count prunes
        if len(sets) > best[0] or (prefer is None and len(sets) == best[0] and score >= best[1]):
            return
        if k == m:
            if len(sets) < best[0] or score < best[1]:
                best[:] = [len(sets), score, [list(s) for s in sets]]
            return
        for s in sets:
            if all(fits[k][g] for g in s):
                s.append(k)
                search(k + 1, sets, score + sum(weight[k][g] for g in s[:-1]))
                s.pop()
        sets.append([k])
        search(k + 1, sets, score)
        sets.pop()

    if any(any(row) for row in fits):
        search(0, [], 0.0)
    return [sorted(i for u in s for i in units[u]) for s in best[2]]


def _labels(groups: list[list[int]], n: int) -> list[int]:
    out = [0] * n
    for label, members in enumerate(groups):
        for i in members:
            out[i] = label
    return out


def _merge_unseparated(labels: list[int], ratio: np.ndarray, known: np.ndarray, steady: np.ndarray,
                       gap: float) -> list[int]:
    """Clusters (``labels``, one per rank of ``ratio``) joined into the fewest racks that keep
    together no pair whose flow was held back; where the ranks fit a partition that the flows
    evidence (``_evidenced``) in fewer racks, or in as many while the clusters keep such a
    pair, that partition. Where a cluster keeps a held-back pair of two ``steady`` ranks
    (NICs clear both ways), the fewest racks that keep every held-back pair apart.

    In a round of disjoint pairs a rack-mate's flow shares only its two NICs, so a pair whose
    path ran more than ``1 + gap`` times slower than both NICs allow (``ratio``: its bandwidth
    cost over the typical nearest-neighbour cost) crossed a link some other flow of its round used: the two are in
    different racks. A fast flow proves nothing (a cross-rack pair alone on its uplink in its
    round runs at full speed), and with few ranks two such lucky flows outvote a rack-mate's
    in ``_with_profile`` and split a rack (2,3 with another job on a NIC: one rack of three
    came out as three), or one lucky flow pulls a rank into the wrong rack on average
    linkage. So clusters merge when every pair between them was measured through clear NICs
    (``known``) and none was held back (``_fewest_racks``). A held-back pair inside a cluster
    is not always a boundary: a NIC shared with another job's flow one way holds back some
    of its rack-mates' flows that way too, and then no partition is evidenced and the
    clusters stand; between two ranks whose NICs are clear both ways it is (1,3,5: rank 0's
    flows to ranks 1 and 2 had the uplinks to themselves, its flow to rank 3 ran at 0.61 of
    both NICs, and linkage put it in their rack). Exact searches over up to ``MERGE_SEARCH_GROUPS`` clusters, and ranks.
    """
    keys = sorted(set(labels))
    if len(keys) > MERGE_SEARCH_GROUPS:
        return labels
    n = len(labels)
    merged = _labels(_fewest_racks([[i for i in range(n) if labels[i] == key] for key in keys], ratio, known, gap), n)
    if n <= MERGE_SEARCH_GROUPS:
        by_rank = _labels(_fewest_racks([[i] for i in range(n)], ratio, known, gap, merged), n)
        fewer = len(set(by_rank)) < len(set(merged)) or (
            len(set(by_rank)) == len(set(merged)) and not _evidenced(merged, ratio, known, gap))
        if fewer and _evidenced(by_rank, ratio, known, gap):
            return by_rank
        lab = np.asarray(merged)
        inside = np.equal.outer(lab, lab) & np.logical_and.outer(steady, steady) & known
        if np.any(ratio[inside] > 1.0 + gap):
            return by_rank  # a held-back flow between two ranks whose NICs are clear both ways
    return merged


def _evidenced(labels: list[int], ratio: np.ndarray, known: np.ndarray, gap: float) -> bool:
    """Whether the flows show every boundary of ``labels`` and none inside: two racks or
    more, no pair inside a rack held back (above ``1 + gap`` of the typical nearest cost,
    see ``_merge_unseparated``), and between every two racks most pairs held back. Lucky
    cross-rack pairs (alone on their uplinks in their round) are a minority of their
    boundary's pairs and do not hide it, as they do ``_separated``'s percentiles."""
    lab = np.asarray(labels)
    if len(set(labels)) < 2:
        return False
    same = np.equal.outer(lab, lab) & ~np.eye(len(lab), dtype=bool)
    if np.any(ratio[same & known] > 1.0 + gap):
        return False
    for a, b in combinations(sorted(set(labels)), 2):
        pairs = np.ix_(lab == a, lab == b)
        cross = ratio[pairs][known[pairs]]
        if cross.size == 0 or float(np.median(cross)) <= 1.0 + gap:
            return False
    return True


def _far_apart(lat: np.ndarray, ranks: list[int], labels: list[int], among: list[int], clear_us: float) -> bool:
    """Whether the latency clusters ``labels`` (of ``ranks``) keep every two of the ``among``
    ranks they separate more than ``clear_us`` apart, in both directions."""
    label = dict(zip(ranks, labels, strict=True))
    both = np.minimum(lat, lat.T)
    cross = [both[i, k] for i in among for k in among if i < k and label.get(i) != label.get(k)]
    return bool(cross) and min(cross) > clear_us


def clear_latency(latency_us: np.ndarray) -> float:
    """One-way µs up to which a path is clear (no queue on it): ``DELAY_RATIO`` times the
    median rank's nearest-neighbour latency."""
    return DELAY_RATIO * float(np.median(_nearest(latency_us)[1]))


def _rule_out_by_queue(fit: RackFit, lat: np.ndarray, clear_us: float) -> None:
    """A blind rank's candidate groups narrowed by queues that other traffic keeps full.

    A slow NIC does not slow a small message, so a blind rank's pings still show its paths.
    If its pings to some member of one group are clear (latency at most ``clear_us``) and to
    every member of another group wait, a full queue sits on its paths to the second group
    and none on its paths to the first (the fastest ping counts, because a busy host only
    ever delays one, and a member whose own NIC is queued does not speak for its rack). Its
    NIC is then not queued (the clear pings pass it), and a rack-mate's path crosses nothing
    else, so it is not in the second group. (Whether it is in the first, or on a rack of its own with the queue at the
    second group's uplink, pings at rest cannot say; the blasts' pings do.)
    """
    if len(fit.groups) < 2:
        return
    sym = _nearest(lat)[0]
    for j in fit.blind:
        if j in fit.placed or not fit.candidates.get(j):
            continue
        typical = [float(min(sym[j, k] for k in members)) for members in fit.groups]
        if any(t <= clear_us for t in typical):
            waits = [g for g, t in enumerate(typical) if t > clear_us]
            fit.candidates[j] = [g for g in fit.candidates[j] if g not in waits]
            if waits:
                fit.evidence[j] = "latency: its pings to group(s) " + ", ".join(map(str, waits)) + " wait in a queue"


def place_behind_standing_queue(fit: RackFit, latency_us: Any, clear_us: float, slow_groups: Sequence[int]) -> RackFit:
    """Place a blind rank behind its rack's standing queue: another job's flows that keep
    group ``g``'s uplink busy (``slow_groups``: the flows found that uplink slow) hold every
    round trip between a member of ``g`` and the rest of the world, whichever way they go.
    A blind rank whose pings to ``g`` are clear (at most ``clear_us`` one way) while its
    pings to every other group wait, as ``g``'s members' pings to every other group do,
    reaches ``g`` without crossing that queue: it is in ``g``. (Outside, its pings to ``g``
    would wait; a queue at its own NIC would hold them all.) The blasts cannot place it: its
    ping out of ``g`` waits at rest already, and a group of two has no member to spare."""
    if len(fit.groups) < 2:
        return fit
    sym = _nearest(_square("latency_us", latency_us, fit.n))[0]
    for j in fit.blind:
        if j in fit.placed and j not in fit.tentative:
            continue
        clear_to = [g for g, members in enumerate(fit.groups) if min(sym[j, k] for k in members) <= clear_us]
        if len(clear_to) != 1 or clear_to[0] not in slow_groups or clear_to[0] not in fit.candidates.get(j, []):
            continue
        g = clear_to[0]
        others = [k for h, members in enumerate(fit.groups) if h != g for k in members]
        if all(sym[i, k] > clear_us for i in fit.groups[g] for k in others):
            fit.placed[j] = g
            fit.tentative.discard(j)
            fit.evidence[j] = (f"its pings reach group {g} clear and wait to every other group, as its members' "
                               "do behind their uplink's standing queue")
    return fit


def _place_by_latency(fit: RackFit, lat_labels: dict[int, int]) -> None:
    """Where latency separates racks the same way bandwidth does on the clear ranks, it
    places the blind ranks too (a slow NIC does not slow a small message). ``lat_labels``:
    the latency cluster of each rank it clustered (not those behind a queue of their own).
    With one group of clear ranks there is no boundary for latency to agree on, and a blind
    rank's clear pings to the group say nothing: an outsider's are as clear where no queue
    sits between (1,3,1 with another job leaving rack 1, whose queue had drained while the
    pings ran: the rack of one came out inside rack 1)."""
    if len(fit.groups) < 2:
        return
    label_of = {}
    for g, members in enumerate(fit.groups):
        labels = {lat_labels.get(i) for i in members}
        if len(labels) != 1 or None in labels or labels & set(label_of):
            return  # latency disagrees with bandwidth: it does not speak for the blind ranks
        label_of[labels.pop()] = g
    for j in fit.blind:
        if j not in fit.placed and j in lat_labels:
            fit.placed[j] = label_of.get(lat_labels[j])
            fit.evidence[j] = "latency" if fit.placed[j] is not None else "latency: apart from every rack"


def _margins(dist: np.ndarray, ranks: list[int], groups: list[list[int]]) -> dict[int, float]:
    """Each clustered rank's mean distance to the nearest other group over that to its own."""
    where = {r: k for k, r in enumerate(ranks)}
    out = {}
    for g, members in enumerate(groups):
        for i in members:
            row = dist[where[i]]
            own = [row[where[k]] for k in members if k != i]
            far = min(float(np.mean([row[where[k]] for k in other])) for h, other in enumerate(groups) if h != g)
            out[i] = far / max(float(np.mean(own)) if own else 1.0, 1e-9)
    return out


def _rule_out(fit: RackFit, bw: np.ndarray, hosts: Sequence[str] | None) -> None:
    """Candidates of each blind rank; place those that the pairs leave one group for."""
    off = bw.copy()
    np.fill_diagonal(off, 0.0)
    out_best, in_best = off.max(axis=1), off.max(axis=0)

    def crossed(a: int, b: int) -> bool:
        """A flow between ``a`` and ``b`` ran below CROSS_RATIO of what both NICs allow."""
        return any(min(out_best[s], in_best[d]) > 0 and off[s, d] < CROSS_RATIO * min(out_best[s], in_best[d])
                   for s, d in ((a, b), (b, a)))

    for j in fit.blind:
        host_mate = next(((g, k) for g, members in enumerate(fit.groups) for k in members
                          if hosts is not None and hosts[j] == hosts[k]), None)
        if host_mate is not None:
            fit.placed[j] = host_mate[0]  # one host, one rack
            fit.evidence[j] = f"same host as rank {host_mate[1]}"
            continue
        left = [g for g, members in enumerate(fit.groups) if not any(crossed(j, k) for k in members)]
        fit.candidates[j] = left
        if len(left) == 1 and len(fit.groups) > 1:
            fit.placed[j] = left[0]
            fit.tentative.add(j)
            fit.evidence[j] = "its flows to every other rack crossed an uplink"
    # Blind ranks whose flows crossed an uplink to every clear rack sit in racks of blind ranks
    # only: those whose flows to each other crossed nothing are one rack.
    homeless = [j for j in fit.blind if j not in fit.placed and not fit.candidates.get(j) and len(fit.groups) > 0]
    while homeless:
        j = homeless.pop(0)
        mates = [k for k in homeless if not crossed(j, k)]
        mates = [k for k in mates if all(not crossed(k, m) for m in mates if m != k)]
        if not mates:
            continue  # alone, as far as the pairs tell: the placement phase may still say so
        fit.groups.append(sorted([j, *mates]))
        for k in [j, *mates]:
            fit.placed[k] = len(fit.groups) - 1
            fit.evidence[k] = "its flows crossed an uplink to every rack but that of ranks " + ", ".join(
                str(m) for m in [j, *mates] if m != k)
            if k in homeless:
                homeless.remove(k)


def held(ping: tuple[float, float] | None, clear_us: float, full: bool) -> bool | None:
    """Whether a ping ``(during, idle)`` waited behind a blast's queue (µs one way): it was
    clear at rest (at most ``clear_us``) and not during the blast (above both ``clear_us``
    and ``WAIT_RATIO`` times its idle time). ``None`` when the ping cannot tell: none was
    sent, it was behind a queue of other traffic at rest already, or the blast's queue was
    not known to be ``full`` (then a wait may be another queue's: another job's flows
    across an uplink now and then drain its queue, so one fast ping at rest proves little,
    and a blast that its receivers hold back fills no queue at its own uplink)."""
    if ping is None or not full or not 0 < ping[1] <= clear_us:
        return None
    return bool(ping[0] > max(clear_us, WAIT_RATIO * ping[1]))


def filled(spare: tuple[float, float], clear_us: float, uplink_slow: bool) -> bool:
    """Whether a blast's queue was full, from its spare member's ping out ``(during, idle)``
    (µs one way): it waited (``held``). A ping behind a queue at rest already cannot say
    whether the blast filled one: the queue is the group's own uplink's, full blast or not,
    when the pairs found that uplink slow (``uplink_slow``: another job's flows leave the
    rack), and may be the far side's otherwise (the echo's rack's), which tells nothing."""
    verdict = held(spare, clear_us, True)
    return verdict if verdict is not None else spare[0] > clear_us and uplink_slow


def place_blind(fit: RackFit, delays: dict[int, dict[int, dict[str, tuple[float, float]]]],
                full: dict[int, bool], clear_us: float = float("inf")) -> RackFit:
    """Decide the blind ranks from the queues of the probe's egress blasts (``dssync.topology.probe``).

    During the blast of group ``g`` its clear members send across at once, so a queue fills
    at ``g``'s uplink, the link they all share (``full[g]``: it did). Every undecided blind
    rank meanwhile pings, with small messages, a quiet rank outside ``g`` (``"out"``) and,
    where ``g`` has a member to spare, a quiet member of ``g`` (``"in"``): ``delays[j][g][k]``
    is ``(one-way µs during the blast, its lower quartile; one-way µs between the same ranks
    at rest, the fastest)``. A round trip crosses ``g``'s uplink queue outwards exactly when one
    end is in ``g`` and the other is not: so a ping to the outside waits (``WAIT_RATIO``
    times its idle time or more; on the emulated racks 1 to 2.5 ms against 0.15 to 0.3 ms)
    if ``j`` is in ``g``, and a ping to the inside waits if it is not. A slow NIC does not
    slow a small message, so this sees the path of a rank whose flows cannot. What a ping
    can and cannot tell is ``held``'s rule; where the two pings of a group disagree, the
    group says nothing.

    ``j`` is placed in the one candidate group whose pings say it is a member; on a rack of
    its own when every candidate's pings say it is not, unless another blind
    rank also came out alone (two such could share a rack that no blast tests). Anything
    else stays unplaced.
    """
    alone = []
    for j in fit.blind:
        if (j in fit.placed and j not in fit.tentative) or not delays.get(j):
            continue
        verdicts: dict[int, bool | None] = {}
        for g in fit.candidates.get(j, []):
            pings = delays[j].get(g, {})
            out = held(pings.get("out"), clear_us, full.get(g, False))
            inside = held(pings.get("in"), clear_us, full.get(g, False))
            says = {v for v in (out, None if inside is None else not inside) if v is not None}
            verdicts[g] = says.pop() if len(says) == 1 else None
        inside_of = [g for g, v in verdicts.items() if v is True]
        if len(inside_of) == 1:
            fit.placed[j] = inside_of[0]
            fit.tentative.discard(j)
            fit.evidence[j] = f"its pings crossed group {inside_of[0]}'s uplink queue as a member's do"
        elif verdicts and all(v is False for v in verdicts.values()):
            alone.append(j)
    if len(alone) == 1:
        fit.placed[alone[0]] = None
        fit.tentative.discard(alone[0])
        fit.evidence[alone[0]] = "its pings crossed every rack's uplink queue as an outsider's do"
    return fit


def _merge_groups_by_host(groups: list[list[int]], hosts: Sequence[str]) -> list[list[int]]:
    """Groups joined wherever two of their ranks share a host (never split)."""
    ranks = [i for members in groups for i in members]
    union = DisjointSet(ranks)
    for members in groups:
        for i in members[1:]:
            union.merge(members[0], i)
    first: dict[str, int] = {}
    for i in ranks:
        union.merge(first.setdefault(hosts[i], i), i)
    return [sorted(subset) for subset in union.subsets()]


def _with_profile(ratio: np.ndarray | None, known: np.ndarray, gap: float) -> np.ndarray | None:
    """``ratio`` raised, pair by pair, to how differently the two ranks see everyone else.

    One pair's figure can mislead: a flow between two racks that happened to have their
    uplink to itself in its round runs at full speed, like a rack-mate's. Rack-mates also
    agree about third parties (both near, or both far), so a pair's profile distance is the
    median over the other ranks ``k`` of ``max(c_ik, c_jk) / min(c_ik, c_jk)``, with costs
    clipped to ``[1, 1 + 2 gap]`` (beyond a clear rack boundary, how far does not matter),
    and the pair's distance is the larger of its own ratio and that median. The median
    needs most third parties to disagree, so it only speaks when the two ranks' racks hold
    most of the world, and then it outvotes one lucky measurement. Only third parties that
    both ranks measured informatively (``known``) vote.
    """
    if ratio is None:
        return None
    n = len(ratio)
    clipped = np.clip(ratio, 1.0, 1.0 + 2.0 * gap)
    np.fill_diagonal(clipped, 1.0)
    out = ratio.copy()
    if n < 3:
        return out
    for i in range(n):
        spread = np.maximum(clipped[i], clipped) / np.minimum(clipped[i], clipped)  # [j, k]
        spread[~(known[i] & known)] = np.nan  # k unseen by i or by j
        spread[:, i] = np.nan
        np.fill_diagonal(spread, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no voter: the pair's own ratio
            out[i] = np.fmax(ratio[i], np.nanmedian(spread, axis=1))
    out = np.maximum(out, out.T)
    np.fill_diagonal(out, 0.0)
    return out


def _cluster(dist: np.ndarray, gap: float) -> list[int]:
    tree = linkage(squareform(dist, checks=False), method="average")
    return [int(x) for x in fcluster(tree, t=1.0 + gap, criterion="distance")]


def _separated(dist: np.ndarray, labels: list[int]) -> bool:
    """Whether ``labels`` splits ``dist`` cleanly: more than one cluster, and the 10th
    percentile of distances between clusters above the 90th percentile within them (racks
    are a structure of the whole matrix, not of a few outlying pairs)."""
    lab = np.asarray(labels)
    if len(set(labels)) < 2:
        return False
    same = np.equal.outer(lab, lab)
    off = ~np.eye(len(lab), dtype=bool)
    within, between = dist[same & off], dist[~same]
    if within.size == 0:
        return True  # every rank alone, each one apart from all others
    return float(np.percentile(between, 10)) > float(np.percentile(within, 90))


def _nic_estimates(bw: np.ndarray, hosts: Sequence[str] | None, queued: Sequence[int] = (),
                   racks: Sequence[int] | None = None) -> dict[int, tuple[float, float]]:
    """Per rank, its best outgoing and best incoming flow through its NIC: what the NIC
    carried at least, each way. Flows between ranks of one host never touch a NIC (loopback
    measures the CPU) and are left out; a rank with none off its host either way is not judged.

    A ``queued`` rank with two rack-mates or more (``racks``) counts, in its loaded direction
    (``_loaded``), the median of its flows with those mates that are not queued themselves,
    not its best flow: a rack-mate's flow crosses only the two NICs, so where another job's
    flows hold this one, most of those flows are slow, and the best ran in a lull of theirs.
    (With one rack-mate, that mate may be the queued one: a rank of a rack of two whose mate's
    NIC and uplink both hold another job's queue waits on every ping too, with a clear NIC.)
    A queued mate does not speak for this rank's NIC: its own NIC holds the flow back. On a
    3,2,4 layout with another job's streams on rank 1's NIC, rank 2's pings waited too (a
    busy host), and the median of its flows with ranks 0 and 1, 0.95 and 0.15 Gbit/s, came
    to 0.54 and flagged its clear NIC."""
    through_nic = bw.copy()
    np.fill_diagonal(through_nic, 0.0)
    if hosts is not None:
        same_host = np.equal.outer(np.asarray(hosts, dtype=object), np.asarray(hosts, dtype=object))
        through_nic[same_host] = 0.0
    best = {i: (float(through_nic[i].max()), float(through_nic[:, i].max()))
            for i in range(bw.shape[0]) if through_nic[i].any() and through_nic[:, i].any()}
    for i in queued if racks is not None else ():
        mates = [j for j in range(len(racks)) if racks[j] == racks[i] and j != i]
        clear_mates = [j for j in mates if j not in queued]
        if i in best and len(mates) >= 2 and clear_mates:
            mates = clear_mates
            out, into = best[i]
            if _loaded(bw, i) == "out":
                best[i] = (min(out, float(np.median(through_nic[i, mates]))), into)
            else:
                best[i] = (out, min(into, float(np.median(through_nic[mates, i]))))
    return best


def nic_suspects(bandwidth_gbps: Any, hosts: Sequence[str] | None = None,
                 slow_ratio: float = DEFAULT_SLOW_RATIO, queued: Sequence[int] = (),
                 racks: Sequence[int] | None = None) -> dict[int, list[str]]:
    """Ranks whose NIC the pairwise flows call slow, and the directions (``"out"``, ``"in"``)
    in which their best flow is below ``slow_ratio`` of the other ranks' median estimate.

    Pairs alone cannot tell a slow NIC from a healthy one whose every peer sits behind a slow
    link of its own (a rack of one beside a slow uplink and a slow NIC): both see only slow
    flows. ``fan_clears`` tells them apart from a fan of flows in those directions.
    """
    best = _nic_estimates(_square("bandwidth_gbps", bandwidth_gbps), hosts, queued, racks)
    worse = {i: min(pair) for i, pair in best.items()}
    if len(worse) <= 2:
        return {}
    out: dict[int, list[str]] = {}
    for i in slow_keys(worse, slow_ratio):
        level = slow_ratio * float(np.median([v for k, v in worse.items() if k != i]))
        out[i] = [d for d, v in zip(("out", "in"), best[i], strict=True) if v < level]
    return out


def fan_clears(bandwidth_gbps: Any, racks: Sequence[int], rank: int, direction: str,
               rates: dict[int, float], ratio: float = FAN_RATIO) -> bool:
    """Whether a fan of ``rank`` (its flows to every peer in ``rates`` at once, or from them
    for ``direction == "in"``, ``{peer: Gbit/s}``) shows that its NIC does not bound its flows.

    What the flows would carry if only their paths bound them: per other rack the best single
    flow to it (its members share an uplink), per rack-mate its own single flow (each is
    bounded by its own NIC). The NIC is clear when the fan carried at least ``ratio`` of that
    sum and there were at least two such bottlenecks (with one, the sum says nothing about the
    NIC). A NIC shared with another job's streams also carries more with more flows (TCP
    shares per flow), so ``dssync probe`` runs a fan only for a rank with a clear ping (no
    standing queue at its NIC).
    """
    bw = _square("bandwidth_gbps", bandwidth_gbps)
    single = bw[rank] if direction == "out" else bw[:, rank]
    alone: dict[Any, float] = {}
    for peer in rates:
        key = ("mate", peer) if racks[peer] == racks[rank] else ("rack", racks[peer])
        alone[key] = max(alone.get(key, 0.0), float(single[peer]))
    return len(alone) >= 2 and float(sum(rates.values())) >= ratio * sum(alone.values())


def slow_keys(values: dict[int, float], ratio: float = DEFAULT_SLOW_RATIO) -> list[int]:
    """Keys whose value is below ``ratio`` times the median of the *other* keys' values."""
    out = []
    for key, value in values.items():
        others = [v for k, v in values.items() if k != key]
        if others and value < ratio * float(np.median(others)):
            out.append(key)
    return out


def classify_contention(
    bandwidth_gbps: Any,
    racks: Sequence[int],
    uplink_gbps_by_rack: Sequence[float] | None = None,
    *,
    hosts: Sequence[str] | None = None,
    slow_ratio: float = DEFAULT_SLOW_RATIO,
    fans: dict[int, dict[str, dict[int, float]]] | None = None,
    queued: Sequence[int] = (),
) -> dict[str, list[dict[str, float]]]:
    """Slow NICs (paper Fig. 6) and slow rack uplinks (Fig. 5), in the topology.json form.

    ``{"uplinks": [{"rack": r, "bandwidth_gbps": x}], "nics": [{"rank": i, "bandwidth_gbps": y}]}``;
    both lists are empty when nothing stands out.

    NIC of rank ``i``: its capacity estimate is its *best* flow in its *worse* direction,
    ``min(max_j bw[i, j], max_j bw[j, i])``. A healthy rank has at least one fast flow (a
    rack-mate, or any peer whose path is clear), so a rank whose every flow, rack-mates
    included, is slow has a contended NIC; a slow peer or a slow uplink does not lower the
    best flow. Slow means below ``slow_ratio`` (0.6) times the median of the other ranks'
    estimates: a contending flow of equal weight halves a NIC's share (0.5 < 0.6), while
    measurement noise of a few ten percent stays above it. With ``hosts``, flows between
    ranks of one host are left out (they never leave the machine), and a rank with no flow
    off its host is not judged: local ranks on loopback measure the CPU, not a NIC. At least
    three judged ranks are needed for a median of "the others" to mean anything. ``fans``
    (``{rank: {direction: {peer: Gbit/s}}}``, flows at once in each direction in which the
    rank looked slow, see ``nic_suspects``) clear a rank whose every peer sat behind a slow
    link of its own: its fans carried what those links allow (``fan_clears``). A ``queued``
    rank (``queued_ranks``: even its fastest ping waits) with two rack-mates or more is
    judged in its loaded direction by its median flow with them (``_nic_estimates``).

    Uplink of rack ``r``, judged on its *egress*: for each other rack ``s``, the median
    pairwise flow from ``r`` to ``s`` (flows touching a slow NIC left out), then the best
    over destinations, since one clear destination means ``r``'s own uplink is clear while
    a slow destination's ingress slows only its own column. Slow by the same 0.6 rule,
    against the median of the other racks (with two racks, the other rack). Egress, because
    a cross-rack flow leaves through its rack's uplink and enters through another's, and
    traffic of other tasks leaving a rack is what a probe can pin on one uplink; with two
    racks, an uplink slowed equally both ways slows both racks' figures alike and is not
    told apart. Pairwise egress below ``slow_ratio`` of the others' is slow on its own. The
    concurrent aggregates alone are not trusted: a rack that sends slowly all at once while
    its pairwise flows run at its NICs' rate is held back by its own NICs or the CPU, not by
    its uplink. A rack of one's pairwise egress is one flow; a fan out of its member (see
    ``fans``) is what its uplink carried at once and counts when larger. The figure reported
    for a slow uplink is ``uplink_gbps_by_rack[r]`` when given (what the rack gets when all of
    it sends across at once, as ``dssync probe`` measures; NaN for a rack that had no blast),
    else the pairwise figure. The
    aggregate also decides when the rack's pairwise egress is held back, below ``slow_ratio``
    of its own members' NIC estimates (the rack's NICs carry more than its cross-rack flows
    got): then the rack is slow when its aggregate is below ``slow_ratio`` of the others'.
    With two racks the other rack's pairwise egress is the contended uplink's *ingress*, and
    a single flow in it is held back too, by its ACKs queueing behind the background traffic
    and its window growing over the longer round trip: on the emulated ``inter-rack``
    scenario, pairwise egress measured 0.11 against the other rack's 0.18 Gbit/s (ratios
    0.5 to 0.8 run to run), both far below the NICs' 0.95, while the aggregates, four flows
    at once, read 0.11 to 0.33 against 0.56 to 0.90. Without contention pairwise flows can be
    held back as well (on ``static`` the cross-rack pairs of a round share the uplink and got
    0.2 to 0.5 Gbit/s); there the aggregates agree (0.91 and 0.92) and nothing is flagged. With
    ``hosts``, a rack that shares a host with another rack is not judged (its cross-rack
    flows need not leave the machine).
    """
    if not 0 < slow_ratio < 1:
        raise ValueError(f"slow_ratio must lie in (0, 1), got {slow_ratio}; 0.6 is the default")
    bw = _square("bandwidth_gbps", bandwidth_gbps)
    n = bw.shape[0]
    if len(racks) != n:
        raise ValueError(f"racks names {len(racks)} ranks but bandwidth_gbps has {n}; give one rack per rank")
    if hosts is not None and len(hosts) != n:
        raise ValueError(f"hosts names {len(hosts)} ranks but bandwidth_gbps has {n}; give one host per rank")
    rack_ids = sorted(set(racks))
    if uplink_gbps_by_rack is not None and len(uplink_gbps_by_rack) != len(rack_ids):
        raise ValueError(
            f"uplink_gbps_by_rack has {len(uplink_gbps_by_rack)} entries for {len(rack_ids)} racks; "
            "give one aggregate per rack"
        )
    off = bw.copy()
    np.fill_diagonal(off, 0.0)
    best = _nic_estimates(bw, hosts, queued, racks)
    nic_gbps = {i: min(pair) for i, pair in best.items()}
    slow_nics = slow_keys(nic_gbps, slow_ratio) if len(nic_gbps) > 2 else []
    if fans:  # a fan in every slow direction carried what the paths allow: not the NIC
        slow_nics = [i for i in slow_nics
                     if not (i in fans and fans[i] and all(fan_clears(bw, racks, i, d, rates)
                                                           for d, rates in fans[i].items()))]

    members = {r: [i for i in range(n) if racks[i] == r] for r in rack_ids}
    clear = [i for i in range(n) if i not in slow_nics]
    uplink: dict[int, float] = {}
    for r in rack_ids:
        best = []
        for s in rack_ids:
            flows = [off[i, j] for i in members[r] for j in members[s]
                     if s != r and i in clear and j in clear]
            if flows:
                best.append(float(np.median(flows)))
        if best:
            uplink[r] = max(best)
    for i, directions in (fans or {}).items():
        # a rack of one's uplink carries exactly its member's flows: a fan out of a clear
        # member is what the uplink carried at once, more than any single flow shows
        if i not in slow_nics and "out" in directions and len(members[racks[i]]) == 1:
            uplink[racks[i]] = max(uplink.get(racks[i], 0.0), float(sum(directions["out"].values())))
    if hosts is not None:
        # A rack sharing a host with another rack has no uplink between them to judge.
        host_racks: dict[str, set[int]] = {}
        for host, rack in zip(hosts, racks, strict=True):
            host_racks.setdefault(host, set()).add(rack)
        shared = set().union(*(rs for rs in host_racks.values() if len(rs) > 1))
        uplink = {r: v for r, v in uplink.items() if r not in shared}
    slow_uplinks = slow_keys(uplink, slow_ratio) if len(uplink) > 1 else []
    if uplink_gbps_by_rack is not None and len(uplink) > 1:
        # The aggregate decides when the rack's pairwise egress is itself held back: below
        # slow_ratio of what the rack's own NICs carry (so neither its NICs nor the CPU are
        # what slows the rack when it sends all at once).
        nic_level = {r: float(np.median([nic_gbps[i] for i in members[r] if i in clear and i in nic_gbps]
                                        or [np.nan])) for r in uplink}
        held_back = {r for r in uplink if uplink[r] < slow_ratio * nic_level[r]}
        aggregate = {r: float(uplink_gbps_by_rack[r]) for r in uplink if np.isfinite(uplink_gbps_by_rack[r])}
        slow_uplinks = sorted(set(slow_uplinks) | (held_back & set(slow_keys(aggregate, slow_ratio))))
    # a rack whose blast had no flows (NaN) reports its pairwise figure
    report = dict(uplink)
    if uplink_gbps_by_rack is not None:
        report.update({r: float(uplink_gbps_by_rack[r]) for r in rack_ids if np.isfinite(uplink_gbps_by_rack[r])})
    return {
        "uplinks": [{"rack": r, "bandwidth_gbps": round(report[r], 4)} for r in slow_uplinks],
        "nics": [{"rank": i, "bandwidth_gbps": round(nic_gbps[i], 4)} for i in slow_nics],
    }
